"""Systems, each assembled from shared blocks (see driver.py and docs/scenarios.md "Adding a system").

``registry.SYSTEMS`` maps a system name to its knobs model, plan builder, memory footprint and choices. This file
imports nothing, so that loading one block (or DeepSpeed's key data, ds_schema.py) does not load every system.
"""
