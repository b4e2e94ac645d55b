"""Systems, each assembled from shared blocks (see driver.py and docs/scenarios.md "Adding a system").

``SCHEDULES`` (= ``registry.SYSTEMS``) maps a system name to its knobs model, plan builder, memory
footprint and choices.
"""

from __future__ import annotations

from sosim.schedules.registry import SYSTEM_NAMES, SYSTEMS, System

SCHEDULES = SYSTEMS

__all__ = ["SCHEDULES", "SYSTEMS", "SYSTEM_NAMES", "System"]
