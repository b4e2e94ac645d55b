"""Exact reuse of simulations across tuner candidates: a memo keyed by the scenario fields a simulation read.

Most candidates of a search are the same simulation: a knob the system never reads (``bind_cores_to_rank`` on a
one-GPU-per-host machine), or a knob read only on a path the candidate does not take. ``simulate`` is a pure
function of its scenario (no global state, sosim/simulate.py), so if a candidate agrees with an earlier,
recorded simulation on *every field that simulation read*, it would follow the same path, read the same
values, and produce the same metrics, bit for bit. That is the memo's one rule.

How the reads are recorded: the simulation runs on a copy of the scenario whose ``schedule``, ``training`` and
``cluster`` sections (the only sections tuner candidates change) and the scenario itself are instances of
subclasses that log every attribute read (``__getattribute__``); the values are the same objects. Reads that
can see a whole section at once (``__dict__``, ``model_dump``, pickling, equality, hashing: every name that
pydantic's ``BaseModel`` or ``object`` defines, and every other dunder) are recorded as a read of the whole
section, so the key then holds every field of it. Properties and methods that sosim defines on the sections
(``cluster.dp``) read the fields through the same logging lookup, so their reads are recorded as field reads.

A key holds each field value's type and exact value (floats by ``float.hex``: ``0.0`` and ``-0.0`` differ, ``1``
and ``1.0`` and ``True`` differ) and each section's class. The hardware profile and the model are not in the
key: the memo is only used for candidates that share the base scenario's hardware and model objects
(:meth:`ReadMemo.eligible`), which is how the tuner derives every candidate (``sosim.loader.load_derived``).

``tests/test_tune_memo.py`` checks that a search with the memo returns the same evaluations, ranking and
metrics as the same search simulating every candidate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, cast

from pydantic import BaseModel

from sosim.config import Scenario

SECTIONS = ("schedule", "training", "cluster")
WHOLE = "*"  # a read of a whole section
# Names whose read sees an object as a whole, without going through its fields one by one.
_WHOLE_NAMES = frozenset(dir(BaseModel)) | frozenset(dir(object))

Read = tuple[str, str]  # (section, field name or WHOLE)
ReadSet = tuple[Read, ...]
Shape = tuple[tuple[str, ...], ReadSet]  # the sections' classes and a read set


def _logging_class(cls: type[BaseModel], log: list[str]) -> type[BaseModel]:
    """A subclass of ``cls`` whose instances append every attribute name read to ``log``."""
    get = object.__getattribute__

    def __getattribute__(self: Any, name: str) -> Any:
        log.append(name)
        return get(self, name)

    return type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


class _Recorder:
    """Logging subclasses, made once per class (a process-local cache of types), and their logs."""

    def __init__(self) -> None:
        self.classes: dict[type[BaseModel], tuple[type[BaseModel], list[str]]] = {}

    def wrap(self, obj: BaseModel, **fields: Any) -> tuple[BaseModel, list[str]]:
        cls = type(obj)
        entry = self.classes.get(cls)
        if entry is None:
            log: list[str] = []
            entry = (_logging_class(cls, log), log)
            self.classes[cls] = entry
        sub, log = entry
        log.clear()
        values = {**obj.__dict__, **fields}
        # No validation: the values are the validated instance's own (model_construct copies no field).
        return sub.model_construct(_fields_set=set(obj.model_fields_set), **values), log


# One recorder per thread: a thread-pool executor may record several simulations at once.
_LOCAL = threading.local()


def _recorder() -> _Recorder:
    rec: _Recorder | None = getattr(_LOCAL, "recorder", None)
    if rec is None:
        rec = _LOCAL.recorder = _Recorder()
    return rec


def _read_set(section_logs: dict[str, tuple[type[BaseModel], list[str]]], top_log: list[str]) -> ReadSet:
    reads: set[Read] = set()
    for name in top_log:
        if name in Scenario.model_fields or name == "__class__":
            continue  # a section (its own reads are logged) or a field every eligible candidate shares
        if name in _WHOLE_NAMES or name.startswith("__"):
            reads.update((s, WHOLE) for s in SECTIONS)
    for section, (cls, log) in section_logs.items():
        fields = cls.model_fields
        for name in set(log):
            if name in fields:
                reads.add((section, name))
            elif name == "__class__":
                continue  # the class is always in the key
            elif name in _WHOLE_NAMES or name.startswith("__"):
                reads.add((section, WHOLE))
            # else: a property, method or class constant sosim defines: its body's reads are logged as well
    # A whole-section read covers every field read of that section.
    whole = {s for s, n in reads if n == WHOLE}
    return tuple(sorted(r for r in reads if r[1] == WHOLE or r[0] not in whole))


def simulate_recorded(sc: Scenario, evaluate: Callable[[Scenario], dict[str, Any]] | None = None,
                      ) -> tuple[dict[str, Any], ReadSet]:
    """``simulate(sc).metrics`` (or ``evaluate(sc)``, the same, by another route) and the scenario fields the
    simulation read (see the module docstring).

    One recording at a time per thread (``simulate`` runs to completion and never calls itself)."""
    from sosim.simulate import simulate

    recorder = _recorder()
    sections: dict[str, BaseModel] = {}
    section_logs: dict[str, tuple[type[BaseModel], list[str]]] = {}
    for section in SECTIONS:
        obj = getattr(sc, section)
        wrapped, log = recorder.wrap(obj)
        sections[section] = wrapped
        section_logs[section] = (type(obj), log)
    wrapped_sc, top_log = recorder.wrap(sc, **sections)
    rsc = cast(Scenario, wrapped_sc)
    # The wraps above cleared the logs; reads start here.
    metrics = dict(simulate(rsc).metrics if evaluate is None else evaluate(rsc))
    return metrics, _read_set(section_logs, list(top_log))


_PLAIN = frozenset({bool, int, str, type(None)})


def _freeze(value: Any) -> Hashable:
    t = type(value)
    if t is float:
        return ("float", value.hex())
    if t in (bool, int, str, type(None)):
        return (t.__name__, value)
    return ("repr", t.__qualname__, repr(value))


def classes_of(sc: Scenario) -> tuple[str, ...]:
    return tuple(type(getattr(sc, s)).__qualname__ for s in SECTIONS)


def key_of(sc: Scenario, reads: ReadSet) -> tuple[Hashable, ...]:
    """The values of ``reads`` in ``sc`` (whose sections are of the classes the read set was recorded on)."""
    out: list[Hashable] = []
    for section, name in reads:
        obj = getattr(sc, section)
        if name == WHOLE:
            out.append(tuple((f, _freeze(v)) for f, v in obj.__dict__.items()))
        else:
            out.append(_freeze(getattr(obj, name)))
    return tuple(out)


def keyer(reads: ReadSet) -> Callable[[Scenario], tuple[Hashable, ...]]:
    """:func:`key_of` for one read set, with the per-read work done once: the same key, faster (a search
    computes a key for every candidate and every read set of its sections' classes)."""
    if any(name == WHOLE for _, name in reads):
        return lambda sc: key_of(sc, reads)
    # Runs of reads of one section, in the read set's order: the key is key_of's, value for value.
    getters: list[tuple[str, list[str]]] = []
    for section, name in reads:
        if getters and getters[-1][0] == section:
            getters[-1][1].append(name)
        else:
            getters.append((section, [name]))
    freeze, scalar = _freeze, _PLAIN

    def key(sc: Scenario) -> tuple[Hashable, ...]:
        out: list[Hashable] = []
        for section, names in getters:
            d = getattr(sc, section).__dict__
            for name in names:
                v = d[name] if name in d else getattr(getattr(sc, section), name)
                t = type(v)
                out.append(("float", v.hex()) if t is float else (t.__name__, v) if t in scalar else freeze(v))
        return tuple(out)

    return key


class ReadMemo:
    """Metrics of recorded simulations, by the sections' classes and read set, then by the values read."""

    def __init__(self, base: Scenario) -> None:
        self.base = base
        self.tables: dict[Shape, dict[tuple[Hashable, ...], dict[str, Any]]] = {}
        self.keyers: dict[ReadSet, Callable[[Scenario], tuple[Hashable, ...]]] = {}
        self.hits = 0

    def key(self, sc: Scenario, reads: ReadSet) -> tuple[Hashable, ...]:
        """``key_of(sc, reads)``, through a keyer made once per read set."""
        k = self.keyers.get(reads)
        if k is None:
            k = self.keyers[reads] = keyer(reads)
        return k(sc)

    def eligible(self, sc: Scenario) -> bool:
        """Whether ``sc`` shares every field but the searched sections with the base (the same hardware
        profile and model objects, equal strings): what the key leaves out."""
        b = self.base
        for name in type(b).model_fields:
            if name in SECTIONS:
                continue
            mine, theirs = getattr(sc, name), getattr(b, name)
            if mine is not theirs and not (type(mine) is str and mine == theirs):
                return False
        return type(sc) is type(b)

    def lookup(self, sc: Scenario) -> dict[str, Any] | None:
        classes = classes_of(sc)
        for shape, table in self.tables.items():
            if shape[0] == classes:
                hit = table.get(self.key(sc, shape[1]))
                if hit is not None:
                    return hit
        return None

    def add(self, sc: Scenario, reads: ReadSet, metrics: dict[str, Any]) -> tuple[Shape, tuple[Hashable, ...], bool]:
        """Store a recorded simulation of ``sc``: (its shape, its key, whether the shape is new)."""
        shape = (classes_of(sc), reads)
        table = self.tables.get(shape)
        new = table is None
        if table is None:
            table = self.tables[shape] = {}
        key = self.key(sc, reads)
        table.setdefault(key, metrics)
        return shape, key, new


__all__ = ["ReadMemo", "classes_of", "key_of", "keyer", "simulate_recorded"]
