"""The tuner's search strategy: which candidates are generated, in which order, and which one wins.

1. *Structure first.* Stage 1 crosses the structural choices (system, checkpointing, micro-batch, parallel
   split, weight placement) with every other knob at its default; of the micro-batches that fit, only the
   ``micro_batches_kept`` largest are kept (at a fixed global batch a smaller micro-batch only adds
   accumulation steps of smaller kernels). A point that does not fit at its defaults is rescued by other
   values of its memory knobs, fewest changes first. A system whose whole grid is small
   (``exhaustive_limit``) is searched exhaustively instead.
2. *Knobs second.* Coordinate descent over the remaining knobs from the ``beam`` most diverse best structural
   points of each system (all values of one knob at a time, repeated until nothing changes).
3. *Refine.* Numeric knobs are refined between the neighbours of their best coarse value.

Candidates are built and memory-checked by :mod:`sosim.answers.tune.candidates`, evaluated by
:mod:`sosim.answers.tune.execute`, and ranked by :mod:`sosim.answers.tune.rank`. Order is deterministic: candidates are
generated in table order, ties are broken by the candidate's settings, and parallel results are recorded in
generation order.
"""

from __future__ import annotations

import gc
import itertools
import math
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from sosim.answers.tune.candidate_eval import canonical_key, divisors, get_dotted, memory_check
from sosim.answers.tune.candidates import Candidates, SystemSpace
from sosim.answers.tune.execute import BudgetExhausted, Evaluator, Interrupted, Metrics
from sosim.answers.tune.key import Reuse
from sosim.answers.tune.rank import Ranking
from sosim.answers.tune.result import Evaluation, Settings, TuneOptions, TuneResult
from sosim.answers.tune.space import BATCH_KEYS, PARALLEL_KEYS, Knob, refine_values
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError
from sosim.run.loader import load_scenario

# Memory checks (~0.3 ms each, no simulation) spent looking for a fitting variant of one structural point.
RESCUE_CHECKS = 80


@dataclass
class Chain:
    """One coordinate-descent run: its current best candidate and the values tried per knob."""

    space: SystemSpace
    current: Evaluation
    tried: dict[str, list[Any]] = field(default_factory=dict)


def with_gpus(base: Scenario, gpus: int | None) -> Scenario:
    """``base`` on ``gpus`` GPUs, all data parallel (the base itself when that is its own count)."""
    if gpus is None or gpus == base.cluster.gpus:
        return base
    data = base.model_dump(mode="python", exclude_unset=True)
    data["cluster"] = {**data.get("cluster", {}), "gpus": gpus, "data_parallel": None, "sequence_parallel": 1}
    return load_scenario(data)


