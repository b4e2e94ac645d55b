"""``sosim tune``: the fastest configuration of a training run that fits, and why it wins.

Given a scenario (or the user's DeepSpeed config + model config + hardware profile), the tuner searches the
system (gpu_only, zero_offload, the ZeRO-3 family, SuperOffload...), the implementation knobs of each system
(:mod:`sosim.tune_space`: one declarative table), activation checkpointing, the micro-batch / gradient
accumulation split at a fixed global batch, and the data / sequence parallel split where there are several
GPUs. Only configurations that fit in memory on every side are ranked.

How it stays cheap (every number it prints says how many candidates were simulated):

1. *Memory before simulation.* Each candidate's footprint on both sides is computed without simulating
   (the schedule's own ``memory_usage`` and the same ``check_fit`` verdict ``simulate`` uses); one that
   does not fit is counted (with its side and largest item) and never simulated. Of the micro-batches that
   fit, only the ``micro_batches_kept`` largest are simulated: at a fixed global batch a smaller micro-batch
   only adds accumulation steps of smaller, less efficient kernels.
2. *Structure first, knobs second.* Stage 1 crosses the structural choices (system, checkpointing,
   micro-batch, parallel split, weight placement) with every other knob at its default. Stage 2 starts
   coordinate descent over the remaining knobs from the ``beam`` best structural points of each system
   (all knob values of one knob at a time, repeated until nothing changes). A system whose whole grid is
   small (``exhaustive_limit``) is searched exhaustively instead. Stage 3 refines numeric knobs between the
   neighbours of their best coarse value.
3. *A budget.* At most ``budget`` simulations; the output says when the budget cut the search short.
4. *Nothing computed twice.* A candidate that agrees with an earlier one on every field its simulation (or
   memory check) read takes that result (sosim/tune_memo.py: exact); a candidate's section data validated
   once is reused as validated; with workers, stage 1's candidates go to them (several per task) while the
   rest are still being checked. ``memo=False`` computes everything afresh: the same answer, slower.

Order is deterministic: candidates are generated in table order, ties are broken by the candidate's
settings, and parallel results are sorted before any decision. Ctrl-C stops the search and keeps the best
configuration found so far (``TuneResult.interrupted``).

The parts around the search live beside it: the options and answers as data (sosim/tune_result.py), one
candidate's keys and memory verdict (tune_eval.py), the search space (tune_space.py, from the systems),
reuse of identical simulations (tune_memo.py), the report (tune_report.py) and the written config with its
round trip (tune_write.py). Why this module is still ~1,200 lines: the ``Tuner`` (candidates, stages) and
the worker streaming (``_MemoRun``, the executor) share the search's state; the executor code is being
changed for signal handling separately, so it moves (to its own module) after that lands.
"""

from __future__ import annotations

import copy
import gc
import itertools
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sosim.config import Scenario
from sosim.errors import ConfigError, SosimError
from sosim.loader import load_derived, load_scenario
from sosim.tune_eval import (
    SCALARS,
    canonical_key,
    divisors,
    get_dotted,
    memory_check,
    reason_class,
    section_keys,
    set_dotted,
    simulate_metrics,
    simulate_recorded_batch,
)
from sosim.tune_memo import ReadMemo
from sosim.tune_result import Evaluation, Settings, SystemMemory, TuneOptions, TuneResult
from sosim.tune_space import BATCH_KEYS, PARALLEL_KEYS, TRAINING_KNOBS, Knob, refine_values, search_space
from sosim.tune_write import write_ds_config

EXIT_INTERRUPTED = 130  # the shell's convention for a run stopped by SIGINT
# Batches at least this large go to the process pool (a pool round trip costs ~ms per chunk).
PARALLEL_MIN_BATCH = 24
# Scores are compared to this many significant digits: differences below ~0.05% are noise next to the model's
# error (docs/validation.md) and should not pull a knob away from its default.
SCORE_DIGITS = 4
# Candidates per worker task of the memoised search (each costs a few ms; a round trip ~1 ms).
MEMO_CHUNK = 8
# Memory checks (~0.3 ms each, no simulation) spent looking for a fitting variant of one structural point.
RESCUE_CHECKS = 80




# -------------------------------------------------------------------------------------------------- search


@dataclass(frozen=True)
class _SystemSpace:
    system: str
    implementation: str | None
    schedule_base: dict[str, Any]  # the schedule dict every candidate of the system starts from
    structural: tuple[Knob, ...]
    knobs: tuple[Knob, ...]  # coordinate-descent knobs
    dropped: tuple[str, ...]  # table keys this schema does not have
    defaults: dict[str, Any] = field(default_factory=dict)  # knob key -> the schema's default here


@dataclass
class _Chain:
    """One coordinate-descent run: its current best candidate and the values tried per knob."""

    space: _SystemSpace
    current: Evaluation
    tried: dict[str, list[Any]] = field(default_factory=dict)


class _Interrupted(Exception):
    pass


class _BudgetExhausted(Exception):
    pass


