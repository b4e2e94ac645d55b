"""Evaluation of the tuner's candidates: which fitting candidates are simulated (within the budget), each
distinct simulation once (its key: sosim/answers/tune/key.py), here or on worker processes.

A batch (:class:`Batch`) takes candidates in generation order. A candidate whose simulation key has a result
takes it; one whose key is already waiting or running joins that simulation; the others are queued. Queued
simulations run here, or go to an executor ``CHUNK`` per task (a round trip costs about a tenth of a
simulation), at most two tasks per worker in flight. Stage 1 hands its candidates to a batch while it is still
checking the rest (:meth:`Evaluator.stream_start`), so the workers start early.

The budget counts candidates evaluated, whether simulated or reused: the same candidates are evaluated with or
without reuse (``reuse=False`` simulates every one of them: the same answer, slower).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future
from typing import Any

from sosim.answers.tune import candidate_eval
from sosim.answers.tune.key import Key, Reuse
from sosim.answers.tune.result import Evaluation, TuneOptions
from sosim.inputs.errors import SosimError
from sosim.run.simulate import EngineRuns

# Batches at least this large go to the workers (a pool round trip costs ~ms per chunk).
PARALLEL_MIN_BATCH = 24
# Candidates per worker task (each costs a few ms; a round trip ~1 ms).
CHUNK = 8

Metrics = dict[str, Any]
Record = Callable[[Evaluation, Mapping[str, Any] | None, "str | None"], None]


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during an evaluation: the search stops and keeps what it has."""


class BudgetExhausted(Exception):
    """The budget of evaluations is spent."""


class Evaluator:
    """Evaluates candidates for one search. ``evaluate`` maps a scenario to its metrics (None: ``simulate``,
    which may run on worker processes and whose results are reused by simulation key)."""

    def __init__(self, options: TuneOptions, record: Record, *, evaluate: Callable[[Any], Metrics] | None = None,
                 executor: Executor | None = None, reuse: Reuse[Metrics] | None = None) -> None:
        self.options = options
        self.record = record
        self.evaluate = evaluate
        self.parallel_ok = evaluate is None  # a custom evaluator may not pickle: keep it in this process
        self.executor = executor
        self.own_executor = False
        self.reuse = reuse if evaluate is None else None  # only simulate() itself is known to be pure
        # With reuse, candidates whose node plans are equal also share one engine run (here; each worker
        # process keeps its own: candidate_eval.WORKER_RUNS).
        self.runs: EngineRuns | None = EngineRuns() if self.reuse is not None else None
        self.simulated = 0
        self.budget_exhausted = False
        self.interrupted = False
        self.bar: Any = None
        self._stream_seen: set[str] = set()
        self._stream_room = 0

    def run_one(self, sc: Any) -> Metrics:
        # Looked up at call time, so a test can replace the module's evaluator.
        if self.evaluate is not None:
            return self.evaluate(sc)
        if self.runs is None:
            return candidate_eval.simulate_metrics(sc)
        return candidate_eval.simulate_metrics(sc, self.runs)

    def _select(self, evs: Iterable[Evaluation], seen: set[str], room: int) -> list[Evaluation]:
        """The fitting, not yet simulated candidates of ``evs``, first of their settings, within ``room``."""
        todo = []
        for e in evs:
            if not (e.fits and e.metrics is None and e.scenario is not None) or e.key in seen:
                continue
            seen.add(e.key)
            if len(seen) > room:
                self.budget_exhausted = True
                continue
            todo.append(e)
        if todo and self.bar is not None:
            self.bar.total = (self.bar.total or 0) + len(todo)
            self.bar.refresh()
        return todo

    def simulate(self, evs: Iterable[Evaluation]) -> None:
        """Evaluate every fitting, not yet simulated candidate of ``evs`` (within the budget)."""
        todo = self._select(evs, set(), self.options.budget - self.simulated)
        if todo:
            batch = Batch(self, self.executor_for(len(todo)))
            try:
                batch.add(todo)
                batch.drain()
            except KeyboardInterrupt:
                self.interrupted = True
                raise Interrupted from None
            finally:
                batch.cancel()
        if self.budget_exhausted:
            raise BudgetExhausted

    # ---- stage 1 streamed: candidates evaluated while the later ones are still being checked
    def stream_start(self) -> Batch | None:
        """A batch that takes stage 1's candidates as they are checked, or None where nothing would overlap
        (no workers)."""
        if not self.parallel_ok or (self.executor is None and self.options.jobs <= 1):
            return None
        self._stream_seen = set()
        self._stream_room = self.options.budget - self.simulated
        return Batch(self, None)  # the workers start once PARALLEL_MIN_BATCH candidates wait

    def stream_add(self, batch: Batch, evs: Iterable[Evaluation]) -> None:
        """Hand ``evs`` (the next candidates of stage 1, in its order) to ``batch``: the selection
        :meth:`simulate` makes over the whole list, made one candidate at a time in the same order."""
        todo = self._select(evs, self._stream_seen, self._stream_room)
        if not todo:
            return
        batch.add(todo)
        if batch.executor is None and len(batch.todo) >= PARALLEL_MIN_BATCH:
            batch.executor = self.executor_for(PARALLEL_MIN_BATCH)
        if batch.executor is not None:
            batch.pump(block=False)

    def stream_finish(self, batch: Batch, stage1: list[Evaluation]) -> None:
        """The rest of stage 1 (what was handed over already is skipped), then every result."""
        self.stream_add(batch, stage1)
        batch.drain()
        if self.budget_exhausted:
            raise BudgetExhausted

    # ---- workers
    def executor_for(self, n: int) -> Executor | None:
        """The executor for a batch of ``n`` simulations (None: run them here)."""
        if n < PARALLEL_MIN_BATCH or not self.parallel_ok:
            return None
        if self.executor is not None:
            return self.executor
        if self.options.jobs <= 1:
            return None
        from sosim.answers.workers import WorkerPool

        # Workers ignore Ctrl-C, die with this process, and an aborting shutdown (wait=False,
        # cancel_futures=True, as shutdown() does when interrupted) ends them by PID (sosim/answers/workers.py).
        self.executor = WorkerPool(self.options.jobs)
        self.own_executor = True
        return self.executor

    def shutdown(self) -> None:
        if self.own_executor and self.executor is not None:
            self.executor.shutdown(wait=not self.interrupted, cancel_futures=True)


