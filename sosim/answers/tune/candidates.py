"""The tuner's candidates: each system's search space, and one candidate turned into a validated scenario with
its memory verdict, before anything is simulated.

A candidate is the base scenario with some dotted settings written in (``training.micro_batch``,
``schedule.bucket_mb``...). Building one is cheap by design:

- only the sections a candidate changes (training, cluster, schedule) are validated; the hardware profile and
  the model are the base's validated objects (``sosim.run.loader.load_derived``), and a section whose data an
  earlier candidate validated is that earlier object (validation of a section is a function of its data
  alone; the scenario-wide checks still run on every candidate);
- the memory verdict (``candidate_eval.memory_check``: the schedule's own ``memory_usage`` and ``check_fit``, as
  ``simulate`` decides ``feasible``) comes before any simulation, and is computed once per simulation key
  (sosim/answers/tune/key.py): two candidates that are one simulation are one memory check;
- every candidate is checked once (by its canonical settings).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sosim.answers.tune.candidate_eval import SCALARS, canonical_key, get_dotted, memory_check, section_keys, set_dotted
from sosim.answers.tune.key import Reuse
from sosim.answers.tune.result import Evaluation, Settings, TuneOptions
from sosim.answers.tune.space import TRAINING_KNOBS, Knob, search_space
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError, SosimError
from sosim.run.loader import load_derived, load_scenario

MemoryVerdict = tuple[float, float, bool, str, str]  # HBM GiB, host GiB, fits, reason, reason class
CHANGED = ("training", "cluster", "schedule")  # the only sections candidates change


def _what(exc: SosimError) -> str:
    """The first problem without its location ('schedule.x: message'), shared by every candidate that has it."""
    if isinstance(exc, ConfigError) and exc.details:
        return exc.details[0].what
    return str(exc).splitlines()[0]


@dataclass(frozen=True)
class SystemSpace:
    system: str
    implementation: str | None
    schedule_base: dict[str, Any]  # the schedule dict every candidate of the system starts from
    structural: tuple[Knob, ...]
    knobs: tuple[Knob, ...]  # coordinate-descent knobs
    dropped: tuple[str, ...]  # table keys this schema does not have
    defaults: dict[str, Any] = field(default_factory=dict)  # knob key -> the schema's default here

    def knobs_at(self, settings: Mapping[str, Any]) -> list[Knob]:
        """The descent knobs that apply to a point (ZeRO++ needs data parallelism)."""
        dp = int(settings.get("cluster.data_parallel", 1))
        return [k for k in self.knobs if k.applies(dp)]

    def with_defaults(self, point: Mapping[str, Any]) -> Settings:
        """The point with every applicable knob at its default, made explicit (so keys are canonical)."""
        return {**point, **{k.key: self.defaults[k.key] for k in self.knobs_at(point)}}


class Candidates:
    """The search spaces of one base scenario and every candidate checked so far (in generation order)."""

    def __init__(self, base: Scenario, options: TuneOptions, reuse: bool = True) -> None:
        self.base = base
        self.options = options
        self.base_data: dict[str, Any] = base.model_dump(mode="python", exclude_unset=True)
        self.evals: dict[str, Evaluation] = {}
        self.order: list[str] = []
        self.unavailable: dict[str, str] = {}
        self.sections: dict[Hashable, Any] = {}  # validated sections by their data (see load)
        self.memory: Reuse[MemoryVerdict] | None = Reuse(base) if reuse else None
        self.spaces = self._spaces()

    # ---- the spaces
    def _systems(self) -> list[str]:
        from sosim.schedules.registry import SYSTEMS

        known = list(SYSTEMS)
        wanted = list(self.options.systems) if self.options.systems else known
        unknown = [s for s in wanted if s not in known]
        if unknown:
            raise ConfigError([f"--systems: unknown system(s) {', '.join(unknown)}; known: {', '.join(known)}"])
        return wanted

    def _schedule_base(self, system: str) -> tuple[dict[str, Any], Scenario | None]:
        """The schedule dict every candidate of ``system`` starts from, validated (None: not valid here)."""
        base_sched = self.base.schedule
        base_impl = getattr(base_sched, "implementation", None)
        impl = self.options.implementation or base_impl
        if system == base_sched.system and impl == base_impl:
            sched = base_sched.model_dump(mode="python", exclude_unset=True)
            return sched, self._validate(sched)
        # Carried over: what describes the user's software and machine use, not a tunable choice. A value
        # this system rejects (no such field, an optimizer the profile cannot time) is left out: the largest
        # subset that validates wins (at most 8 tries, in a fixed order).
        carried = {k: v for k, v in (("implementation", impl), ("cpu_adam", getattr(base_sched, "cpu_adam", None)),
                                     ("pin_memory", getattr(base_sched, "pin_memory", None))) if v is not None}
        names = list(carried)
        for size in range(len(names), -1, -1):
            for subset in itertools.combinations(names, size):
                sched = {"system": system, **{k: carried[k] for k in subset}}
                sc = self._validate(sched)
                if sc is not None:
                    return sched, sc
        return {"system": system}, None

    def _validate(self, sched: dict[str, Any]) -> Scenario | None:
        try:
            return load_scenario({**self.base_data, "schedule": sched})
        except SosimError:
            return None

    def _space(self, system: str, sched: dict[str, Any], sc: Scenario) -> SystemSpace:
        impl = getattr(sc.schedule, "implementation", None)
        schema = {name: set(type(getattr(sc, name)).model_fields) for name in CHANGED}
        active, dropped = [], []
        for knob in (*TRAINING_KNOBS, *search_space(system)):
            section, _, name = knob.key.partition(".")
            if name not in schema.get(section, set()):
                dropped.append(knob.key)
            elif impl is None or impl in knob.implementations:
                active.append(knob)
        return SystemSpace(
            system=system, implementation=impl, schedule_base=sched,
            structural=tuple(k for k in active if k.structural), knobs=tuple(k for k in active if not k.structural),
            dropped=tuple(dropped), defaults={k.key: get_dotted(sc, k.key) for k in active})

    def _spaces(self) -> list[SystemSpace]:
        spaces = []
        for system in self._systems():
            sched, sc = self._schedule_base(system)
            if sc is not None:
                spaces.append(self._space(system, sched, sc))
                continue
            try:
                load_scenario({**self.base_data, "schedule": sched})
            except SosimError as exc:
                self.unavailable[system] = _what(exc)
        if not spaces:
            raise ConfigError(["no system can be searched: " + "; ".join(f"{s}: {r}" for s, r in
                                                                          self.unavailable.items())])
        return spaces

    def space_of(self, system: str) -> SystemSpace | None:
        return next((s for s in self.spaces if s.system == system), None)

    # ---- one candidate
    def scenario_data(self, space: SystemSpace, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The candidate's scenario data: the base's, the system's schedule base, the settings written in."""
        data = dict(self.base_data)
        data["training"] = dict(self.base_data.get("training", {}))
        data["cluster"] = dict(self.base_data.get("cluster", {}))
        base_sched = space.schedule_base
        # A flat dict of scalars (the usual schedule) needs no deep copy: only its top level is written below.
        data["schedule"] = dict(base_sched) if all(type(v) in SCALARS for v in base_sched.values()) \
            else copy.deepcopy(base_sched)
        for key, value in settings.items():
            section, _, name = key.partition(".")
            if section in CHANGED:
                data[section][name] = value
            else:
                set_dotted(data, key, value)
        return data

    def load(self, space: SystemSpace, settings: Settings) -> Scenario:
        """The candidate's scenario, validated as ``load_scenario`` would validate its data (see the module
        docstring: only the changed sections are validated, each distinct section data once)."""
        data = self.scenario_data(space, settings)
        if any(key.partition(".")[0] not in CHANGED for key in settings):
            return load_scenario(data)  # a key outside those sections: the full load
        sections: dict[str, Any] = {}
        fresh: list[tuple[str, Hashable]] = []
        reused: list[str] = []
        skeys = section_keys(space.system, settings)
        for name in CHANGED:
            skey = None if skeys is None else skeys[name]
            hit = None if skey is None else self.sections.get(skey)
            if hit is None:
                sections[name] = data[name]
                if skey is not None:
                    fresh.append((name, skey))
            else:
                sections[name] = hit
                reused.append(name)
        sc = load_derived(self.base, sections, checked=reused)
        for name, skey in fresh:
            # The section as validated from exactly this data: a later candidate with the same section data
            # passes this instance, which validation keeps as it is.
            self.sections[skey] = getattr(sc, name)
        return sc

    def check(self, space: SystemSpace, settings: Settings) -> Evaluation:
        """Validate and memory-check one candidate (once per canonical settings)."""
        key = canonical_key(space.system, settings)
        if key in self.evals:
            return self.evals[key]
        ev = Evaluation(system=space.system, settings=dict(settings), key=key)
        try:
            sc = self.load(space, settings)
        except SosimError as exc:
            ev.reason = str(exc).splitlines()[0]
            # "<dict>:1: schedule.x: message" -> "not valid: schedule.x: message" (the same for every candidate)
            ev.reason_key = "not valid: " + _what(exc)[:100]
        else:
            ev.scenario = sc
            self.set_memory(ev, self.memory_check(sc))
        self.add(ev)
        return ev

    def add(self, ev: Evaluation) -> None:
        self.evals[ev.key] = ev
        self.order.append(ev.key)

    def memory_check(self, sc: Scenario) -> MemoryVerdict:
        """:func:`memory_check`, once per simulation key (sosim/answers/tune/key.py; the check is a pure function)."""
        memo = self.memory
        if memo is None or not memo.eligible(sc):
            return memory_check(sc)
        key = memo.key(sc)
        hit = memo.get(key)
        if hit is None:
            hit = memory_check(sc)
            memo.put(key, hit)
        return hit

    def set_memory(self, ev: Evaluation, verdict: MemoryVerdict) -> None:
        gpu, cpu, fits, reason, klass = verdict
        ev.gpu_mem_gib, ev.cpu_mem_gib = gpu, cpu
        ev.fits, ev.reason, ev.reason_key = self.caps(gpu, cpu, fits, reason, klass)

    def caps(self, gpu: float, cpu: float, fits: bool, reason: str, klass: str) -> tuple[bool, str, str]:
        """A memory verdict with the user's caps (--max-hbm, --max-host-ram) applied."""
        o = self.options
        extra_r, extra_k = [], []
        if o.max_hbm_gib is not None and gpu > o.max_hbm_gib:
            extra_r.append(f"HBM {gpu:.1f} GiB > --max-hbm {o.max_hbm_gib:g} GiB")
            extra_k.append("HBM over --max-hbm")
        if o.max_host_ram_gib is not None and cpu > o.max_host_ram_gib:
            extra_r.append(f"host memory {cpu:.1f} GiB > --max-host-ram {o.max_host_ram_gib:g} GiB")
            extra_k.append("host memory over --max-host-ram")
        if not extra_r:
            return fits, reason, klass
        return False, "; ".join([r for r in (reason,) if r] + extra_r), " + ".join([k for k in (klass,) if k] + extra_k)


__all__ = ["CHANGED", "Candidates", "MemoryVerdict", "SystemSpace"]