class Tuner:
    """One search. ``evaluate`` maps a scenario to its metrics (``simulate`` by default)."""

    def __init__(self, base: Scenario, options: TuneOptions | None = None, *,
                 evaluate: Callable[[Scenario], dict[str, Any]] | None = None,
                 executor: Executor | None = None, memo: bool = True) -> None:
        self.options = options or TuneOptions()
        self.options.check()
        # Looked up at call time, so a test can replace the module's evaluator.
        self.evaluate_fn = evaluate or simulate_metrics
        self.parallel_ok = evaluate is None  # a custom evaluator may not pickle: keep it in this process
        # Reuse of identical simulations (sosim/tune_memo.py); only for simulate() itself, whose purity it needs.
        self.memo: ReadMemo | None = None
        self.executor = executor
        self._own_executor = False
        base = self._with_gpus(base)
        self.base_sc = base
        if evaluate is None and memo:
            self.memo = ReadMemo(base)
        # Memory verdicts reused the same way (the check is always memory_check itself, whatever ``evaluate``).
        self.memory_memo: ReadMemo | None = ReadMemo(base) if memo else None
        # Validated sections by their data (see _load).
        self._sections: dict[Hashable, Any] = {}
        self.base_data: dict[str, Any] = base.model_dump(mode="python", exclude_unset=True)
        t, c = base.training, base.cluster
        self.gpus = c.gpus
        self.global_batch = self.options.global_batch or t.micro_batch * t.grad_accum * c.dp
        self.seq_len = t.seq_len
        self.tokens_per_step = self.global_batch * self.seq_len
        self.evals: dict[str, Evaluation] = {}
        self.order: list[str] = []
        self.simulated = 0
        self.interrupted = False
        self.budget_exhausted = False
        self.notes: list[str] = []
        self.unavailable: dict[str, str] = {}
        self.bar: Any = None
        hw = base.hardware
        self.hbm_reserved = float(hw.gpu.reserved_gib)
        self.host_reserved = float(hw.cpu.reserved_gib)
        self.hbm_usable = float(hw.gpu.hbm_gib) - self.hbm_reserved
        self.host_usable = float(hw.cpu.mem_gib) - self.host_reserved
        self.splits = self._parallel_splits()
        if not self.splits:
            raise ConfigError([f"global batch {self.global_batch}: no split over {self.gpus} GPU(s) works: "
                               "micro-batch x accumulation x data-parallel ranks must equal it (and Ulysses "
                               "sequence parallelism must divide the heads and the sequence)"])
        self.spaces = self._spaces()

    # ---- setup
    def _with_gpus(self, base: Scenario) -> Scenario:
        gpus = self.options.gpus
        if gpus is None or gpus == base.cluster.gpus:
            return base
        data = base.model_dump(mode="python", exclude_unset=True)
        data["cluster"] = {**data.get("cluster", {}), "gpus": gpus, "data_parallel": None, "sequence_parallel": 1}
        return load_scenario(data)

    def _parallel_splits(self) -> list[tuple[int, int]]:
        """(data_parallel, sequence_parallel) pairs: sp divides the GPUs, the heads and the sequence."""
        heads = self.base_sc.model.heads
        out = []
        for sp in divisors(self.gpus):
            dp = self.gpus // sp
            if heads % sp or self.seq_len % sp or self.global_batch % dp:
                continue
            out.append((dp, sp))
        return out

    def _systems(self) -> list[str]:
        from sosim.schedules import SYSTEMS

        known = list(SYSTEMS)
        wanted = list(self.options.systems) if self.options.systems else known
        unknown = [s for s in wanted if s not in known]
        if unknown:
            raise ConfigError([f"--systems: unknown system(s) {', '.join(unknown)}; known: {', '.join(known)}"])
        return wanted

    def _schedule_base(self, system: str) -> tuple[dict[str, Any], Scenario | None]:
        """The schedule dict every candidate of ``system`` starts from, validated (None: not valid here)."""
        base_sched = self.base_sc.schedule
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

    def _spaces(self) -> list[_SystemSpace]:
        spaces = []
        for system in self._systems():
            sched, sc = self._schedule_base(system)
            if sc is None:
                try:
                    load_scenario({**self.base_data, "schedule": sched})
                except SosimError as exc:
                    self.unavailable[system] = str(exc).splitlines()[0].split(": ", 1)[-1]
                continue
            impl = getattr(sc.schedule, "implementation", None)
            fields = {
                "schedule": set(type(sc.schedule).model_fields),
                "training": set(type(sc.training).model_fields),
                "cluster": set(type(sc.cluster).model_fields),
            }
            table = (*TRAINING_KNOBS, *search_space(system))
            active, dropped = [], []
            for knob in table:
                section, _, name = knob.key.partition(".")
                if name not in fields.get(section, set()):
                    dropped.append(knob.key)
                elif impl is not None and impl not in knob.implementations:
                    continue
                else:
                    active.append(knob)
            defaults = {k.key: get_dotted(sc, k.key) for k in active}
            spaces.append(_SystemSpace(
                system=system, implementation=impl, schedule_base=sched,
                structural=tuple(k for k in active if k.structural),
                knobs=tuple(k for k in active if not k.structural), dropped=tuple(dropped), defaults=defaults))
        if not spaces:
            raise ConfigError(["no system can be searched: " + "; ".join(f"{s}: {r}" for s, r in
                                                                          self.unavailable.items())])
        return spaces

    # ---- candidates
    def _scenario_data(self, space: _SystemSpace, settings: Mapping[str, Any]) -> dict[str, Any]:
        data = dict(self.base_data)
        data["training"] = dict(self.base_data.get("training", {}))
        data["cluster"] = dict(self.base_data.get("cluster", {}))
        base_sched = space.schedule_base
        # A flat dict of scalars (the usual schedule) needs no deep copy: only its top level is written below.
        data["schedule"] = dict(base_sched) if all(type(v) in SCALARS for v in base_sched.values()) \
            else copy.deepcopy(base_sched)
        for key, value in settings.items():
            section, _, name = key.partition(".")
            if section in ("training", "cluster", "schedule"):
                data[section][name] = value
            else:
                set_dotted(data, key, value)
        return data

    def _load(self, space: _SystemSpace, settings: Settings) -> Scenario:
        """The candidate's scenario, validated as ``load_scenario`` would validate its data. Candidates only
        change the training, cluster and schedule sections: those are validated, and the base's hardware
        profile and model are reused as validated (the same scenario, a fraction of the cost)."""
        data = self._scenario_data(space, settings)
        changed = ("training", "cluster", "schedule")
        if any(key.partition(".")[0] not in changed for key in settings):
            return load_scenario(data)  # a key outside those sections: the full load
        sections: dict[str, Any] = {}
        keys: list[tuple[str, Hashable]] = []
        reused: list[str] = []
        skeys = section_keys(space.system, settings)
        for name in changed:
            skey = None if skeys is None else skeys[name]
            hit = None if skey is None else self._sections.get(skey)
            if hit is None:
                sections[name] = data[name]
                if skey is not None:
                    keys.append((name, skey))
            else:
                sections[name] = hit
                reused.append(name)
        sc = load_derived(self.base_sc, sections, checked=reused)
        for name, skey in keys:
            # The section as validated from exactly this data (validation of a section is a function of its
            # data alone: sosim.schedules.registry.validate_knobs, pydantic's nested models); a later candidate
            # with the same section data passes this instance, which validation keeps as it is, and the
            # scenario-wide checks still run on every candidate.
            self._sections[skey] = getattr(sc, name)
        return sc

    def _check(self, space: _SystemSpace, settings: Settings) -> Evaluation:
        """Validate and memory-check one candidate (cached by its settings)."""
        key = canonical_key(space.system, settings)
        if key in self.evals:
            return self.evals[key]
        ev = Evaluation(system=space.system, settings=dict(settings), key=key)
        try:
            sc = self._load(space, settings)
        except SosimError as exc:
            first = str(exc).splitlines()[0]
            ev.reason = first
            # "<dict>:1: schedule.x: message" -> "invalid: schedule.x: message"
            ev.reason_key = "not valid: " + first.split(": ", 1)[-1][:100]
        else:
            ev.scenario = sc
            gpu, cpu, fits, reason, klass = self._memory_check(sc)
            ev.gpu_mem_gib, ev.cpu_mem_gib = gpu, cpu
            fits, reason, klass = self._caps(gpu, cpu, fits, reason, klass)
            ev.fits, ev.reason, ev.reason_key = fits, reason, klass
        self.evals[key] = ev
        self.order.append(key)
        return ev

    def _memory_check(self, sc: Scenario) -> tuple[float, float, bool, str, str]:
        """:func:`memory_check`, reusing the verdict of an earlier candidate that agrees on every field the
        check read (the same rule as the simulation memo: sosim/tune_memo.py; the check is a pure function)."""
        memo = self.memory_memo
        if memo is None or not memo.eligible(sc):
            return memory_check(sc)
        hit = memo.lookup(sc)
        if hit is not None:
            memo.hits += 1
            return cast(tuple[float, float, bool, str, str], hit["check"])
        from sosim.tune_memo import simulate_recorded

        out, reads = simulate_recorded(sc, lambda s: {"check": memory_check(s)})
        memo.add(sc, reads, out)
        return cast(tuple[float, float, bool, str, str], out["check"])

    def _caps(self, gpu: float, cpu: float, fits: bool, reason: str, klass: str) -> tuple[bool, str, str]:
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

    def _score(self, metrics: Mapping[str, Any]) -> float:
        if self.options.objective == "time_to_tokens":
            assert self.options.token_budget is not None
            steps = math.ceil(self.options.token_budget / self.tokens_per_step)
            return -steps * float(metrics["step_time_s"])
        return float(metrics["tokens_per_s"])

    def time_to_tokens_s(self, ev: Evaluation) -> float | None:
        if ev.metrics is None or not self.options.token_budget:
            return None
        steps = math.ceil(self.options.token_budget / self.tokens_per_step)
        return steps * float(ev.metrics["step_time_s"])

    def _record(self, ev: Evaluation, metrics: Mapping[str, Any] | None, error: str | None) -> None:
        if error is not None or metrics is None:
            ev.fits = False
            ev.reason = error or "simulation failed"
            ev.reason_key = "simulation error: " + (error or "")[:80]
            return
        ev.metrics = dict(metrics)
        ev.gpu_mem_gib = float(metrics["gpu_mem_peak_gib"])
        ev.cpu_mem_gib = float(metrics["cpu_mem_peak_gib"])
        fits, reason = bool(metrics["feasible"]), str(metrics.get("reason") or "")
        klass = reason_class(reason) if not fits else ""
        fits, reason, klass = self._caps(ev.gpu_mem_gib, ev.cpu_mem_gib, fits, reason, klass)
        ev.fits, ev.reason, ev.reason_key = fits, reason, klass
        step = float(metrics["step_time_s"])
        ev.score = self._score(metrics) if fits and math.isfinite(step) and step > 0 else None

    def _simulate(self, evs: list[Evaluation]) -> None:
        """Simulate every fitting, not yet simulated candidate of ``evs`` (within the budget)."""
        todo = [e for e in evs if e.fits and e.metrics is None and e.scenario is not None]
        todo = list({e.key: e for e in todo}.values())
        room = self.options.budget - self.simulated
        if len(todo) > room:
            todo = todo[:max(room, 0)]
            self.budget_exhausted = True
        if not todo:
            if self.budget_exhausted:
                raise _BudgetExhausted
            return
        if self.bar is not None:
            self.bar.total = (self.bar.total or 0) + len(todo)
            self.bar.refresh()
        try:
            executor = self._executor() if len(todo) >= PARALLEL_MIN_BATCH else None
            if self.memo is not None:
                self._simulate_memo(executor, todo)
            elif executor is None:
                for ev in todo:
                    assert ev.scenario is not None
                    try:
                        metrics = self.evaluate_fn(ev.scenario)
                    except SosimError as exc:
                        self._record(ev, None, str(exc))
                    else:
                        self._record(ev, metrics, None)
                    self.simulated += 1
                    if self.bar is not None:
                        self.bar.update(1)
            else:
                self._simulate_parallel(executor, todo)
        except KeyboardInterrupt:
            self.interrupted = True
            raise _Interrupted from None
        if self.budget_exhausted:
            raise _BudgetExhausted

    def _simulate_memo(self, executor: Executor | None, todo: list[Evaluation]) -> None:
        """Simulate ``todo`` in generation order, each candidate that agrees with an earlier simulation on every
        field that simulation read taking its metrics instead (exact: sosim/tune_memo.py). Recorded runs go
        to ``executor`` (:class:`_MemoRun`), or run here."""
        run = _MemoRun(self, executor)
        try:
            run.add(todo)
            run.drain()
        finally:
            run.cancel()

    # ---- stage 1 streamed: candidates simulated while the later ones are still being checked
    def _stream_start(self) -> _MemoRun | None:
        """A memoised run that takes stage 1's candidates as they are checked (the workers start while this
        process checks the rest), or None where nothing would overlap (no memo, no workers)."""
        if self.memo is None or not self.parallel_ok or (self.executor is None and self.options.jobs <= 1):
            return None
        self._stream_seen: set[str] = set()
        self._stream_room = self.options.budget - self.simulated
        # The workers start once PARALLEL_MIN_BATCH candidates wait (a smaller stage 1 runs here, as _simulate
        # would run it).
        return _MemoRun(self, None)

    def _stream_add(self, run: _MemoRun, evs: Iterable[Evaluation]) -> None:
        """Hand ``evs`` (the next candidates of stage 1, in its order) to ``run``: the same selection as
        :meth:`_simulate` makes over the whole list (fitting, not simulated, first of its key, within the
        budget), made one candidate at a time in the same order."""
        todo = []
        for e in evs:
            if not (e.fits and e.metrics is None and e.scenario is not None) or e.key in self._stream_seen:
                continue
            self._stream_seen.add(e.key)
            if len(self._stream_seen) > self._stream_room:
                self.budget_exhausted = True
                continue
            todo.append(e)
        if not todo:
            return
        if self.bar is not None:
            self.bar.total = (self.bar.total or 0) + len(todo)
            self.bar.refresh()
        run.add(todo)
        if run.executor is None and len(run.todo) + len(run.plain) >= PARALLEL_MIN_BATCH:
            run.executor = self._executor()
        if run.executor is not None:
            run.pump(block=False)

    def _stream_finish(self, run: _MemoRun, stage1: list[Evaluation]) -> None:
        """The rest of stage 1 (the whole list again: what was handed over already is skipped), then every
        result; raises as :meth:`_simulate` does."""
        self._stream_add(run, stage1)
        run.drain()
        if self.budget_exhausted:
            raise _BudgetExhausted

    def _executor(self) -> Executor | None:
        if not self.parallel_ok:  # the workers run simulate(), not a custom evaluator
            return None
        if self.executor is not None:
            return self.executor
        if self.options.jobs <= 1:
            return None
        from sosim.workers import WorkerPool

        # Workers ignore Ctrl-C, die with this process, and an aborting shutdown (wait=False,
        # cancel_futures=True, as run() does when interrupted) ends them by PID (sosim/workers.py).
        self.executor = WorkerPool(self.options.jobs)
        self._own_executor = True
        return self.executor

    def _simulate_parallel(self, executor: Executor, todo: list[Evaluation]) -> None:
        from sosim.sweep import ERROR_COLUMN, ID_COLUMN, PROVENANCE_COLUMNS, run_items

        by_key = {e.key: e for e in todo}
        not_metrics = {ID_COLUMN, ERROR_COLUMN, "scenario", *PROVENANCE_COLUMNS}
        items: list[tuple[str, list[str] | Scenario]] = [(e.key, e.scenario) for e in todo if e.scenario is not None]
        finished: list[dict[str, Any]] = []

        def sink(rows: list[dict[str, Any]]) -> None:
            finished.extend(rows)
            if self.bar is not None:
                self.bar.update(len(rows))

        workers = max(1, self.options.jobs)
        chunk = max(1, min(50, math.ceil(len(items) / (workers * 3))))
        try:
            run_items(None, items, sink, executor=executor, chunk_size=chunk, progress=False)
        finally:
            # Decisions never depend on completion order: record in generation order.
            done = {r[ID_COLUMN]: r for r in finished}
            for key, ev in by_key.items():
                row = done.get(key)
                if row is None:
                    continue
                self.simulated += 1
                error = row.get(ERROR_COLUMN)
                # A sweep row is {scenario, the provenance columns, **metrics} (sosim/sweep.py): the metrics alone
                # are what simulate() gives, as the other paths record them.
                metrics = {k: v for k, v in row.items() if k not in not_metrics}
                self._record(ev, None if error else metrics, error if error else None)

    # ---- stages
    def _batch_splits(self, dp: int) -> list[tuple[int, int]]:
        per_rank = self.global_batch // dp
        return [(mb, per_rank // mb) for mb in sorted(divisors(per_rank), reverse=True)]

    def _knobs(self, space: _SystemSpace, settings: Mapping[str, Any]) -> list[Knob]:
        """The descent knobs that apply to a point (ZeRO++ needs data parallelism)."""
        dp = int(settings.get("cluster.data_parallel", 1))
        return [k for k in space.knobs if k.applies(dp)]

    def _defaults(self, space: _SystemSpace, point: Mapping[str, Any]) -> Settings:
        """The point with every applicable knob at its default, made explicit (so keys are canonical)."""
        return {**point, **{k.key: space.defaults[k.key] for k in self._knobs(space, point)}}

    def _rescue(self, space: _SystemSpace, point: Settings) -> Evaluation | None:
        """A fitting variant of a point that does not fit at its defaults: other values of the knobs that
        change memory, fewest changes first, in table order (at most ``RESCUE_CHECKS`` memory checks)."""
        knobs = [k for k in self._knobs(space, point) if k.memory]
        checks = 0
        for n_changes in range(1, len(knobs) + 1):
            for subset in itertools.combinations(knobs, n_changes):
                grids = [[v for v in k.values if v != point.get(k.key)] for k in subset]
                for combo in itertools.product(*grids):
                    ev = self._check(space, {**point, **{k.key: v for k, v in zip(subset, combo)}})
                    checks += 1
                    if ev.fits:
                        return ev
                    if checks >= RESCUE_CHECKS:
                        return None
        return None

    def _structural_points(self, space: _SystemSpace) -> list[Evaluation]:
        """Every structural combination with its largest fitting micro-batches, knobs at their defaults (or
        at the nearest values that fit where the defaults do not)."""
        out: list[Evaluation] = []
        for dp, sp in self.splits:
            struct = [k for k in space.structural if k.applies(dp)]
            grids = [[(k.key, v) for v in k.values_for(dp)] for k in struct]
            for combo in itertools.product(*grids):
                settings: Settings = {"cluster.data_parallel": dp, "cluster.sequence_parallel": sp, **dict(combo)}
                kept = 0
                for mb, ga in self._batch_splits(dp):
                    point = self._defaults(space, {**settings, "training.micro_batch": mb, "training.grad_accum": ga})
                    ev: Evaluation | None = self._check(space, point)
                    if ev is not None and not ev.fits:
                        ev = self._rescue(space, point)
                    if ev is not None and ev.fits:
                        out.append(ev)
                        kept += 1
                        if kept >= self.options.micro_batches_kept:
                            break
        return out

    def _grid_size(self, space: _SystemSpace, n_points: int) -> int:
        size = n_points
        for k in space.knobs:
            size *= len(k.values)
        return size

    def _exhaustive(self, space: _SystemSpace, points: list[Settings],
                    sink: Callable[[list[Evaluation]], None] | None = None) -> list[Evaluation]:
        """Every knob combination of every structural point (each point's candidates also handed to ``sink``
        as soon as they are checked)."""
        evs = []
        for point in points:
            knobs = self._knobs(space, point)
            mine = [self._check(space, {**point, **dict(combo)})
                    for combo in itertools.product(*[[(k.key, v) for v in k.values] for k in knobs])]
            evs.extend(mine)
            if sink is not None:
                sink(mine)
        return evs

    def _rank_key(self, ev: Evaluation) -> tuple[float, int, int, str]:
        """Best first. Scores equal to 4 significant digits (a knob worth less than ~0.05% here) count as a
        tie, which goes to the knobs' preferred values, then to the configuration closest to the defaults,
        then to the settings' order."""
        space = next((s for s in self.spaces if s.system == ev.system), None)
        changed = 0 if space is None else sum(1 for k, v in space.defaults.items()
                                              if k in ev.settings and ev.settings[k] != v)
        preference = 0
        if space is not None:
            dp = int(ev.settings.get("cluster.data_parallel", 1))
            for knob in space.structural + space.knobs:
                values = knob.values_for(dp)
                if knob.prefer_first and ev.settings.get(knob.key) in values:
                    preference += values.index(ev.settings[knob.key])
        return (-float(f"{ev.score or 0.0:.{SCORE_DIGITS}g}"), preference, changed, ev.key)

    def _best(self, evs: Iterable[Evaluation]) -> Evaluation | None:
        ranked = [e for e in evs if e.ranked]
        if not ranked:
            return None
        return min(ranked, key=self._rank_key)

    def run(self) -> TuneResult:
        o = self.options
        from tqdm import tqdm

        self.bar = tqdm(total=0, unit="cfg", desc="tune", file=sys.stderr, dynamic_ncols=True,
                        disable=None if o.progress is None else not o.progress)
        # A search allocates tens of thousands of candidates (scenarios, evaluations) that live until it ends:
        # the cyclic garbage collector would walk them again and again (~25% of the checks' time). Paused for
        # the search, as simulate() pauses it, and restored after.
        paused = gc.isenabled()
        gc.disable()
        try:
            self._search()
        except _Interrupted:
            self.notes.append("interrupted (Ctrl-C): the best configuration found so far is shown")
        except _BudgetExhausted:
            self.notes.append(f"search budget of {o.budget} simulations reached: the search stopped early "
                              "(raise --budget for a fuller search)")
        finally:
            if paused:
                gc.enable()
            self.bar.close()
            if self._own_executor and self.executor is not None:
                self.executor.shutdown(wait=not self.interrupted, cancel_futures=True)
        return self._result()

    def _base_evaluation(self) -> Evaluation:
        sc = self.base_sc
        space = next((s for s in self.spaces if s.system == sc.schedule.system
                      and s.implementation == getattr(sc.schedule, "implementation", None)), None)
        keys = [*BATCH_KEYS, *PARALLEL_KEYS]
        settings = {k: get_dotted(sc, k) for k in keys}
        settings["cluster.data_parallel"] = sc.cluster.dp
        if space is not None:
            for k in (*space.structural, *space.knobs):
                if k.applies(sc.cluster.dp):
                    settings[k.key] = get_dotted(sc, k.key)
            ev = self._check(space, settings)
        else:
            key = canonical_key(sc.schedule.system, settings)
            ev = Evaluation(system=sc.schedule.system, settings=settings, key=key, scenario=sc, in_space=False)
            gpu, cpu, fits, reason, klass = memory_check(sc)
            ev.gpu_mem_gib, ev.cpu_mem_gib = gpu, cpu
            ev.fits, ev.reason, ev.reason_key = self._caps(gpu, cpu, fits, reason, klass)
            self.evals[key] = ev
            self.order.append(key)
        ev.is_base = True
        return ev

    def _step(self, space: _SystemSpace, settings: Settings, knob: Knob, value: Any) -> Evaluation:
        """One descent candidate: ``knob`` set to ``value``. A memory knob's value that does not fit at this
        micro-batch is tried at the next smaller micro-batches (more accumulation steps, same global batch):
        the trade between activation memory and, say, optimizer state kept in HBM is a move of its own, which
        one knob at a time would never make."""
        ev = self._check(space, {**settings, knob.key: value})
        if ev.fits or not knob.memory or ev.scenario is None:
            return ev
        dp, mb = int(settings["cluster.data_parallel"]), int(settings["training.micro_batch"])
        for smaller, ga in self._batch_splits(dp):
            if smaller >= mb:
                continue
            trial = self._check(space, {**settings, knob.key: value, "training.micro_batch": smaller,
                                        "training.grad_accum": ga})
            if trial.fits:
                return trial
        return ev

    def _diverse(self, space: _SystemSpace, evs: list[Evaluation], n: int) -> list[Evaluation]:
        """The ``n`` starting points of coordinate descent: the best point of each structural class (weight
        placement, checkpointing, parallel split...; the micro-batch left out) in rank order, then the next
        best points, so that the beam covers different basins rather than one class at several micro-batches."""
        ranked = sorted((e for e in evs if e.ranked), key=self._rank_key)
        structural = {k.key for k in space.structural} | set(PARALLEL_KEYS)

        def klass(ev: Evaluation) -> str:
            return json.dumps(sorted((k, v) for k, v in ev.settings.items() if k in structural), default=str)

        chosen: list[Evaluation] = []
        seen: set[str] = set()
        for ev in ranked:
            if klass(ev) not in seen:
                seen.add(klass(ev))
                chosen.append(ev)
        chosen += [ev for ev in ranked if ev not in chosen]
        return chosen[:n]

    def _search(self) -> None:
        base = self._base_evaluation()
        self.base_eval: Evaluation | None = base
        self._simulate([base])
        starts, exhaustive = self._stage1()
        chains = self._chains(starts, exhaustive)
        self._descend([c for c in chains if c.space.system not in exhaustive])
        self._refine(chains)

    def _stage1(self) -> tuple[dict[str, list[Evaluation]], dict[str, list[Evaluation]]]:
        """Stage 1; returns the structural points of the staged systems and the exhaustive systems' grids."""
        o = self.options
        # Stage 1: structural points of every system, knobs at their defaults.
        starts: dict[str, list[Evaluation]] = {}
        exhaustive: dict[str, list[Evaluation]] = {}
        # With workers, the exhaustive grids' candidates go to them as they are checked (the same selection and
        # results as one batch after all checks: _stream_add).
        stream = self._stream_start()
        sink = None if stream is None else (lambda evs: self._stream_add(stream, evs))
        try:
            for space in self.spaces:
                points = self._structural_points(space)
                if self._grid_size(space, len(points)) <= o.exhaustive_limit:
                    knob_keys = {k.key for k in space.knobs}
                    structure = [{k: v for k, v in p.settings.items() if k not in knob_keys} for p in points]
                    exhaustive[space.system] = self._exhaustive(space, structure, sink)
                else:
                    starts[space.system] = points
            stage1 = [e for evs in (*exhaustive.values(), *starts.values()) for e in evs]
            if stream is None:
                self._simulate(stage1)
            else:
                self._stream_finish(stream, stage1)
        except KeyboardInterrupt:
            self.interrupted = True
            raise _Interrupted from None
        finally:
            if stream is not None:
                stream.cancel()
        return starts, exhaustive

    def _chains(self, starts: dict[str, list[Evaluation]], exhaustive: dict[str, list[Evaluation]]) -> list[_Chain]:
        """Stage 2 starts: the best of each exhaustive grid, the ``beam`` most diverse structural points else."""
        chains: list[_Chain] = []
        for space in self.spaces:
            if space.system in exhaustive:
                best = self._best(exhaustive[space.system])
                if best is not None:
                    chains.append(_Chain(space, best, {k.key: list(k.values) for k in space.knobs}))
                continue
            for ev in self._diverse(space, starts.get(space.system, []), self.options.beam):
                chains.append(_Chain(space, ev))
        return chains

    def _descend(self, descend: list[_Chain]) -> None:
        """Stage 2: coordinate descent from the best structural points of each staged system."""
        for _ in range(self.options.max_passes):
            if not self._descend_pass(descend):
                break

    def _descend_pass(self, descend: list[_Chain]) -> bool:
        """One pass over the knobs (all chains' i-th knob in one batch); True when a chain moved."""
        changed = False
        n_knobs = max((len(c.space.knobs) for c in descend), default=0)
        for i in range(n_knobs):
            batch = [b for chain in descend if (b := self._knob_batch(chain, i)) is not None]
            self._simulate([e for _, evs in batch for e in evs])
            for chain, evs in batch:
                best = self._best([chain.current, *evs])
                if best is not None and best.key != chain.current.key:
                    chain.current = best
                    changed = True
        return changed

    def _knob_batch(self, chain: _Chain, i: int) -> tuple[_Chain, list[Evaluation]] | None:
        """Every value of the chain's i-th knob from its current point (None: no such knob here)."""
        if i >= len(chain.space.knobs):
            return None
        knob = chain.space.knobs[i]
        if knob not in self._knobs(chain.space, chain.current.settings):
            return None
        values = list(knob.values)
        chain.tried.setdefault(knob.key, [])
        for v in values:
            if v not in chain.tried[knob.key]:
                chain.tried[knob.key].append(v)
        return chain, [self._step(chain.space, chain.current.settings, knob, v) for v in values]

    def _refine(self, chains: list[_Chain]) -> None:
        """Stage 3: refine numeric knobs between the neighbours of their best value."""
        for _ in range(self.options.refine_rounds):
            batch = [b for chain in chains for b in self._refine_batch(chain)]
            if not batch:
                break
            self._simulate([e for _, evs in batch for e in evs])
            for chain, evs in batch:
                best = self._best([chain.current, *evs])
                if best is not None:
                    chain.current = best

    def _refine_batch(self, chain: _Chain) -> list[tuple[_Chain, list[Evaluation]]]:
        out = []
        for knob in chain.space.knobs:
            if knob.refine is None or knob not in self._knobs(chain.space, chain.current.settings):
                continue
            grid = chain.tried.setdefault(knob.key, list(knob.values))
            new = refine_values(knob, grid, chain.current.settings.get(knob.key))
            grid.extend(new)
            if new:
                out.append((chain, [self._step(chain.space, chain.current.settings, knob, v) for v in new]))
        return out

    # ---- result
    def _result(self) -> TuneResult:
        evals = [self.evals[k] for k in self.order]
        base = getattr(self, "base_eval", None)
        in_batch = [e for e in evals if e.ranked and e.in_space and self._same_batch(e)]
        ranked = sorted(in_batch, key=self._rank_key)
        systems = [self._system_memory(s.system, evals, ranked) for s in self.spaces]
        systems += [SystemMemory(s, None, 0, 0, None, None, None, None, unavailable=r)
                    for s, r in self.unavailable.items()]
        return TuneResult(
            base=base, ranked=ranked, evaluations=evals, systems=systems, options=self.options,
            global_batch=self.global_batch, tokens_per_step=self.tokens_per_step, gpus=self.gpus,
            simulated=self.simulated,
            memory_rejected=sum(1 for e in evals if e.scenario is not None and not e.fits and not e.simulated),
            invalid=sum(1 for e in evals if e.scenario is None),
            interrupted=self.interrupted, budget_exhausted=self.budget_exhausted,
            reused=0 if self.memo is None else self.memo.hits,
            search_space={s.system: [k.key for k in (*s.structural, *s.knobs)] for s in self.spaces},
            dropped_knobs={s.system: list(s.dropped) for s in self.spaces if s.dropped},
            hbm_usable_gib=self.hbm_usable, host_usable_gib=self.host_usable,
            hbm_reserved_gib=self.hbm_reserved, host_reserved_gib=self.host_reserved, notes=list(self.notes),
        )

    def _same_batch(self, ev: Evaluation) -> bool:
        s = ev.settings
        try:
            return int(s["training.micro_batch"]) * int(s["training.grad_accum"]) * int(
                s["cluster.data_parallel"]) == self.global_batch
        except KeyError:
            return False

    def _system_memory(self, system: str, evals: list[Evaluation], ranked: list[Evaluation]) -> SystemMemory:
        mine = [e for e in evals if e.system == system and e.gpu_mem_gib is not None and e.cpu_mem_gib is not None]
        best = next((e for e in ranked if e.system == system), None)
        hbm_cap = min(self.hbm_usable, self.options.max_hbm_gib or math.inf)
        host_cap = min(self.host_usable, self.options.max_host_ram_gib or math.inf)
        gpu_ok = [e for e in mine if (e.gpu_mem_gib or 0.0) <= hbm_cap]
        cpu_ok = [e for e in mine if (e.cpu_mem_gib or 0.0) <= host_cap]
        min_host = min((e.cpu_mem_gib or 0.0 for e in gpu_ok), default=None)
        min_hbm = min((e.gpu_mem_gib or 0.0 for e in cpu_ok), default=None)
        return SystemMemory(
            system=system, best=best, candidates_checked=len(mine), fitting=sum(1 for e in mine if e.fits),
            min_host_gib=min_host, min_host_installed_gib=None if min_host is None else min_host + self.host_reserved,
            min_hbm_gib=min_hbm, min_hbm_installed_gib=None if min_hbm is None else min_hbm + self.hbm_reserved,
        )


class _MemoRun:
    """One memoised batch of simulations (:meth:`Tuner._simulate_memo`); candidates can be added while earlier
    ones run (stage 1 hands its candidates over as they are checked).

    Each candidate first looks for an earlier simulation it agrees with on every field that simulation read;
    the others wait, indexed by every known read set of their sections' classes, so that each new recorded
    run resolves its twins at once. Recorded runs go to ``executor`` ``MEMO_CHUNK`` candidates per task (a
    task's round trip costs about a tenth of a simulation), two tasks in flight per worker. A candidate waits
    while a run that may be its twin is in flight (same read set and key: its result resolves the candidate),
    and so does a candidate whose classes have no recorded read set yet while another of those classes runs
    (the first run of a system tells which fields it reads)."""

    def __init__(self, tuner: Tuner, executor: Executor | None) -> None:
        from collections import deque
        from concurrent.futures import Future

        assert tuner.memo is not None
        self.tuner = tuner
        self.memo = tuner.memo
        self.executor = executor
        self.done: set[str] = set()
        self.waiting: dict[Any, dict[Any, list[Evaluation]]] = {}
        self.twin_keys: dict[str, list[tuple[Any, Any]]] = {}  # candidate -> its (read set, key) pairs
        self.classes: dict[str, Any] = {}
        self.pending: list[Evaluation] = []
        self.plain: list[Evaluation] = []  # not eligible for the memo: simulated as they are, here
        self.todo: deque[Evaluation] = deque()
        self.flight: dict[Future[list[Any]], list[Evaluation]] = {}
        self.busy_keys: Counter[Any] = Counter()
        self.busy_classes: Counter[Any] = Counter()
        self.limit = 2 * max(1, tuner.options.jobs)

    def add(self, evs: Iterable[Evaluation]) -> None:
        from sosim.tune_memo import classes_of

        memo = self.memo
        for ev in evs:
            sc = ev.scenario
            assert sc is not None
            if not memo.eligible(sc):
                self.plain.append(ev)
                continue
            self.classes[ev.key] = classes_of(sc)
            hit = memo.lookup(sc)
            if hit is not None:  # a run of an earlier batch, or of this one already finished
                memo.hits += 1
                self.finish(ev, hit, None)
                continue
            self.pending.append(ev)
            for shape in memo.tables:
                self._index(shape, (ev,))
            self.todo.append(ev)

    def _index(self, shape: Any, evs: Iterable[Evaluation]) -> None:
        table = self.waiting.setdefault(shape, {})
        for ev in evs:
            if ev.key not in self.done and self.classes[ev.key] == shape[0]:
                assert ev.scenario is not None
                key = self.memo.key(ev.scenario, shape[1])
                table.setdefault(key, []).append(ev)
                self.twin_keys.setdefault(ev.key, []).append((shape, key))

    def finish(self, ev: Evaluation, metrics: Mapping[str, Any] | None, error: str | None) -> None:
        if ev.key in self.done:
            return
        self.done.add(ev.key)
        t = self.tuner
        t._record(ev, metrics, error)
        t.simulated += 1
        if t.bar is not None:
            t.bar.update(1)

    def store(self, ev: Evaluation, metrics: dict[str, Any], reads: Any) -> None:
        assert ev.scenario is not None
        shape, key, new = self.memo.add(ev.scenario, reads, metrics)
        self.finish(ev, metrics, None)
        if new:
            self._index(shape, self.pending)
        for twin in self.waiting.get(shape, {}).pop(key, []):
            if twin.key not in self.done:
                self.memo.hits += 1
                self.finish(twin, metrics, None)

    def _ready(self, ev: Evaluation) -> bool:
        keys = self.twin_keys.get(ev.key)
        if not keys:
            return self.busy_classes[self.classes[ev.key]] == 0
        return not any(self.busy_keys[k] for k in keys)

    def _mark(self, ev: Evaluation, n: int) -> None:
        self.busy_classes[self.classes[ev.key]] += n
        for k in self.twin_keys.get(ev.key, ()):
            self.busy_keys[k] += n

    def pump(self, block: bool) -> None:
        """Submit what can run; take in finished tasks (waiting for one when ``block``). Without an executor,
        ``block`` runs every waiting candidate here."""
        from concurrent.futures import FIRST_COMPLETED, wait

        from sosim.tune_memo import simulate_recorded

        if self.executor is None:
            while block and self.todo:
                ev = self.todo.popleft()
                if ev.key in self.done:
                    continue
                assert ev.scenario is not None
                try:
                    # Through the module's evaluator, looked up now (a test replaces it).
                    metrics, reads = simulate_recorded(ev.scenario, simulate_metrics)
                except SosimError as exc:
                    self.finish(ev, None, str(exc))
                else:
                    self.store(ev, metrics, reads)
            return
        blocked: list[Evaluation] = []
        todo = self.todo
        while todo and len(self.flight) < self.limit:
            chunk: list[Evaluation] = []
            while todo and len(chunk) < MEMO_CHUNK:
                ev = todo.popleft()
                if ev.key in self.done:
                    continue
                if self._ready(ev):
                    self._mark(ev, 1)
                    chunk.append(ev)
                else:
                    blocked.append(ev)
            if chunk:
                self.flight[self.executor.submit(simulate_recorded_batch, [e.scenario for e in chunk])] = chunk
        todo.extendleft(reversed(blocked))
        if not self.flight:
            return
        finished, _ = wait(self.flight, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for fut in sorted(finished, key=lambda f: self.flight[f][0].key):
            chunk = self.flight.pop(fut)
            for ev in chunk:
                self._mark(ev, -1)
            for ev, out in zip(chunk, fut.result()):
                if isinstance(out, str):
                    self.finish(ev, None, out)
                else:
                    self.store(ev, out[0], out[1])

    def drain(self) -> None:
        """Every candidate added, simulated or reused."""
        while self.todo or self.flight:
            self.pump(block=True)
        for ev in self.plain:
            assert ev.scenario is not None
            try:
                metrics = simulate_metrics(ev.scenario)
            except SosimError as exc:
                self.finish(ev, None, str(exc))
            else:
                self.finish(ev, metrics, None)
        self.plain = []

    def cancel(self) -> None:
        for fut in self.flight:
            fut.cancel()


def tune(base: Scenario | str | Path | Mapping[str, Any], options: TuneOptions | None = None, *,
         overrides: Sequence[str] | None = None, executor: Executor | None = None,
         evaluate: Callable[[Scenario], dict[str, Any]] | None = None, memo: bool = True) -> TuneResult:
    """Search the fastest configuration of ``base`` that fits (see the module docstring).

    ``base`` is a Scenario, a scenario YAML path or dict (``overrides`` apply as with ``load_scenario``).
    ``executor`` (any ``concurrent.futures.Executor``) evaluates large batches in parallel; by default
    ``options.jobs`` worker processes are started when ``jobs > 1``. ``memo=False`` simulates every candidate
    rather than reusing an identical earlier simulation (sosim/tune_memo.py; the same result, slower).
    """
    sc = base if isinstance(base, Scenario) else load_scenario(base, list(overrides or []))
    if isinstance(base, Scenario) and overrides:
        sc = load_scenario(base.model_dump(mode="python", exclude_unset=True), list(overrides))
    return Tuner(sc, options, evaluate=evaluate, executor=executor, memo=memo).run()




# ---------------------------------------------------------------------------------------------------- CLI

DEFAULT_OUT = "ds_config.tuned.json"


def _positive_float(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


# Sanity bounds of the search options (docs/limits.md). The largest published pretraining batches are ~16k
# sequences (60M tokens); 10M sequences leaves a wide margin while keeping the batch splits enumerable.
MAX_GLOBAL_BATCH = 10_000_000
# Simulations per search: the default is ~10k; 1e7 is a day of CPU time, past any useful search.
MAX_BUDGET = 10_000_000
MAX_JOBS_PER_CORE = 4  # as sosim sweep --workers: a simulation is CPU-bound, more processes gain nothing


def _bounded_int(limit: int, why: str) -> Callable[[str], int]:
    """argparse type: a whole number from 1 to ``limit`` (``why``: the reason for the limit, in the message)."""
    import argparse

    def parse(text: str) -> int:
        shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text):,} characters)"
        try:
            value = int(text) if len(text) <= 40 else 0
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {shown!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {shown!r}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"{value:,} is more than {limit:,} ({why}; docs/limits.md)")
        return value

    return parse


def add_tune_parser(subparsers: Any) -> None:
    """Register ``sosim tune`` on the CLI's sub-parsers."""
    from sosim.bounds import MAX_GPUS
    from sosim.dsconfig.cli import positive_int as _positive_int

    cores = os.cpu_count() or 1
    gpus_int = _bounded_int(MAX_GPUS, "ten times the largest training clusters")
    batch_int = _bounded_int(MAX_GLOBAL_BATCH, "far past any published pretraining batch")
    budget_int = _bounded_int(MAX_BUDGET, "about a day of simulations")
    jobs_int = _bounded_int(MAX_JOBS_PER_CORE * cores, f"{MAX_JOBS_PER_CORE} per core, {cores} cores here: a "
                                                       "simulation is CPU-bound")

    p = subparsers.add_parser(
        "tune", help="search the fastest configuration that fits; write it as a DeepSpeed config",
        description="Search system, knobs, checkpointing, micro-batch x accumulation at a fixed global batch and "
                    "the parallel split; rank what fits in memory; write the winner as a DeepSpeed config.")
    p.add_argument("scenario", nargs="?", help="scenario YAML file (or use --ds-config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario (or hardware.*) value before tuning; repeatable")
    g = p.add_argument_group("your own DeepSpeed config (instead of a scenario file)")
    g.add_argument("--ds-config", metavar="DS.json", help="a DeepSpeed config (JSON) to start from")
    g.add_argument("--model", metavar="CONFIG.json", help="Hugging Face config.json (or its folder) of the model")
    g.add_argument("--hardware", metavar="PROFILE", help="hardware profile name or path (see sosim profiles)")
    g.add_argument("--seq", type=_positive_int, help="training sequence length (default 2048)")
    g.add_argument("--micro-batch", type=_positive_int, help="micro-batch per GPU where the config says auto")
    g.add_argument("--grad-accum", type=_positive_int, help="gradient accumulation where the config says auto")
    g.add_argument("--precision", choices=["bf16", "fp16"], help="when the config leaves it to the HF Trainer")
    s = p.add_argument_group("search")
    s.add_argument("--gpus", type=gpus_int, help="GPUs (default: the scenario's / implied by the config)")
    s.add_argument("--global-batch", type=batch_int, metavar="B",
                   help="sequences per optimizer step, kept fixed (default: the base's micro x accum x dp)")
    s.add_argument("--objective", choices=["tokens_per_s", "time_to_tokens"], default="tokens_per_s")
    s.add_argument("--token-budget", type=_positive_float, metavar="T", help="tokens to train (time_to_tokens)")
    s.add_argument("--systems", metavar="A,B", help="systems to search (default: all)")
    s.add_argument("--implementation", choices=["ideal", "deepspeed"],
                   help="implementation of the offload systems (default: the base's)")
    s.add_argument("--budget", type=budget_int, default=TuneOptions.budget, metavar="N",
                   help=f"simulations at most (default {TuneOptions.budget})")
    s.add_argument("--jobs", type=jobs_int, default=None,
                   help="worker processes for large batches (default: CPU count, at most 8)")
    s.add_argument("--max-host-ram", type=_positive_float, metavar="GIB",
                   help="host memory per GPU the run may use (a cap below the profile's usable memory)")
    s.add_argument("--max-hbm", type=_positive_float, metavar="GIB", help="HBM per GPU the run may use")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=_positive_int, default=5, metavar="K", help="configurations shown (default 5)")
    o.add_argument("--out", metavar="DS.json", default=DEFAULT_OUT,
                   help=f"where the winner's DeepSpeed config goes (default ./{DEFAULT_OUT}; an existing file is "
                        "replaced and the output says so)")
    o.add_argument("--no-write", action="store_true", help="do not write a DeepSpeed config")
    o.add_argument("--format", choices=["table", "json"], default="table")
    o.add_argument("--progress", action=argparse_bool(), default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=run_tune)


