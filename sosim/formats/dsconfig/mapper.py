"""The DeepSpeed config reader's state: the run's other inputs, and a mapper that notes every key it reads.

:class:`_Mapper` meets sosim.schedules.system_api.DsReader: the systems' DeepSpeed forms read through it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from sosim.formats.jsonio import Note
from sosim.run.loader import KeyPath, Located, parse_override
from sosim.schedules.blocks.ds_schema import MISSING


@dataclass(frozen=True)
class RunInputs:
    """Everything besides the two files that a DeepSpeed config alone cannot say (flags of ``sosim run``).

    ``None`` means not given: the value comes from the config, from DeepSpeed's or the HF Trainer's
    defaults, or from a stated sosim default, and the report says which.
    """

    hardware: str
    gpus: int | None = None
    seq_len: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    precision: str | None = None  # bf16 | fp16
    activation_checkpointing: bool | None = None
    # The DeepSpeed release that runs the config (--ds-version; None: the newest modelled,
    # sosim/inputs/ds_versions.py): it decides the defaults that changed between releases.
    deepspeed_version: str | None = None
    overrides: tuple[str, ...] = ()  # --set texts: the report says which mapped values they replace



def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Mapper:
    """Reads one DeepSpeed config; every read key leaves a note; problems are collected, then raised at once."""

    def __init__(self, loc: Located, inputs: RunInputs) -> None:
        self.loc = loc
        self.inputs = inputs
        self.notes: list[Note] = []
        self.problems: list[str] = []
        self.handled: set[KeyPath] = set()
        self.override_paths = {_dotted(parse_override(o)[0]): o for o in inputs.overrides}
        self.dp = 1  # data-parallel ranks, known once the batch keys are read

    # ---- access --------------------------------------------------------------------------------------
    def get(self, path: KeyPath) -> Any:
        node: Any = self.loc.data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return MISSING
            node = node[key]
        return node

    def where(self, path: KeyPath) -> str:
        return self.loc.where(path)

    def error(self, path: KeyPath, message: str) -> None:
        self.handled.add(path)
        self.problems.append(f"{self.where(path)}: {_dotted(path) or '(top level)'}: {message}")

    def _after_set(self, to: str, reason: str) -> str:
        text = self.override_paths.get(to)
        if text is None:
            return reason
        return f"{reason}; then replaced by --set {text}" if reason else f"replaced by --set {text}"

    def mapped(self, path: KeyPath, to: str, as_value: Any, reason: str = "") -> None:
        self.handled.add(path)
        self.notes.append(Note("mapped", _dotted(path), self.where(path), self.get(path), to, as_value,
                               self._after_set(to, reason)))

    def defaulted(self, path: KeyPath, to: str, as_value: Any, reason: str) -> None:
        self.handled.add(path)
        self.notes.append(Note("defaulted", _dotted(path), self.loc.origin, None, to, as_value,
                               self._after_set(to, reason)))

    def flag(self, flag: str, to: str, as_value: Any, reason: str, status: str = "mapped") -> None:
        note_status: Any = status
        self.notes.append(Note(note_status, flag, "command line", as_value if status == "mapped" else None, to,
                               as_value, self._after_set(to, reason)))

    def ignored(self, path: KeyPath, reason: str, affects_step: bool = False) -> None:
        self.handled.add(path)
        self.notes.append(Note("ignored", _dotted(path), self.where(path), self.get(path), reason=reason,
                               affects_step=affects_step))

    def note(self, status: str, key: str, to: str, as_value: Any, reason: str, *, path: KeyPath | None = None,
             value: Any = None) -> None:
        """A note that marks nothing handled: a value derived from other keys (where: ``path``, else the file)."""
        kind: Any = status
        where = self.where(path) if path is not None else self.loc.origin
        self.notes.append(Note(kind, key, where, value, to, as_value, reason))

    @staticmethod
    def missing(value: Any) -> bool:
        return value is MISSING

    # ---- typed reads: DeepSpeed's pydantic rules (lax: 1e8 for an int is fine, a fraction is not) -------
    def number(self, path: KeyPath, *, integer: bool, lo: float | None = None, lo_open: bool = False,
               hi: float | None = None) -> float | int | None:
        """The value at ``path``; None (and an error) when it is not a number in range."""
        value = self.get(path)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                self.error(path, f"expected a number, got {json.dumps(self.get(path))}")
                return None
        if not _is_number(value) or not math.isfinite(value):
            self.error(path, f"expected a number, got {json.dumps(self.get(path))}")
            return None
        if integer:
            if float(value) != int(value):
                self.error(path, f"expected a whole number, got {value}")
                return None
            value = int(value)
        if lo is not None and (value < lo or (lo_open and value == lo)):
            self.error(path, f"must be {'>' if lo_open else '>='} {lo:g}, got {value}")
            return None
        if hi is not None and value > hi:
            self.error(path, f"must be <= {hi:g}, got {value}")
            return None
        return value

    def boolean(self, path: KeyPath) -> bool | None:
        value = self.get(path)
        if isinstance(value, bool):
            return value
        if value in (0, 1) and not isinstance(value, float):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.error(path, f"expected true or false, got {json.dumps(value)}")
        return None

    def is_auto(self, path: KeyPath) -> bool:
        return self.get(path) == "auto"


def _enabled(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value.get("enabled", False))
    return bool(value)


@dataclass
class _Decided:
    """Values decided while reading, before the scenario dict is assembled."""

    training: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)
