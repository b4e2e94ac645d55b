"""The engine's timeline without SimPy, where that is provably the same timeline (bit for bit).

SimPy (:mod:`sosim.engine`) is the engine of record. Its only dynamic behaviour is contention between the two
directions of a host link: a copy that *starts* while the opposite direction of the same link is busy runs
at ``plan.duplex_factors[direction]`` of its speed. Everything else is list scheduling: an op starts when its
resource has finished the previous op and all its dependencies have ended (:func:`sosim.plan.list_schedule`),
and SimPy's clock computes exactly the same floats (``start = max(ends)``, ``end = start + duration``).

So :func:`timeline` list-schedules the plan, then asks whether contention could have changed anything:

* no link direction is slowed by the other (every duplex factor is 1, or the plan copies one way only):
  the list schedule *is* the engine's timeline;
* otherwise, if no copy of positive length overlaps, even at a single instant (closed intervals), a copy
  of the opposite direction on the same link instance, no copy ever starts while the other direction is
  busy, and the list schedule is again the engine's timeline. Why: the two runs agree up to the first
  slowed copy; that copy starts, at the same time in both, while an opposite copy is running, and their
  intervals overlap in the list schedule, which the check rejects. Ties (one copy starting exactly as the
  other ends) are rejected too, because which of the two SimPy processes first is an event-order detail;
* otherwise the plan goes to SimPy.

``tests/test_fastpath.py`` checks the identity over every shipped scenario and a hypothesis sample.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable
from typing import Any

import numpy as np

from sosim.engine import run_plan
from sosim.plan import Plan, Resource, ResourceKind

# Link directions that slow each other (the engine's rule).
_OPPOSITE = {ResourceKind.H2D: ResourceKind.D2H, ResourceKind.D2H: ResourceKind.H2D}


def list_times(plan: Plan) -> tuple[list[float], list[float]]:
    """Start and end of every op by list scheduling, ops in id order (a topological order).

    The same arithmetic as :func:`sosim.plan.list_schedule` (which stays the readable oracle), with the
    per-op work cut to a few list reads: this is the hot loop of a search.
    """
    ops = plan.ops
    n = len(ops)
    start = [0.0] * n
    end = [0.0] * n
    # When each resource is free, by slot. Resources are looked up by object identity first (equal resources
    # may be distinct objects, so a miss falls back to equality): hashing a Resource runs Python code, an
    # id() does not, and every op is alive for the whole loop, so no id is reused.
    free: list[float] = []
    slot_by_id: dict[int, int] = {}
    slot_by_resource: dict[Resource, int] = {}
    for i, op in enumerate(ops):
        res = op.resource
        k = slot_by_id.get(id(res))
        if k is None:
            k = slot_by_resource.setdefault(res, len(slot_by_resource))
            slot_by_id[id(res)] = k
            if k == len(free):
                free.append(0.0)
        t = free[k]
        for d in op.deps:
            e = end[d]
            if e > t:
                t = e
        start[i] = t
        t += op.duration_s
        end[i] = t
        free[k] = t
    return start, end


def duplex_may_bite(plan: Plan) -> bool:
    """Whether a link direction is slowed by the other at all (a factor below 1 on a direction the plan uses
    while the plan also uses its opposite)."""
    slowed = {k for k, f in plan.duplex_factors.items() if f < 1.0}
    if not slowed:
        return False
    kinds = {op.resource.kind for op in plan.ops}
    return any(k in kinds and _OPPOSITE.get(k) in kinds for k in slowed)


def opposite_copies_touch(plan: Plan, start: list[float], end: list[float]) -> bool:
    """Whether a positive-length copy overlaps, or touches, a positive-length copy of the opposite direction
    on the same link instance (closed intervals), in the given timeline."""
    by_link: dict[tuple[int, ResourceKind], list[tuple[float, float]]] = {}
    for op in plan.ops:
        kind = op.resource.kind
        if kind in _OPPOSITE and op.duration_s > 0.0:
            by_link.setdefault((op.resource.instance, kind), []).append((start[op.id], end[op.id]))
    for (instance, kind), spans in by_link.items():
        if kind is not ResourceKind.H2D:
            continue
        other = by_link.get((instance, ResourceKind.D2H))
        if other and _touch(spans, other):
            return True
    return False


def _touch(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Whether an interval of ``a`` meets one of ``b``; each list holds one serial resource's intervals, so
    it is already sorted and disjoint (a sweep over both)."""
    i = j = 0
    while i < len(a) and j < len(b):
        (s1, e1), (s2, e2) = a[i], b[j]
        if s1 <= e2 and s2 <= e1:
            return True
        if e1 < e2:
            i += 1
        else:
            j += 1
    return False