def argparse_bool() -> Any:
    import argparse

    return argparse.BooleanOptionalAction


register_cli = add_tune_parser  # the hook sosim.cli's sub-command registry calls


def _base_from_args(args: Any) -> tuple[Scenario, dict[str, Any] | None]:
    """The scenario to tune and, for --ds-config, the user's DeepSpeed config (kept keys in the output)."""
    ds_only = {"model": args.model, "hardware": args.hardware, "seq": args.seq, "micro-batch": args.micro_batch,
               "grad-accum": args.grad_accum, "precision": args.precision}
    if args.ds_config is None:
        used = [f"--{k}" for k, v in ds_only.items() if v is not None]
        if used:
            raise ConfigError([f"{', '.join(used)}: only with --ds-config"])
        if args.scenario is None:
            raise ConfigError(["give a scenario file, or --ds-config DS.json --model CONFIG.json --hardware PROFILE"])
        return load_scenario(args.scenario, args.overrides), None
    if args.scenario is not None:
        raise ConfigError([f"{args.scenario}: give either a scenario file or --ds-config, not both"])
    from sosim import dsconfig
    from sosim.jsonio import read_json

    missing = [f"--{n}" for n in ("model", "hardware") if not getattr(args, n)]
    if missing:
        raise ConfigError([f"--ds-config needs {' and '.join(missing)}"])
    inputs = dsconfig.RunInputs(hardware=args.hardware, gpus=args.gpus, seq_len=args.seq,
                                micro_batch=args.micro_batch, grad_accum=args.grad_accum, precision=args.precision,
                                overrides=tuple(args.overrides))
    mapping = dsconfig.load_ds_mapping(args.ds_config, args.model, inputs)
    try:
        sc = load_scenario(mapping.scenario, args.overrides)
    except ConfigError as exc:
        where = f"{mapping.ds_origin} (+ {mapping.model_origin})"
        raise ConfigError([p.replace("<dict>:1", where, 1) for p in exc.problems]) from None
    base_ds = read_json(args.ds_config).data
    return sc, base_ds if isinstance(base_ds, dict) else None