class Batch:
    """Candidates being evaluated, each distinct simulation once (see the module docstring)."""

    def __init__(self, evaluator: Evaluator, executor: Executor | None) -> None:
        self.ev = evaluator
        self.reuse = evaluator.reuse
        self.executor = executor
        self.todo: deque[tuple[Key, Evaluation]] = deque()
        self.twins: dict[Key, list[Evaluation]] = {}  # key -> candidates waiting on its simulation
        self.flight: dict[Future[list[Any]], list[tuple[Key, Evaluation]]] = {}
        self.limit = 2 * max(1, evaluator.options.jobs)

    def _key(self, ev: Evaluation) -> Key:
        assert ev.scenario is not None
        if self.reuse is None or not self.reuse.eligible(ev.scenario):
            return ("candidate", ev.key)  # no reuse: the candidate is its own simulation
        return self.reuse.key(ev.scenario)

    def add(self, evs: Iterable[Evaluation]) -> None:
        for ev in evs:
            key = self._key(ev)
            hit = None if self.reuse is None else self.reuse.get(key)
            if hit is not None:
                self._finish(ev, hit, None)
            elif key in self.twins:
                self.twins[key].append(ev)
                if self.reuse is not None:
                    self.reuse.hits += 1
            else:
                self.twins[key] = [ev]
                self.todo.append((key, ev))

    def _finish(self, ev: Evaluation, metrics: Mapping[str, Any] | None, error: str | None) -> None:
        self.ev.record(ev, metrics, error)
        self.ev.simulated += 1
        if self.ev.bar is not None:
            self.ev.bar.update(1)

    def _resolve(self, key: Key, metrics: Metrics | None, error: str | None) -> None:
        """One simulation's result, for every candidate waiting on it (a pure function: the same error too)."""
        if metrics is not None and self.reuse is not None:
            self.reuse.put(key, metrics)
        for ev in self.twins.pop(key, []):
            self._finish(ev, metrics, error)

    def pump(self, block: bool) -> None:
        """Submit what can run; take in finished tasks (waiting for one when ``block``). Without an executor,
        ``block`` runs every queued simulation here."""
        if self.executor is None:
            while block and self.todo:
                key, ev = self.todo.popleft()
                try:
                    metrics = self.ev.run_one(ev.scenario)
                except SosimError as exc:
                    self._resolve(key, None, str(exc))
                else:
                    self._resolve(key, dict(metrics), None)
            return
        self._submit()
        if self.flight:
            self._collect(block)

    def _submit(self) -> None:
        assert self.executor is not None
        while self.todo and len(self.flight) < self.limit:
            chunk = [self.todo.popleft() for _ in range(min(CHUNK, len(self.todo)))]
            fut = self.executor.submit(candidate_eval.simulate_batch, [ev.scenario for _, ev in chunk],
                                       self.reuse is not None)
            self.flight[fut] = chunk

    def _collect(self, block: bool) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        finished, _ = wait(self.flight, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        # Decisions never depend on completion order: record finished tasks in generation order.
        for fut in sorted(finished, key=lambda f: self.flight[f][0][1].key):
            chunk = self.flight.pop(fut)
            for (key, _), out in zip(chunk, fut.result()):
                if isinstance(out, str):
                    self._resolve(key, None, out)
                else:
                    self._resolve(key, out, None)

    def drain(self) -> None:
        """Every candidate added, evaluated."""
        while self.todo or self.flight:
            self.pump(block=True)

    def cancel(self) -> None:
        for fut in self.flight:
            fut.cancel()


__all__ = ["CHUNK", "PARALLEL_MIN_BATCH", "Batch", "BudgetExhausted", "Evaluator", "Interrupted"]
