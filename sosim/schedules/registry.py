"""The systems sosim knows: one line each.

A system is everything sosim knows about it, carried in its :class:`System` entry: its knobs model (with a
``system`` literal), ``build_plan(scenario, costs, machine) -> Plan``, ``memory_usage(scenario) -> MemoryUsage``,
optionally ``choices(scenario, machine) -> dict[str, str]`` (what it decided, for the result's provenance) and
``PRESETS`` (implementation -> recipe), its DeepSpeed form (``DEEPSPEED``: how it reads from and writes to a
DeepSpeed config, sosim/schedules/system_api.py; None for a system DeepSpeed cannot run) and its tuning space
(``TUNE_SPACE``: the knobs ``sosim tune`` moves). sosim.formats.dsconfig and sosim.answers.tune.space ask this
registry; they name no system.

The shipped systems keep their DeepSpeed form and tuning space in a sibling module ``<system>_ds.py`` (the
plan modules are long enough); a new system may keep all of it in one module (docs/systems.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, Union

from pydantic import Field, TypeAdapter

from sosim.schedules import (
    fsdp2_offload,
    gpu_only,
    gpu_only_ds,
    megatron_offload,
    superoffload,
    superoffload_ds,
    zero3,
    zero3_ds,
    zero3_offload,
    zero3_offload_ds,
    zero_infinity,
    zero_infinity_ds,
    zero_infinity_nvme,
    zero_infinity_nvme_ds,
    zero_offload,
    zero_offload_ds,
)

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.engine.plan import Plan
    from sosim.hardware.machine import Machine
    from sosim.hardware.memory import MemoryUsage
    from sosim.inputs.config import Scenario, ScheduleKnobs
    from sosim.schedules.blocks.tuning import Knob
    from sosim.schedules.system_api import DeepSpeedForm


class System(NamedTuple):
    knobs: type[ScheduleKnobs]
    # The Machine (sosim/hardware/machine.py) is resolved once per simulation by the caller and handed in: a
    # system reads its threads per rank, nodes and volumes there and never rebuilds it from the scenario.
    build_plan: Callable[[Scenario, Costs, Machine], Plan]
    memory_usage: Callable[[Scenario], MemoryUsage]
    choices: Callable[[Scenario, Machine], dict[str, str]]
    deepspeed: DeepSpeedForm | None = None
    tune_space: tuple[Knob, ...] = ()
    # Implementation -> recipe builder (``PRESETS``); empty for a system with one plan (gpu_only, zero3).
    presets: Mapping[str, Callable[..., Any]] = MappingProxyType({})


def _no_choices(sc: Scenario, machine: Machine) -> dict[str, str]:
    del sc, machine
    return {}


def system_of(module: ModuleType, knobs: type[ScheduleKnobs], outward: ModuleType | None = None) -> System:
    """The registry entry of a system module (``outward``: the module holding DEEPSPEED and TUNE_SPACE, when
    not ``module`` itself)."""
    faces = outward if outward is not None else module
    return System(knobs, module.build_plan, module.memory_usage, getattr(module, "choices", _no_choices),
                  getattr(faces, "DEEPSPEED", None), tuple(getattr(faces, "TUNE_SPACE", ())),
                  MappingProxyType(dict(getattr(module, "PRESETS", {}))))


# The registration order is the order systems are searched and listed in.
_REGISTERED: dict[str, System] = {
    "gpu_only": system_of(gpu_only, gpu_only.GpuOnlyKnobs, gpu_only_ds),
    "zero_offload": system_of(zero_offload, zero_offload.ZeroOffloadKnobs, zero_offload_ds),
    "zero3_offload": system_of(zero3_offload, zero3_offload.Zero3OffloadKnobs, zero3_offload_ds),
    "zero_infinity": system_of(zero_infinity, zero_infinity.ZeroInfinityKnobs, zero_infinity_ds),
    "superoffload": system_of(superoffload, superoffload.SuperOffloadKnobs, superoffload_ds),
    "zero_infinity_nvme": system_of(zero_infinity_nvme, zero_infinity_nvme.ZeroInfinityNvmeKnobs,
                                    zero_infinity_nvme_ds),
    "zero3": system_of(zero3, zero3.Zero3Knobs, zero3_ds),
    "fsdp2_offload": system_of(fsdp2_offload, fsdp2_offload.Fsdp2OffloadKnobs),
    "megatron_offload": system_of(megatron_offload, megatron_offload.MegatronOffloadKnobs),
}
# A read-only view (tests add a toy system to the dict underneath, with monkeypatch.setitem).
SYSTEMS: MappingProxyType[str, System] = MappingProxyType(_REGISTERED)
SYSTEM_NAMES: tuple[str, ...] = tuple(SYSTEMS)


@cache
def _adapter(knobs: tuple[type[ScheduleKnobs], ...]) -> TypeAdapter[Any]:
    union = Union[knobs]  # type: ignore[valid-type]  # noqa: UP007 (runtime-built)
    # A union built at run time is no static type form: mypy 1.x and 2.x disagree on how to say so, hence Any.
    form: Any = Annotated[union, Field(discriminator="system")]
    return TypeAdapter(form)


def validate_knobs(value: object) -> ScheduleKnobs:
    """The knobs model of the system ``value`` names (errors carry the key path, as pydantic's do)."""
    from sosim.inputs.config import ScheduleKnobs

    if isinstance(value, ScheduleKnobs) and type(value) is not ScheduleKnobs:
        return value
    knobs: ScheduleKnobs = _adapter(tuple(s.knobs for s in SYSTEMS.values())).validate_python(value)
    return knobs