def run_tune(args: Any) -> int:
    """``sosim tune``: 0 when a configuration was found, 1 when none fits, 130 when interrupted."""
    import time

    from sosim.output import print_json
    from sosim.tune_report import format_text, to_json

    if not args.no_write:
        try:
            from sosim.output import check_output_path

            check_output_path(args.out, "--out", ["json"])  # refuse an unwritable path before the search
        except ImportError:  # pragma: no cover - a build without the helper
            pass
    sc, base_ds = _base_from_args(args)
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip()) if args.systems else None
    jobs = args.jobs if args.jobs is not None else max(1, min(8, os.cpu_count() or 1))
    options = TuneOptions(
        global_batch=args.global_batch, gpus=args.gpus if args.ds_config is None else None,
        objective=args.objective, token_budget=args.token_budget, systems=systems,
        implementation=args.implementation, budget=args.budget, max_host_ram_gib=args.max_host_ram,
        max_hbm_gib=args.max_hbm, jobs=jobs, progress=args.progress)
    from sosim.workers import EXIT_TERMINATED, interrupted_exit, signals_interrupt

    start = time.perf_counter()
    with signals_interrupt() as signals:  # SIGTERM stops the search (and ends its workers) as Ctrl-C does
        try:
            result = Tuner(sc, options).run()
        except KeyboardInterrupt as exc:  # before the search had anything to show
            code, what = interrupted_exit(exc)
            print(f"sosim tune: {what}; nothing was written", file=sys.stderr)
            return code
    elapsed = time.perf_counter() - start
    written = ({"path": None, "skipped": "--no-write"} if args.no_write
               else write_ds_config(result, args.out, base_ds, args.model))
    if args.format == "json":
        print_json({"scenario": sc.name, "hardware": sc.hardware.name, **to_json(result, args.top, written, elapsed)})
    else:
        print(format_text(result, args.top, sc.name, sc.hardware.name, written, elapsed))
    if result.interrupted:
        if signals.terminated:
            print("sosim tune: terminated (SIGTERM): the best configuration found so far is shown"
                  + (f" and written to {written['path']}" if written.get("path") else ""), file=sys.stderr)
            return EXIT_TERMINATED
        return EXIT_INTERRUPTED
    return 0 if result.ranked else 1


__all__ = ["EXIT_INTERRUPTED", "Evaluation", "SystemMemory", "TuneOptions", "TuneResult", "Tuner", "add_tune_parser",
           "run_tune", "tune", "write_ds_config"]
