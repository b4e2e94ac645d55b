"""The systems sosim knows: one line each. A system module provides its knobs model (with a ``system``
literal), ``build_plan(scenario, costs) -> Plan`` and ``memory_usage(scenario) -> MemoryUsage``, and
optionally ``choices(scenario) -> dict[str, str]`` (what it decided, for the result's provenance)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, Union

from pydantic import Field, TypeAdapter

from sosim.schedules import (
    gpu_only,
    superoffload,
    zero3,
    zero3_offload,
    zero_infinity,
    zero_infinity_nvme,
    zero_offload,
)

if TYPE_CHECKING:
    from sosim.config import Scenario, ScheduleKnobs
    from sosim.costs import CostModel
    from sosim.memory import MemoryUsage
    from sosim.plan import Plan


class System(NamedTuple):
    knobs: type[ScheduleKnobs]
    build_plan: Callable[[Scenario, CostModel], Plan]
    memory_usage: Callable[[Scenario], MemoryUsage]
    choices: Callable[[Scenario], dict[str, str]]


def _no_choices(sc: Scenario) -> dict[str, str]:
    del sc
    return {}


def _system(module: ModuleType, knobs: type[ScheduleKnobs]) -> System:
    return System(knobs, module.build_plan, module.memory_usage, getattr(module, "choices", _no_choices))


SYSTEMS: MappingProxyType[str, System] = MappingProxyType({
    "gpu_only": _system(gpu_only, gpu_only.GpuOnlyKnobs),
    "zero_offload": _system(zero_offload, zero_offload.ZeroOffloadKnobs),
    "zero3_offload": _system(zero3_offload, zero3_offload.Zero3OffloadKnobs),
    "zero_infinity": _system(zero_infinity, zero_infinity.ZeroInfinityKnobs),
    "superoffload": _system(superoffload, superoffload.SuperOffloadKnobs),
    "zero_infinity_nvme": _system(zero_infinity_nvme, zero_infinity_nvme.ZeroInfinityNvmeKnobs),
    "zero3": _system(zero3, zero3.Zero3Knobs),
})
SYSTEM_NAMES: tuple[str, ...] = tuple(SYSTEMS)


@cache
def _adapter() -> TypeAdapter[Any]:
    union = Union[tuple(s.knobs for s in SYSTEMS.values())]  # type: ignore[valid-type]  # noqa: UP007 (runtime-built)
    # A union built at run time is no static type form: mypy 1.x and 2.x disagree on how to say so, hence Any.
    form: Any = Annotated[union, Field(discriminator="system")]
    return TypeAdapter(form)


def validate_knobs(value: object) -> ScheduleKnobs:
    """The knobs model of the system ``value`` names (errors carry the key path, as pydantic's do)."""
    from sosim.config import ScheduleKnobs

    if isinstance(value, ScheduleKnobs) and type(value) is not ScheduleKnobs:
        return value
    knobs: ScheduleKnobs = _adapter().validate_python(value)
    return knobs
