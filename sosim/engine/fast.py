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

import heapq
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from sosim.engine.fluid import (
    Contention,
    EngineRun,
    FluidState,
    RepeatedUses,
    effective_contention,
    never_throttled,
    never_throttled_fast,
    stretch_by_name,
)
from sosim.engine.plan import Op, Plan, Resource, Template, ops_by_resource, slots_passed_on


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
    duration and dependencies inside the iteration (a template index: each copy runs on its own lists).

    An op waiting for a carry slot starts after the latest end among what the slot holds in that copy (the
    ops of copy ``k - lag`` it carries out, or what it passes on): a list schedule takes the largest of its
    dependencies' ends, in any order the same float, so only that largest end is carried per slot and copy,
    not the sorted dependencies themselves (:attr:`Plan.copy_deps`, which the event loop needs for SimPy's
    order of waiting). A copy's ends sit in one list with its slots' values after them (index ``m + j`` for
    the ``j``-th slot followed; ``-inf`` where a slot holds nothing, which no start is below), so that every
    dependency is one list read and the hot loop has no branch for slots. The same floats as over the made
    ops: a maximum is exact, and every end is the same ``start + duration``."""
    t = plan.template
    assert t is not None
    m = len(t.ops)
    # Resource slots by object identity first, as list_times does (hashing a Resource runs Python code).
    by_id: dict[int, int] = {}
    slot_of: dict[Resource, int] = {}
    rows: list[tuple[int, int, float, tuple[int, ...]]] = []
    slotted: list[int] = []  # the rows of ops that wait for a carry slot (deps sorted: slots, negative, first)
    for op in t.ops:
        k = by_id.get(id(op.resource))
        if k is None:
            k = by_id[id(op.resource)] = slot_of.setdefault(op.resource, len(slot_of))
        deps = op.deps
        if deps and deps[0] < 0:
            slotted.append(len(rows))
        rows.append((op.id, k, op.duration_s, deps))
    carry = _slots_followed(t, {d for j in slotted for d in rows[j][3] if d < 0})
    at = {slot: m + j for j, (slot, _lag, _own, _passes) in enumerate(carry)}
    for j in slotted:
        i, k, du, deps = rows[j]
        rows[j] = (i, k, du, tuple([at[d] if d < 0 else d for d in deps]))
    # Per followed slot: its lag, and where its own ops' ends and the slots it passes on sit in a copy's list.
    follow = [(lag, [*own, *[at[p] for p in passes]]) for _slot, lag, own, passes in carry]
    start: list[float] = []
    end: list[float] = []
    free = [0.0] * len(slot_of)
    # Per copy: the latest end of what each followed slot carries out of it (-inf: nothing).
    filled: list[list[float]] = []
    for k in range(plan.copies):
        e_k = [0.0] * m
        e_k += [filled[k - lag][j] if k >= lag else _NOTHING for j, (lag, _refs) in enumerate(follow)]
        s_k = [0.0] * m
        for i, r, du, deps in rows:
            time = free[r]
            for d in deps:
                e = e_k[d]
                if e > time:
                    time = e
            s_k[i] = time
            time += du
            e_k[i] = time
            free[r] = time
        out = []
        for _lag, refs in follow:
            latest = _NOTHING
            for x in refs:
                e = e_k[x]
                if e > latest:
                    latest = e
            out.append(latest)
        filled.append(out)
        start += s_k
        del e_k[m:]
        end += e_k
    return start, end


# What an empty carry slot holds in :func:`_repeated_times`: below every start, so never the latest.
_NOTHING = -float("inf")


def _slots_followed(t: Template, needed: set[int]) -> list[tuple[int, int, list[int], list[int]]]:
    """The carry slots that ops wait for, and those they pass on from: slot, lag, the template ops it carries
    out, the slots it passes on."""
    slots_passed_on(t, needed)
    return [(s, t.lag[s], [r for r in t.carry_out.get(s, ()) if r >= 0], [r for r in t.carry_out.get(s, ()) if r < 0])
            for s in sorted(needed)]


def run_plan_detailed(plan: Plan, contention: Contention | None = None) -> EngineRun:
    """What the SimPy engine (:func:`sosim.engine.simpy_engine.run_plan_detailed`) returns for ``plan`` under
    ``contention``, without SimPy."""
    active = effective_contention(plan, contention)
    if active is None:
        start, end = list_times(plan)
        return EngineRun(np.array(start), np.array(end), {})
    # Most contended plans never oversubscribe anything in fact (copies in both directions that do not overlap):
    # the list schedule is then the fluid model's timeline bit for bit (sosim.engine.fluid.never_throttled).
    start, end = list_times(plan)
    # As arrays once: the check reads them, and they are the run when it passes.
    start_s, end_s = np.array(start), np.array(end)
    if _full_speed(plan, active, start, end, start_s=start_s, end_s=end_s):
        return EngineRun(start_s, end_s, {})
    start, end, by_index = _event_loop_run(plan, active)
    return EngineRun(np.array(start), np.array(end), stretch_by_name(by_index, active))


def way_taken(plan: Plan, contention: Contention | None = None) -> str:
    """Which way :func:`run_plan_detailed` takes for ``plan``: "list" (nothing can contend), "full-speed check"
    (something could, the check proves nothing does: the list schedule), or "event loop" (the fluid model)."""
    active = effective_contention(plan, contention)
    if active is None:
        return "list"
    start, end = list_times(plan)
    return "full-speed check" if _full_speed(plan, active, start, end) else "event loop"


# Below this many contended ops, the sweep in Python is cheaper than numpy's fixed costs.
_ARRAY_CHECK_FROM = 200


def _full_speed(plan: Plan, active: Contention, start: list[float], end: list[float],
                array_from: int = _ARRAY_CHECK_FROM, *, start_s: np.ndarray | None = None,
                end_s: np.ndarray | None = None) -> bool:
    """Whether the fluid model would leave every contended op of the list schedule ``start``/``end`` at full
    speed (:func:`sosim.engine.fluid.never_throttled_fast` on many, else :func:`sosim.engine.fluid.never_throttled`).
    ``start_s``/``end_s``: the same as arrays, when the caller has them."""
    tops, copies, tuses = _template_view(plan, active)
    m = len(tops)
    if len(tuses) * copies < array_from:
        jobs = [(base + i, start[base + i], end[base + i], u)
                for base in range(0, copies * m, m) for i, u in tuses.items()]
        return never_throttled(jobs, active.capacity, _follows(plan, tops))
    # Each op's serial resource, numbered in order of first use (the order of ops_by_resource's queues).
    # By the resource object's identity first: hashing a Resource runs Python code.
    by_id: dict[int, int] = {}
    number: dict[Resource, int] = {}
    worker_of = []
    for op in tops:
        w = by_id.get(id(op.resource))
        if w is None:
            w = by_id[id(op.resource)] = number.setdefault(op.resource, len(number))
        worker_of.append(w)
    template = np.fromiter(tuses.keys(), dtype=np.int64, count=len(tuses))
    ids = (np.arange(copies, dtype=np.int64)[:, None] * m + template[None, :]).ravel()
    per_k: dict[int, tuple[list[int], list[float]]] = {}
    for j, u in enumerate(tuses.values()):
        for k, d in u:
            at, ds = per_k.setdefault(k, ([], []))
            at.append(j)
            ds.append(d)
    n = len(template)
    demand = {k: ((np.arange(copies, dtype=np.int64)[:, None] * n + np.array(at)[None, :]).ravel(),
                  np.tile(np.array(ds), copies)) for k, (at, ds) in per_k.items()}
    worker = np.tile(np.array([worker_of[i] for i in template.tolist()], dtype=np.int64), copies)
    if start_s is None or end_s is None:
        start_s, end_s = np.array(start), np.array(end)
    if never_throttled_fast(start_s[ids], end_s[ids], demand, worker, active.capacity):
        return True
    uses = list(tuses.values()) * copies
    jobs = list(zip(ids.tolist(), start_s[ids].tolist(), end_s[ids].tolist(), uses, strict=True))
    return never_throttled(jobs, active.capacity, _follows(plan, tops))


def _follows(plan: Plan, tops: list[Op]) -> Callable[[int], tuple[int, ...]]:
    """Op id -> the ops whose completion its start waits for: its dependencies and its resource's previous op
    (asked only where two contended ops meet at one instant: a repeated plan's carried dependencies and the
    resources' queues are worked out then, not before)."""
    m = len(tops)
    repeated = _is_template(plan, tops)
    made: list[dict[Resource, list[int]]] = []

    def follows(g: int) -> tuple[int, ...]:
        if not made:
            made.append(ops_by_resource(tops))
        queues = made[0]
        k, i = divmod(g, m)
        base = k * m
        special = plan.copy_deps[k] if repeated else {}
        deps = special[i] if i in special else tuple([d + base for d in tops[i].deps])
        queue = queues[tops[i].resource]
        at = queue.index(i)
        previous = base + queue[at - 1] if at else (base - m + queue[-1] if k else -1)
        return (previous, *deps)

    return follows


# --- the engine's run under shared-resource contention, without SimPy -------------------------------------------


def _is_template(plan: Plan, ops: list[Op]) -> bool:
    """Whether ``ops`` (from :func:`_template_view`) are ``plan``'s template (else its own ops)."""
    return plan.template is not None and ops is plan.template.ops


def _template_view(plan: Plan, active: Contention) -> tuple[list[Op], int,
                                                            Mapping[int, tuple[tuple[int, float], ...]]]:
    """The plan as ``copies`` copies of one list of ops: a repeated template read as its template (each copy's
    carried dependencies in :attr:`Plan.copy_deps`, the demands of the template's ops), or any other plan
    as one copy of its own ops."""
    t = plan.template_if_current()
    uses = active.uses
    if t is not None and isinstance(uses, RepeatedUses) and uses.period == len(t.ops):
        return t.ops, plan.copies, uses.template
    return plan.ops, 1, uses


def _event_loop_run(plan: Plan, active: Contention) -> tuple[list[float], list[float], dict[int, float]]:
    """The SimPy engine's run of ``plan`` under the (effective) contention ``active``, event for event.

    The engine's workers (one per serial resource: wait for each dependency that is not yet processed, start,
    wait for a timeout or for the fluid model, end, trigger the op's event) are replayed as state machines,
    their events ordered exactly as SimPy orders them (time, then priority, then the order in which they were
    scheduled), and the fluid model's arithmetic (:class:`sosim.engine.fluid.FluidState`) is the SimPy engine's, so
    every rate and every float is computed by the same code in the same order. Two queues stand for SimPy's
    one: a heap of events at later times, and a first-in first-out list of events scheduled for *now* (an op's
    completion, a fluid job's end, a zero delay). Every event in the heap at the current time was scheduled
    at an earlier time, so before anything in the list: the heap's are taken first, then the list's in order.
    A process's start-up (SimPy's urgent initialisation) is each worker's first step at time 0, and its
    termination, which nothing waits for, is left out.

    A repeated plan runs on its template's arrays (duration, dependencies, demands per template op; a copy's
    op ``i`` has id ``copy * len(template) + i``), without making its ops. Returns start and end of every op
    and the fluid model's stretch by shared resource index.
    """
    tops, copies, tuses = _template_view(plan, active)
    total = len(tops) * copies
    loop = _Queues(FluidState(active), [False] * total, {}, [], [])
    start = [0.0] * total
    end = [0.0] * total
    queues = list(ops_by_resource(tops).values())  # the engine's worker order (its env.process order)
    specials = plan.copy_deps if _is_template(plan, tops) else [{}]
    resume, schedule_wake = _worker_steps(loop, tops, copies, specials, tuses, queues, start, end)
    _drive(loop, len(queues), resume, schedule_wake)
    if not all(loop.processed):
        first = loop.processed.index(False)
        raise RuntimeError(f"deadlock: {loop.processed.count(False)} ops never ran, first: "
                           f"{tops[first % len(tops)].name}")
    return start, end, dict(loop.fluid.stretch)


@dataclass(slots=True)
class _Queues:
    """What the event loop's steps share. Tokens: a worker's resumption ``w`` (``0 <= w < workers``), op
    ``g``'s completion ``workers + g``, a fluid wake-up of generation ``v``: ``-1 - v``. The heap holds
    (time, order of scheduling, token) of later events; ``now`` the tokens scheduled for the current time."""

    fluid: FluidState
    processed: list[bool]  # op g's completion event has been processed (its waiters resumed)
    waiters: dict[int, list[int]]  # workers waiting on op g, in the order they began to
    heap: list[tuple[float, int, int]]
    now: list[int]
    order: itertools.count[int] = field(default_factory=itertools.count)


def _worker_steps(loop: _Queues, tops: list[Op], copies: int, specials: list[dict[int, tuple[int, ...]]],
                  tuses: Mapping[int, tuple[tuple[int, float], ...]], queues: list[list[int]], start: list[float],
                  end: list[float]) -> tuple[Callable[[int, float], None], Callable[[float | None, float], None]]:
    """The workers as state machines: ``resume(w, now)`` runs worker ``w`` until it waits (for a dependency,
    a timeout or the fluid model) or has no op left; ``schedule_wake(delay, now)`` schedules the fluid
    model's next wake-up."""
    m = len(tops)
    dur = [op.duration_s for op in tops]
    tdeps = [op.deps for op in tops]
    use = [tuses.get(i) for i in range(m)]
    # Template ops that wait for a carry slot: their dependencies are per copy (global ids).
    slotted = [i in specials[0] for i in range(m)]
    n_workers = len(queues)
    pos = [0] * n_workers  # the template op each worker is at
    copy_of = [0] * n_workers  # and the copy
    dep_at = [0] * n_workers  # the next dependency it checks
    busy = [False] * n_workers  # it waits for its op's timeout or fluid completion
    fluid, processed, waiters, heap, order = loop.fluid, loop.processed, loop.waiters, loop.heap, loop.order
    push_now = loop.now.append
    heappush = heapq.heappush

    def schedule_wake(delay: float | None, now: float) -> None:
        if delay is None:
            return
        at = now + delay  # SimPy's timeout: now + delay
        if at == now:
            push_now(-1 - fluid.generation)
        else:
            heappush(heap, (at, next(order), -1 - fluid.generation))

    def resume(w: int, now: float) -> None:
        q = queues[w]
        last = len(q)
        p, k = pos[w], copy_of[w]
        base = k * m
        while True:
            i = q[p]
            if not busy[w]:
                if slotted[i]:
                    deps, off = specials[k][i], 0
                else:
                    deps, off = tdeps[i], base
                j = dep_at[w]
                while j < len(deps):
                    d = deps[j] + off
                    j += 1
                    if not processed[d]:
                        dep_at[w] = j
                        waiters.setdefault(d, []).append(w)
                        pos[w], copy_of[w] = p, k
                        return
                start[base + i] = now
                duration = dur[i]
                u = use[i]
                if u is not None or duration > 0.0:
                    busy[w] = True
                    pos[w], copy_of[w] = p, k
                    if u is not None:
                        schedule_wake(fluid.add(w, duration, u, now), now)
                    elif now + duration == now:
                        push_now(w)
                    else:
                        heappush(heap, (now + duration, next(order), w))
                    return
            busy[w] = False
            end[base + i] = now
            push_now(n_workers + base + i)  # the op's completion event: done[g].succeed()
            dep_at[w] = 0
            p += 1
            if p == last:
                p, k, base = 0, k + 1, base + m
                if k == copies:
                    pos[w], copy_of[w] = p, k
                    return

    return resume, schedule_wake


def _drive(loop: _Queues, n_workers: int, resume: Callable[[int, float], None],
           schedule_wake: Callable[[float | None, float], None]) -> None:
    """Run the events in SimPy's order: each worker's start-up at time 0 (SimPy's urgent initialisation events,
    before anything else), then per time the heap's events at it, then what is scheduled for it, in order."""
    fluid, processed, waiters, heap, now_list = loop.fluid, loop.processed, loop.waiters, loop.heap, loop.now
    heappop = heapq.heappop
    for w in range(n_workers):
        resume(w, 0.0)
    now = 0.0
    while True:
        # Everything scheduled for now, in order (what it schedules for now joins the end of the list).
        for token in now_list:
            if token >= n_workers:
                g = token - n_workers
                processed[g] = True
                for w in waiters.pop(g, ()):
                    resume(w, now)
            elif token >= 0:
                resume(token, now)
            elif -1 - token == fluid.generation:  # a wake-up scheduled before the last reallocation is stale
                finished, delay = fluid.due(now)
                now_list += finished  # each fluid job's event resumes its worker
                schedule_wake(delay, now)
        now_list.clear()
        if not heap:
            return
        # The next time: the heap's events at it, in order of scheduling (all before anything they schedule
        # for that time, which goes to the list; nothing they schedule goes to the heap at that time).
        now = heap[0][0]
        while heap and heap[0][0] == now:
            token = heappop(heap)[2]
            if token >= 0:
                resume(token, now)
            elif -1 - token == fluid.generation:
                finished, delay = fluid.due(now)
                now_list += finished
                schedule_wake(delay, now)
