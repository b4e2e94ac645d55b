"""How the tuner scores, compares and reports candidates: a simulation's metrics recorded on its candidate,
the ranking order (ties broken deterministically), the diverse starting points of descent, and the
:class:`~sosim.answers.tune.result.TuneResult` of a search."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sosim.answers.tune.candidate_eval import reason_class
from sosim.answers.tune.candidates import Candidates, SystemSpace
from sosim.answers.tune.result import Evaluation, SystemMemory, TuneOptions, TuneResult
from sosim.answers.tune.space import PARALLEL_KEYS

if TYPE_CHECKING:
    from sosim.answers.tune.execute import Evaluator

# Scores are compared to this many significant digits: differences below ~0.05% are noise next to the model's
# error (docs/validation.md) and should not pull a knob away from its default.
SCORE_DIGITS = 4


class Ranking:
    """Scores and order of one search's candidates."""

    def __init__(self, options: TuneOptions, cands: Candidates, global_batch: int, tokens_per_step: int) -> None:
        self.options = options
        self.cands = cands
        self.global_batch = global_batch
        self.tokens_per_step = tokens_per_step

    @staticmethod
    def steps(options: TuneOptions, tokens_per_step: int) -> int:
        assert options.token_budget is not None
        return math.ceil(options.token_budget / tokens_per_step)

    def score(self, metrics: Mapping[str, Any]) -> float:
        if self.options.objective == "time_to_tokens":
            return -self.steps(self.options, self.tokens_per_step) * float(metrics["step_time_s"])
        return float(metrics["tokens_per_s"])

    def record(self, ev: Evaluation, metrics: Mapping[str, Any] | None, error: str | None) -> None:
        """A simulation's outcome on its candidate: memory from the simulation, the caps, the score."""
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
        fits, reason, klass = self.cands.caps(ev.gpu_mem_gib, ev.cpu_mem_gib, fits, reason, klass)
        ev.fits, ev.reason, ev.reason_key = fits, reason, klass
        step = float(metrics["step_time_s"])
        ev.score = self.score(metrics) if fits and math.isfinite(step) and step > 0 else None

    def key(self, ev: Evaluation) -> tuple[float, int, int, str]:
        """Best first. Scores equal to ``SCORE_DIGITS`` significant digits (a knob worth less than ~0.05%
        here) count as a tie, which goes to the knobs' preferred values, then to the configuration closest to
        the defaults, then to the settings' order."""
        space = self.cands.space_of(ev.system)
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

    def best(self, evs: Iterable[Evaluation]) -> Evaluation | None:
        ranked = [e for e in evs if e.ranked]
        return min(ranked, key=self.key) if ranked else None

    def diverse(self, space: SystemSpace, evs: list[Evaluation], n: int) -> list[Evaluation]:
        """The ``n`` starting points of coordinate descent: the best point of each structural class (weight
        placement, checkpointing, parallel split...; the micro-batch left out) in rank order, then the next
        best points, so that the beam covers different basins rather than one class at several micro-batches."""
        ranked = sorted((e for e in evs if e.ranked), key=self.key)
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

    # ---- the answer
    def result(self, base: Evaluation | None, ev: Evaluator, notes: list[str], gpus: int, reused: int) -> TuneResult:
        cands = self.cands
        evals = [cands.evals[k] for k in cands.order]
        in_batch = [e for e in evals if e.ranked and e.in_space and self._same_batch(e)]
        ranked = sorted(in_batch, key=self.key)
        systems = [self._system_memory(s.system, evals, ranked) for s in cands.spaces]
        systems += [SystemMemory(s, None, 0, 0, None, None, None, None, unavailable=r)
                    for s, r in cands.unavailable.items()]
        hbm_reserved, host_reserved = self._reserved()
        return TuneResult(
            base=base, ranked=ranked, evaluations=evals, systems=systems, options=self.options,
            global_batch=self.global_batch, tokens_per_step=self.tokens_per_step, gpus=gpus,
            simulated=ev.simulated,
            memory_rejected=sum(1 for e in evals if e.scenario is not None and not e.fits and not e.simulated),
            invalid=sum(1 for e in evals if e.scenario is None),
            interrupted=ev.interrupted, budget_exhausted=ev.budget_exhausted, reused=reused,
            search_space={s.system: [k.key for k in (*s.structural, *s.knobs)] for s in cands.spaces},
            dropped_knobs={s.system: list(s.dropped) for s in cands.spaces if s.dropped},
            hbm_usable_gib=self._usable()[0], host_usable_gib=self._usable()[1],
            hbm_reserved_gib=hbm_reserved, host_reserved_gib=host_reserved, notes=list(notes),
        )

    def _reserved(self) -> tuple[float, float]:
        hw = self.cands.base.hardware
        return float(hw.gpu.reserved_gib), float(hw.cpu.reserved_gib)

    def _usable(self) -> tuple[float, float]:
        hw = self.cands.base.hardware
        hbm_reserved, host_reserved = self._reserved()
        return float(hw.gpu.hbm_gib) - hbm_reserved, float(hw.cpu.mem_gib) - host_reserved

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
        hbm_usable, host_usable = self._usable()
        hbm_reserved, host_reserved = self._reserved()
        hbm_cap = min(hbm_usable, self.options.max_hbm_gib or math.inf)
        host_cap = min(host_usable, self.options.max_host_ram_gib or math.inf)
        gpu_ok = [e for e in mine if (e.gpu_mem_gib or 0.0) <= hbm_cap]
        cpu_ok = [e for e in mine if (e.cpu_mem_gib or 0.0) <= host_cap]
        min_host = min((e.cpu_mem_gib or 0.0 for e in gpu_ok), default=None)
        min_hbm = min((e.gpu_mem_gib or 0.0 for e in cpu_ok), default=None)
        return SystemMemory(
            system=system, best=best, candidates_checked=len(mine), fitting=sum(1 for e in mine if e.fits),
            min_host_gib=min_host, min_host_installed_gib=None if min_host is None else min_host + host_reserved,
            min_hbm_gib=min_hbm, min_hbm_installed_gib=None if min_hbm is None else min_hbm + hbm_reserved,
        )


__all__ = ["SCORE_DIGITS", "Ranking"]