class Tuner:
    """One search. ``evaluate`` maps a scenario to its metrics (``simulate`` by default); ``memo=False``
    evaluates every candidate afresh rather than reusing an identical simulation (the same answer, slower)."""

    def __init__(self, base: Scenario, options: TuneOptions | None = None, *,
                 evaluate: Callable[[Scenario], Metrics] | None = None,
                 executor: Executor | None = None, memo: bool = True) -> None:
        self.options = options or TuneOptions()
        self.options.check()
        base = with_gpus(base, self.options.gpus)
        self.base_sc = base
        t, c = base.training, base.cluster
        self.gpus = c.gpus
        self.global_batch = self.options.global_batch or t.micro_batch * t.grad_accum * c.dp
        self.seq_len = t.seq_len
        self.splits = self._parallel_splits(base.model.heads)
        if not self.splits:
            raise ConfigError([f"global batch {self.global_batch}: no split over {self.gpus} GPU(s) works: "
                               "micro-batch x accumulation x data-parallel ranks must equal it (and Ulysses "
                               "sequence parallelism must divide the heads and the sequence)"])
        self.cands = Candidates(base, self.options, reuse=memo)
        self.rank = Ranking(self.options, self.cands, self.global_batch, self.global_batch * self.seq_len)
        self.memo: Reuse[Metrics] | None = Reuse(base) if memo and evaluate is None else None
        self.eval = Evaluator(self.options, self.rank.record, evaluate=evaluate, executor=executor, reuse=self.memo)
        self.notes: list[str] = []
        self.base_eval: Evaluation | None = None

    @property
    def spaces(self) -> list[SystemSpace]:
        return self.cands.spaces

    def _parallel_splits(self, heads: int) -> list[tuple[int, int]]:
        """(data_parallel, sequence_parallel) pairs: sp divides the GPUs, the heads and the sequence."""
        out = []
        for sp in divisors(self.gpus):
            dp = self.gpus // sp
            if heads % sp or self.seq_len % sp or self.global_batch % dp:
                continue
            out.append((dp, sp))
        return out

    def _batch_splits(self, dp: int) -> list[tuple[int, int]]:
        per_rank = self.global_batch // dp
        return [(mb, per_rank // mb) for mb in sorted(divisors(per_rank), reverse=True)]

    # ---- the run
    def run(self) -> TuneResult:
        o = self.options
        from tqdm import tqdm

        self.eval.bar = tqdm(total=0, unit="cfg", desc="tune", file=sys.stderr, dynamic_ncols=True,
                             disable=None if o.progress is None else not o.progress)
        # A search allocates tens of thousands of candidates (scenarios, evaluations) that live until it ends:
        # the cyclic garbage collector would walk them again and again (~25% of the checks' time). Paused for
        # the search, as simulate() pauses it, and restored after.
        paused = gc.isenabled()
        gc.disable()
        try:
            self._search()
        except Interrupted:
            self.notes.append("interrupted (Ctrl-C): the best configuration found so far is shown")
        except BudgetExhausted:
            self.notes.append(f"search budget of {o.budget} simulations reached: the search stopped early "
                              "(raise --budget for a fuller search)")
        finally:
            if paused:
                gc.enable()
            self.eval.bar.close()
            self.eval.shutdown()
        return self.rank.result(self.base_eval, self.eval, self.notes, self.gpus,
                                reused=0 if self.memo is None else self.memo.hits)

    def _search(self) -> None:
        base = self._base_evaluation()
        self.base_eval = base
        self.eval.simulate([base])
        starts, exhaustive = self._stage1()
        chains = self._chains(starts, exhaustive)
        self._descend([c for c in chains if c.space.system not in exhaustive])
        self._refine(chains)

    def _base_evaluation(self) -> Evaluation:
        sc = self.base_sc
        space = next((s for s in self.spaces if s.system == sc.schedule.system
                      and s.implementation == getattr(sc.schedule, "implementation", None)), None)
        settings = {k: get_dotted(sc, k) for k in (*BATCH_KEYS, *PARALLEL_KEYS)}
        settings["cluster.data_parallel"] = sc.cluster.dp
        if space is not None:
            for k in (*space.structural, *space.knobs):
                if k.applies(sc.cluster.dp):
                    settings[k.key] = get_dotted(sc, k.key)
            ev = self.cands.check(space, settings)
        else:
            key = canonical_key(sc.schedule.system, settings)
            ev = Evaluation(system=sc.schedule.system, settings=settings, key=key, scenario=sc, in_space=False)
            self.cands.set_memory(ev, memory_check(sc))
            self.cands.add(ev)
        ev.is_base = True
        return ev

    # ---- stage 1
    def _rescue(self, space: SystemSpace, point: Settings) -> Evaluation | None:
        """A fitting variant of a point that does not fit at its defaults: other values of the knobs that
        change memory, fewest changes first, in table order (at most ``RESCUE_CHECKS`` memory checks)."""
        knobs = [k for k in space.knobs_at(point) if k.memory]
        checks = 0
        for n_changes in range(1, len(knobs) + 1):
            for subset in itertools.combinations(knobs, n_changes):
                grids = [[v for v in k.values if v != point.get(k.key)] for k in subset]
                for combo in itertools.product(*grids):
                    ev = self.cands.check(space, {**point, **{k.key: v for k, v in zip(subset, combo)}})
                    checks += 1
                    if ev.fits:
                        return ev
                    if checks >= RESCUE_CHECKS:
                        return None
        return None

    def _structural_points(self, space: SystemSpace) -> list[Evaluation]:
        """Every structural combination with its largest fitting micro-batches, knobs at their defaults (or
        at the nearest values that fit where the defaults do not)."""
        out: list[Evaluation] = []
        for dp, sp in self.splits:
            struct = [k for k in space.structural if k.applies(dp)]
            grids = [[(k.key, v) for v in k.values_for(dp)] for k in struct]
            for combo in itertools.product(*grids):
                settings: Settings = {"cluster.data_parallel": dp, "cluster.sequence_parallel": sp, **dict(combo)}
                out.extend(self._fitting_micro_batches(space, settings, dp))
        return out

    def _fitting_micro_batches(self, space: SystemSpace, settings: Settings, dp: int) -> list[Evaluation]:
        """The ``micro_batches_kept`` largest micro-batches of a structural point that fit (or are rescued)."""
        out: list[Evaluation] = []
        for mb, ga in self._batch_splits(dp):
            point = space.with_defaults({**settings, "training.micro_batch": mb, "training.grad_accum": ga})
            ev: Evaluation | None = self.cands.check(space, point)
            if ev is not None and not ev.fits:
                ev = self._rescue(space, point)
            if ev is not None and ev.fits:
                out.append(ev)
                if len(out) >= self.options.micro_batches_kept:
                    break
        return out

    def _exhaustive(self, space: SystemSpace, points: list[Settings],
                    sink: Callable[[list[Evaluation]], None] | None = None) -> list[Evaluation]:
        """Every knob combination of every structural point (each point's candidates also handed to ``sink``
        as soon as they are checked)."""
        evs = []
        for point in points:
            knobs = space.knobs_at(point)
            mine = [self.cands.check(space, {**point, **dict(combo)})
                    for combo in itertools.product(*[[(k.key, v) for v in k.values] for k in knobs])]
            evs.extend(mine)
            if sink is not None:
                sink(mine)
        return evs

    def _stage1(self) -> tuple[dict[str, list[Evaluation]], dict[str, list[Evaluation]]]:
        """Stage 1; returns the structural points of the staged systems and the exhaustive systems' grids."""
        starts: dict[str, list[Evaluation]] = {}
        exhaustive: dict[str, list[Evaluation]] = {}
        # With workers, the exhaustive grids' candidates go to them as they are checked (the same selection and
        # results as one batch after all checks: Evaluator.stream_add).
        stream = self.eval.stream_start()
        sink = None if stream is None else (lambda evs: self.eval.stream_add(stream, evs))
        try:
            for space in self.spaces:
                points = self._structural_points(space)
                size = len(points) * math.prod(len(k.values) for k in space.knobs)
                if size <= self.options.exhaustive_limit:
                    knob_keys = {k.key for k in space.knobs}
                    structure = [{k: v for k, v in p.settings.items() if k not in knob_keys} for p in points]
                    exhaustive[space.system] = self._exhaustive(space, structure, sink)
                else:
                    starts[space.system] = points
            stage1 = [e for evs in (*exhaustive.values(), *starts.values()) for e in evs]
            if stream is None:
                self.eval.simulate(stage1)
            else:
                self.eval.stream_finish(stream, stage1)
        except KeyboardInterrupt:
            self.eval.interrupted = True
            raise Interrupted from None
        finally:
            if stream is not None:
                stream.cancel()
        return starts, exhaustive

    # ---- stages 2 and 3
    def _chains(self, starts: dict[str, list[Evaluation]], exhaustive: dict[str, list[Evaluation]]) -> list[Chain]:
        """Stage 2 starts: the best of each exhaustive grid, the ``beam`` most diverse structural points else."""
        chains: list[Chain] = []
        for space in self.spaces:
            if space.system in exhaustive:
                best = self.rank.best(exhaustive[space.system])
                if best is not None:
                    chains.append(Chain(space, best, {k.key: list(k.values) for k in space.knobs}))
                continue
            for ev in self.rank.diverse(space, starts.get(space.system, []), self.options.beam):
                chains.append(Chain(space, ev))
        return chains

    def _step(self, space: SystemSpace, settings: Settings, knob: Knob, value: Any) -> Evaluation:
        """One descent candidate: ``knob`` set to ``value``. A memory knob's value that does not fit at this
        micro-batch is tried at the next smaller micro-batches (more accumulation steps, same global batch):
        the trade between activation memory and, say, optimizer state kept in HBM is a move of its own, which
        one knob at a time would never make."""
        ev = self.cands.check(space, {**settings, knob.key: value})
        if ev.fits or not knob.memory or ev.scenario is None:
            return ev
        dp, mb = int(settings["cluster.data_parallel"]), int(settings["training.micro_batch"])
        for smaller, ga in self._batch_splits(dp):
            if smaller >= mb:
                continue
            trial = self.cands.check(space, {**settings, knob.key: value, "training.micro_batch": smaller,
                                             "training.grad_accum": ga})
            if trial.fits:
                return trial
        return ev

    def _descend(self, descend: list[Chain]) -> None:
        """Stage 2: coordinate descent from the best structural points of each staged system."""
        for _ in range(self.options.max_passes):
            if not self._descend_pass(descend):
                break

    def _descend_pass(self, descend: list[Chain]) -> bool:
        """One pass over the knobs (all chains' i-th knob in one batch); True when a chain moved."""
        changed = False
        n_knobs = max((len(c.space.knobs) for c in descend), default=0)
        for i in range(n_knobs):
            batch = [b for chain in descend if (b := self._knob_batch(chain, i)) is not None]
            self.eval.simulate([e for _, evs in batch for e in evs])
            for chain, evs in batch:
                best = self.rank.best([chain.current, *evs])
                if best is not None and best.key != chain.current.key:
                    chain.current = best
                    changed = True
        return changed

    def _knob_batch(self, chain: Chain, i: int) -> tuple[Chain, list[Evaluation]] | None:
        """Every value of the chain's i-th knob from its current point (None: no such knob here)."""
        if i >= len(chain.space.knobs):
            return None
        knob = chain.space.knobs[i]
        if knob not in chain.space.knobs_at(chain.current.settings):
            return None
        values = list(knob.values)
        tried = chain.tried.setdefault(knob.key, [])
        for v in values:
            if v not in tried:
                tried.append(v)
        return chain, [self._step(chain.space, chain.current.settings, knob, v) for v in values]

    def _refine(self, chains: list[Chain]) -> None:
        """Stage 3: refine numeric knobs between the neighbours of their best value."""
        for _ in range(self.options.refine_rounds):
            batch = [b for chain in chains for b in self._refine_batch(chain)]
            if not batch:
                break
            self.eval.simulate([e for _, evs in batch for e in evs])
            for chain, evs in batch:
                best = self.rank.best([chain.current, *evs])
                if best is not None:
                    chain.current = best

    def _refine_batch(self, chain: Chain) -> list[tuple[Chain, list[Evaluation]]]:
        out = []
        for knob in chain.space.knobs:
            if knob.refine is None or knob not in chain.space.knobs_at(chain.current.settings):
                continue
            grid = chain.tried.setdefault(knob.key, list(knob.values))
            new = refine_values(knob, grid, chain.current.settings.get(knob.key))
            grid.extend(new)
            if new:
                out.append((chain, [self._step(chain.space, chain.current.settings, knob, v) for v in new]))
        return out


__all__ = ["RESCUE_CHECKS", "Chain", "Tuner", "with_gpus"]
