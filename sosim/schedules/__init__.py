"""Schedule families. Each module turns a Scenario into a Plan (``build_plan``) and reports what it keeps
resident (``memory_usage``). Adding a system = adding a module here and its config model."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

from sosim.config import Scenario
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import Plan
from sosim.schedules import gpu_only, zero_offload


class ScheduleModule(NamedTuple):
    build_plan: Callable[[Scenario, CostModel], Plan]
    memory_usage: Callable[[Scenario], MemoryUsage]


SCHEDULES: MappingProxyType[str, ScheduleModule] = MappingProxyType(
    {
        "gpu_only": ScheduleModule(gpu_only.build_plan, gpu_only.memory_usage),
        "zero_offload": ScheduleModule(zero_offload.build_plan, zero_offload.memory_usage),
    }
)
