"""Systems, one module each (a system's recipe and knobs, ``<system>.py``; its DeepSpeed form, ``<system>_ds.py``),
assembled from the shared building blocks in :mod:`sosim.schedules.blocks` (see blocks/driver.py and
docs/scenarios.md "Adding a system").

``registry.SYSTEMS`` maps a system name to its knobs model, plan builder, memory footprint and choices. This file
imports nothing, so that loading one block (or DeepSpeed's key data, blocks/ds_schema.py) does not load every system.
"""
