"""What defines one simulation of a tuner candidate: an explicit key of its resolved inputs, and the table of
results by that key.

``simulate`` is a pure function of its scenario (no global state, sosim/run/simulate.py). Two candidates whose
scenarios are equal field for field therefore get the same metrics, bit for bit. The key is that scenario, as
data: every section's ``model_dump`` (defaults resolved: an unset knob and a knob set to its default give the
same key), each value with its type (``1``, ``1.0`` and ``True`` differ; floats by their exact bits, so
``0.0`` and ``-0.0`` differ), and each section's class.

One input is replaced by what it resolves to: ``cluster.bind_cores_to_rank`` is a launcher flag whose only
reader is :meth:`sosim.hardware.machine.Machine.from_scenario` (it sets the CPU threads of each rank); the key holds
the resolved :class:`~sosim.hardware.machine.Machine` instead (its ranks per node, threads per rank, sockets...). On a
node with one GPU the flag changes nothing there, so the two values are one simulation; the test
``test_launcher_flag_is_read_only_by_the_machine`` (tests/test_tune_key.py) fails if another module starts
reading the flag.

The hardware profile and the model are not dumped (the profile is the largest section): the table only
serves candidates that hold the base scenario's own hardware and model objects (:meth:`Reuse.eligible`),
which is how the tuner derives every candidate (``sosim.run.loader.load_derived``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import fields
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from sosim.hardware.machine import Machine
from sosim.inputs.config import Scenario

# Sections every candidate shares with the base by identity (see Reuse.eligible): not in the key.
SHARED = ("hardware", "model")
# Inputs the key replaces by the Machine they resolve to (the module docstring says why).
RESOLVED_BY_MACHINE = {"cluster": frozenset({"bind_cores_to_rank"})}

Key = tuple[Hashable, ...]
V = TypeVar("V")


def freeze(value: Any) -> Hashable:
    """A hashable, type-tagged copy of a dumped value (floats by their exact bits)."""
    t = type(value)
    if t is float:
        return ("float", value.hex())
    if t in (bool, int, str, type(None)):
        return (t.__name__, value)
    if t is dict:
        return ("dict", tuple((k, freeze(v)) for k, v in value.items()))
    if t in (list, tuple):
        return (t.__name__, tuple(freeze(v) for v in value))
    return ("repr", t.__qualname__, repr(value))


def _section(name: str, value: Any) -> Hashable:
    if not isinstance(value, BaseModel):
        return (name, freeze(value))
    dumped = value.model_dump(mode="python")
    for field_name in RESOLVED_BY_MACHINE.get(name, ()):
        dumped.pop(field_name, None)
    return (name, type(value).__qualname__, freeze(dumped))


def machine_key(sc: Scenario) -> Hashable:
    """The resolved machine of ``sc`` without its profile (the profile is shared by identity)."""
    machine = Machine.from_scenario(sc)
    return tuple((f.name, freeze(getattr(machine, f.name))) for f in fields(machine) if f.name != "profile")


def simulation_key(sc: Scenario) -> Key:
    """The key of ``sc``'s simulation (see the module docstring)."""
    sections = tuple(_section(name, getattr(sc, name)) for name in type(sc).model_fields if name not in SHARED)
    return (type(sc).__qualname__, sections, machine_key(sc))


class Reuse(Generic[V]):
    """Results of earlier evaluations by :func:`simulation_key`, for candidates derived from ``base``.

    A section object seen before (the tuner hands identical section data the same validated object) is
    dumped once: its frozen dump is kept with the object, so the id cannot be reused while it is cached."""

    def __init__(self, base: Scenario) -> None:
        self.base = base
        self.table: dict[Key, V] = {}
        self.hits = 0
        self._dumps: dict[int, tuple[Any, Hashable]] = {}
        self._machines: dict[int, tuple[Any, Hashable]] = {}  # by cluster object (the machine reads hardware,
        # which every eligible candidate shares, and cluster)

    def eligible(self, sc: Scenario) -> bool:
        """Whether ``sc`` holds the base's hardware and model objects (what the key leaves out)."""
        return type(sc) is type(self.base) and all(getattr(sc, n) is getattr(self.base, n) for n in SHARED)

    def key(self, sc: Scenario) -> Key:
        """:func:`simulation_key` of ``sc``, each section object dumped once."""
        sections = []
        for name in type(sc).model_fields:
            if name in SHARED:
                continue
            value = getattr(sc, name)
            if not isinstance(value, BaseModel):
                sections.append(_section(name, value))
                continue
            seen = self._dumps.get(id(value))
            if seen is None or seen[0] is not value:
                seen = self._dumps[id(value)] = (value, _section(name, value))
            sections.append(seen[1])
        machine = self._machines.get(id(sc.cluster))
        if machine is None or machine[0] is not sc.cluster:
            machine = self._machines[id(sc.cluster)] = (sc.cluster, machine_key(sc))
        return (type(sc).__qualname__, tuple(sections), machine[1])

    def get(self, key: Key) -> V | None:
        hit = self.table.get(key)
        if hit is not None:
            self.hits += 1
        return hit

    def put(self, key: Key, value: V) -> None:
        self.table.setdefault(key, value)


__all__ = ["RESOLVED_BY_MACHINE", "SHARED", "Key", "Reuse", "freeze", "machine_key", "simulation_key"]
