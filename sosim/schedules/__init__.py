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
from sosim.schedules import gpu_only, superoffload, zero3_offload, zero_infinity, zero_offload


class ScheduleModule(NamedTuple):
    build_plan: Callable[[Scenario, CostModel], Plan]
    memory_usage: Callable[[Scenario], MemoryUsage]


SCHEDULES: MappingProxyType[str, ScheduleModule] = MappingProxyType(
    {
        "gpu_only": ScheduleModule(gpu_only.build_plan, gpu_only.memory_usage),
        "zero_offload": ScheduleModule(zero_offload.build_plan, zero_offload.memory_usage),
        "zero3_offload": ScheduleModule(zero3_offload.build_plan, zero3_offload.memory_usage),
        "zero_infinity": ScheduleModule(zero_infinity.build_plan, zero_infinity.memory_usage),
        "superoffload": ScheduleModule(superoffload.build_plan, superoffload.memory_usage),
    }
)