def timeline(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The engine's (start_s, end_s) arrays for ``plan``: from list scheduling where that is provably the same
    timeline, else from SimPy (:func:`sosim.engine.run_plan`)."""
    start, end = list_times(plan)
    if duplex_may_bite(plan) and opposite_copies_touch(plan, start, end):
        return run_plan(plan)
    return np.array(start), np.array(end)


# --- the engine's run under shared-resource contention, without SimPy -------------------------------------------
# SimPy's event priorities (simpy.events.URGENT / NORMAL): process start-up events go first at equal times.
_URGENT, _NORMAL = 0, 1


class _Event:
    """What the engine's fluid model needs of a SimPy event: callbacks, run once when it is processed."""

    __slots__ = ("_loop", "callbacks")

    def __init__(self, loop: _Loop) -> None:
        self.callbacks: list[Callable[[_Event], None]] | None = []
        self._loop = loop

    def succeed(self) -> None:
        self._loop.push(self._loop.now, self)


class _Loop:
    """A SimPy environment reduced to what the engine uses: a clock and a queue ordered like SimPy's
    (time, priority, insertion order); it hands the engine's fluid model ``now``, ``timeout`` and ``event``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queue: list[tuple[float, int, int, int | _Event]] = []
        self._eid = 0

    def push(self, at: float, what: int | _Event, priority: int = _NORMAL) -> None:
        heapq.heappush(self.queue, (at, priority, self._eid, what))
        self._eid += 1

    def timeout(self, delay: float) -> _Event:
        ev = _Event(self)
        self.push(self.now + delay, ev)  # SimPy: schedule(event, NORMAL, delay) at now + delay
        return ev

    def event(self) -> _Event:
        return _Event(self)


def replay_engine(plan: Plan, active: Any, fluid_factory: Callable[[Any, Any], Any]) -> tuple[
        list[float], list[float], dict[int, float]]:
    """The SimPy engine's run of ``plan`` under the (effective) contention ``active``, event for event.

    The engine's workers (one per serial resource: wait for each dependency that is not yet processed, start,
    wait for a timeout or for the fluid model, end, trigger the op's event) are replayed as state machines on
    :class:`_Loop`, which orders events exactly as SimPy does (time, then priority, then the order in which
    they were scheduled); the engine's own fluid model (``fluid_factory(loop, active)``, the engine's
    ``_Fluid``) runs unchanged on it, so every rate and every float is computed by the same code in the same
    order. The only SimPy event left out is a process's termination, which nothing waits for. Returns start
    and end of every op and the fluid model's stretch by shared resource index.
    """
    loop = _Loop()
    fluid = fluid_factory(loop, active)
    uses = active.uses
    ops = plan.ops
    n = len(ops)
    start = [0.0] * n
    end = [0.0] * n
    processed = [False] * n  # op i's completion event has been processed (its waiters resumed)
    waiters: list[list[int]] = [[] for _ in range(n)]  # workers waiting on op i, in the order they began to
    queues = list(plan.ops_by_resource().values())  # the engine's worker order (its env.process order)
    pos = [0] * len(queues)  # the op each worker is at
    dep_at = [0] * len(queues)  # the next dependency it checks
    busy = [False] * len(queues)  # it waits for its op's timeout or fluid completion
    push = loop.push

    def resume(w: int) -> None:
        q = queues[w]
        now = loop.now
        while pos[w] < len(q):
            i = q[pos[w]]
            if not busy[w]:
                deps = ops[i].deps
                k = dep_at[w]
                while k < len(deps):
                    d = deps[k]
                    k += 1
                    if not processed[d]:
                        dep_at[w] = k
                        waiters[d].append(w)
                        return
                dep_at[w] = k
                start[i] = now
                duration = ops[i].duration_s
                if i in uses:
                    busy[w] = True
                    ev = fluid.run(i, duration, uses[i])
                    ev.callbacks.append(resumers[w])
                    return
                if duration > 0.0:
                    busy[w] = True
                    push(now + duration, w)
                    return
            busy[w] = False
            end[i] = now
            push(now, -1 - i)  # the op's completion event: done[i].succeed()
            pos[w] += 1
            dep_at[w] = 0

    resumers: list[Callable[[_Event], None]] = [functools.partial(_resume_on_event, resume, w)
                                                for w in range(len(queues))]
    for w in range(len(queues)):
        push(0.0, w, _URGENT)  # SimPy starts each process with an urgent initialisation event
    queue = loop.queue
    pop = heapq.heappop
    while queue:
        at, _priority, _eid, what = pop(queue)
        loop.now = at
        if type(what) is int:
            if what >= 0:
                resume(what)
            else:
                i = -1 - what
                processed[i] = True
                waiting = waiters[i]
                if waiting:
                    waiters[i] = []
                    for w in waiting:
                        resume(w)
        else:
            assert isinstance(what, _Event)
            callbacks, what.callbacks = what.callbacks, None
            for callback in callbacks or ():
                callback(what)
    if not all(processed):
        first = next(op.name for op in ops if not processed[op.id])
        raise RuntimeError(f"deadlock: {processed.count(False)} ops never ran, first: {first}")
    return start, end, dict(fluid.stretch)


def _resume_on_event(resume: Callable[[int], None], w: int, _ev: _Event) -> None:
    resume(w)
