"""The contract between a system and the DeepSpeed config reader / writer (sosim.formats.dsconfig).

A system says, through a :class:`DeepSpeedForm` in its registry entry (sosim/schedules/registry.py):

* ``claims(view)``: whether a DeepSpeed config's ZeRO section (stage, offload devices, ``super_offload``,
  already parsed into a :class:`ZeroView`) runs this system, and why (None: not this system). Exactly one
  system claims any config that sosim models; the reader refuses a config two systems claim.
* ``read(m, view, sched)``: the system's own knobs from the config into ``sched`` (the scenario's
  ``schedule`` dict), every key it uses reported through ``m`` (a :class:`DsReader`).
* ``emit(sc, base, out)``: the DeepSpeed keys the system decides for scenario ``sc`` into ``out`` (an
  :class:`Emitted`: key path -> value or :data:`DELETE`, and what the config cannot express).

This module imports nothing from sosim.formats.dsconfig or sosim.run.loader: they sit above the systems (the package
layers, tests/test_import_cycles.py); the reader's type is a Protocol that ``dsconfig.mapper._Mapper`` meets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sosim.schedules.blocks.ds_schema import MISSING

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario

KeyPath = tuple[str | int, ...]  # as sosim.run.loader.KeyPath (list indices are ints)
ZERO: KeyPath = ("zero_optimization",)
OPT: KeyPath = (*ZERO, "offload_optimizer")
PARAM: KeyPath = (*ZERO, "offload_param")


class _Delete:
    """Marks a DeepSpeed key the emitter removes from the base config (the scenario contradicts it)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE: Any = _Delete()


class DsReader(Protocol):
    """What a system's ``read`` may call on the DeepSpeed config reader (sosim.formats.dsconfig.mapper._Mapper)."""

    handled: set[KeyPath]
    dp: int

    def get(self, path: KeyPath) -> Any: ...
    def where(self, path: KeyPath) -> str: ...
    def error(self, path: KeyPath, message: str) -> None: ...
    def mapped(self, path: KeyPath, to: str, as_value: Any, reason: str = "") -> None: ...
    def defaulted(self, path: KeyPath, to: str, as_value: Any, reason: str) -> None: ...
    def ignored(self, path: KeyPath, reason: str, affects_step: bool = False) -> None: ...
    def note(self, status: str, key: str, to: str, as_value: Any, reason: str, *, path: KeyPath | None = None,
             value: Any = None) -> None: ...
    def number(self, path: KeyPath, *, integer: bool, lo: float | None = None, lo_open: bool = False,
               hi: float | None = None) -> float | int | None: ...
    def boolean(self, path: KeyPath) -> bool | None: ...
    def is_auto(self, path: KeyPath) -> bool: ...
    def missing(self, value: Any) -> bool: ...


@dataclass(frozen=True)
class ZeroView:
    """The ZeRO section of a DeepSpeed config as the reader parsed it, before a system is chosen."""

    zero: Mapping[str, Any]  # zero_optimization ({} when absent)
    stage: int
    opt_dev: str  # offload_optimizer.device: none | cpu | nvme
    opt: Mapping[str, Any]  # the offload_optimizer section ({} when absent)
    param_dev: str
    param: Mapping[str, Any]
    is_super: bool  # offload_optimizer.super_offload
    dp: int  # data-parallel ranks
    model: Mapping[str, Any]  # the scenario's model section
    # offload_*.pin_memory when a config leaves it out: False before PR 8207 (0.19.5), True from it
    # (sosim/schedules/blocks/ds_version.py default_pin_memory).
    default_pin: bool = True

    def key(self, *names: str) -> tuple[KeyPath, Any]:
        """The first of ``names`` present in the ZeRO section (aliases), and its value (MISSING: absent)."""
        for name in names:
            if name in self.zero:
                return (*ZERO, name), self.zero[name]
        return (*ZERO, names[0]), MISSING


@dataclass(frozen=True)
class Unsaid:
    """A setting of the scenario that a DeepSpeed config cannot express: its ``key`` (a scenario key path, or a
    DeepSpeed one) and why, or what the run needs instead (``reason``). Printed as ``key: reason``."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


@dataclass
class Emitted:
    """What an emitter decides: DeepSpeed key path -> value (or DELETE), and what it cannot express."""

    settings: dict[KeyPath, Any] = field(default_factory=dict)
    notes: list[Unsaid] = field(default_factory=list)

    def __setitem__(self, path: KeyPath, value: Any) -> None:
        self.settings[path] = value

    def note(self, key: str, reason: str) -> None:
        """``key`` cannot be said in the config: ``reason``."""
        self.notes.append(Unsaid(key, reason))


@dataclass(frozen=True)
class DeepSpeedForm:
    """How one system reads from and writes to a DeepSpeed config (see the module docstring)."""

    claims: Callable[[ZeroView], str | None]
    read: Callable[[DsReader, ZeroView, dict[str, Any]], None]
    emit: Callable[[Scenario, Mapping[str, Any], Emitted], None]
    # max_live_parameters is checked against the system's working set (systems that gather per layer).
    checks_max_live: bool = False
