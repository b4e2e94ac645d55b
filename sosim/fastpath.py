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
