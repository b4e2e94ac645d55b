"""The fast exact engine: the SimPy engine's run of a plan without SimPy, the same floats bit for bit.

SimPy (:mod:`sosim.engine.simpy_engine`) is the reference engine; a search would spend most of its time in SimPy's
generic machinery (an event object per op and per wait, a generator per resource). :func:`run_plan_detailed`
gives the same :class:`~sosim.engine.fluid.EngineRun` in one of two ways, chosen by the plan's contention:

* **no contention** (:func:`~sosim.engine.fluid.effective_contention` is None: no shared resource can ever be
  oversubscribed, e.g. every single-GPU GH200 plan): the reference only waits for dependencies and
  timeouts, so an op starts at ``max(end of its resource's previous op, ends of its dependencies)`` and ends
  at ``start + duration``, floats SimPy's clock computes identically. :func:`list_times` does that in one
  pass in id order (a topological order);
* **contention** (link totals, uplinks, DRAM, cores that ops can oversubscribe): the reference's workers
  run as state machines on :class:`_Loop`, a queue ordered exactly like SimPy's (time, priority, order of
  scheduling), with the shared fluid model (:class:`sosim.engine.fluid.Fluid`) running unchanged on it, so every
  rate is computed by the same code from the same events in the same order.

``tests/test_engines.py`` holds it equal to SimPy (one property over random plans, and every shipped
scenario). This is the engine ``simulate()`` runs by default (``engine="fast"``).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable

import numpy as np

from sosim.engine.fluid import Contention, EngineRun, Fluid, effective_contention, stretch_by_name
from sosim.engine.plan import Plan, Resource


def list_times(plan: Plan) -> tuple[list[float], list[float]]:
    """Start and end of every op by list scheduling, ops in id order (a topological order).

    The same arithmetic as :func:`sosim.engine.plan.list_schedule` (which stays the readable oracle), with the
    per-op work cut to a few list reads: this is the hot loop of a search. A repeated template is read as
    arrays of its one iteration (:func:`_repeated_times`), without making the run's ops.
    """
    if plan.repeated:
        return _repeated_times(plan)
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


def _repeated_times(plan: Plan) -> tuple[list[float], list[float]]:
    """:func:`list_times` of ``plan.copies`` copies of ``plan.template``: per template op its resource slot,
    duration and dependencies inside the iteration (shifted by each copy's first id), and for the ops that
    wait for a carry slot the dependencies of that copy (:attr:`Plan.copy_deps`). The same floats in the
    same order as over the made ops."""
    t = plan.template
    assert t is not None
    m = len(t.ops)
    # Resource slots by object identity first, as list_times does (hashing a Resource runs Python code).
    by_id: dict[int, int] = {}
    slot_of: dict[Resource, int] = {}
    res = []
    for op in t.ops:
        k = by_id.get(id(op.resource))
        if k is None:
            k = by_id[id(op.resource)] = slot_of.setdefault(op.resource, len(slot_of))
        res.append(k)
    dur = [op.duration_s for op in t.ops]
    own = [op.deps for op in t.ops]
    # One copy at a time on its own lists (a dependency inside the copy is its template index, no shift);
    # the ops waiting for a carry slot read the ends of earlier copies through ``end`` (global ids).
    start: list[float] = []
    end: list[float] = []
    free = [0.0] * len(slot_of)
    rows = list(zip(range(m), res, dur, own))
    for k, special in enumerate(plan.copy_deps):
        base = k * m
        s_k = [0.0] * m
        e_k = [0.0] * m
        for i, r, du, deps in rows:
            time = free[r]
            if i in special:
                for d in special[i]:
                    e = end[d] if d < base else e_k[d - base]
                    if e > time:
                        time = e
            else:
                for d in deps:
                    e = e_k[d]
                    if e > time:
                        time = e
            s_k[i] = time
            time += du
            e_k[i] = time
            free[r] = time
        start += s_k
        end += e_k
    return start, end


def run_plan_detailed(plan: Plan, contention: Contention | None = None) -> EngineRun:
    """What the SimPy engine (:func:`sosim.engine.simpy_engine.run_plan_detailed`) returns for ``plan`` under
    ``contention``, without SimPy."""
    active = effective_contention(plan, contention)
    if active is None:
        start, end = list_times(plan)
        return EngineRun(np.array(start), np.array(end), {})
    start, end, by_index = _event_loop_run(plan, active)
    return EngineRun(np.array(start), np.array(end), stretch_by_name(by_index, active))


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


def _event_loop_run(plan: Plan, active: Contention) -> tuple[list[float], list[float], dict[int, float]]:
    """The SimPy engine's run of ``plan`` under the (effective) contention ``active``, event for event.

    The engine's workers (one per serial resource: wait for each dependency that is not yet processed, start,
    wait for a timeout or for the fluid model, end, trigger the op's event) are replayed as state machines on
    :class:`_Loop`, which orders events exactly as SimPy does (time, then priority, then the order in which
    they were scheduled); the shared fluid model (:class:`sosim.engine.fluid.Fluid`) runs unchanged on it, so
    every rate and every float is computed by the same code in the same order. The only SimPy event left
    out is a process's termination, which nothing waits for. Returns start and end of every op and the fluid
    model's stretch by shared resource index.
    """
    loop = _Loop()
    fluid = Fluid(loop, active)
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
                    callbacks = fluid.run(i, duration, uses[i]).callbacks
                    assert callbacks is not None  # a fresh event has not been processed yet
                    callbacks.append(resumers[w])
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
