"""Schedule families. Each module turns a Scenario into a Plan (``build_plan``) and reports what it keeps
resident (``memory_usage``); the ZeRO-3 family's modules only map their config to a
:class:`~sosim.schedules.stage3.Stage3Strategy` for the shared builder. Adding a system = adding a module
here and its config model."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import MappingProxyType
from typing import NamedTuple

from sosim.config import Scenario
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import Plan
from sosim.schedules import gpu_only, stage3, superoffload, zero3_offload, zero_infinity, zero_offload


def _no_choices(sc: Scenario) -> dict[str, str]:
    del sc
    return {}


class ScheduleModule(NamedTuple):
    build_plan: Callable[[Scenario, CostModel], Plan]
    memory_usage: Callable[[Scenario], MemoryUsage]
    # Choices the system made for this scenario, for the result's provenance (text for humans).
    choices: Callable[[Scenario], dict[str, str]] = _no_choices


StrategyFn = Callable[[Scenario], stage3.Stage3Strategy]


def _stage3_build(strategy: StrategyFn, sc: Scenario, costs: CostModel) -> Plan:
    return stage3.build_plan(sc, costs, strategy(sc))


def _stage3_memory(strategy: StrategyFn, sc: Scenario) -> MemoryUsage:
    return stage3.memory_usage(sc, strategy(sc))


def _stage3_choices(strategy: StrategyFn, sc: Scenario) -> dict[str, str]:
    return dict(strategy(sc).notes)


def _stage3_module(strategy: StrategyFn) -> ScheduleModule:
    return ScheduleModule(partial(_stage3_build, strategy), partial(_stage3_memory, strategy),
                          partial(_stage3_choices, strategy))


SCHEDULES: MappingProxyType[str, ScheduleModule] = MappingProxyType(
    {
        "gpu_only": ScheduleModule(gpu_only.build_plan, gpu_only.memory_usage),
        "zero_offload": ScheduleModule(zero_offload.build_plan, zero_offload.memory_usage),
        "zero3_offload": _stage3_module(zero3_offload.strategy),
        "zero_infinity": _stage3_module(zero_infinity.strategy),
        "superoffload": _stage3_module(superoffload.strategy),
    }
)
