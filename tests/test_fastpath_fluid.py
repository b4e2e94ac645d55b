"""The plain-Python replay of the engine under shared-resource contention (``sosim.fastpath.replay_engine``)
gives the SimPy engine's timeline and stretch bit for bit: random plans with random shared resources (ties are
frequent: durations from a small set), and a hand case."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim import engine
from sosim.engine import Contention
from sosim.fastpath import replay_engine
from sosim.plan import CPU_MAIN, CPU_OPT, D2H, GPU, H2D, Phase, Plan, Resource, ResourceKind

F = Phase.FORWARD


def _replay(plan: Plan, contention: Contention) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    active = engine.effective_contention(plan, contention)
    assert active is not None
    start, end, stretch = replay_engine(plan, active, engine._Fluid)
    return np.array(start), np.array(end), engine.stretch_by_name(stretch, active.names)


@st.composite
def contended_plans(draw: st.DrawFn) -> tuple[Plan, Contention]:
    resources = [GPU, H2D, D2H, CPU_OPT, CPU_MAIN, Resource(ResourceKind.H2D, 1), Resource(ResourceKind.D2H, 1)]
    plan = Plan()
    n = draw(st.integers(2, 30))
    for i in range(n):
        resource = draw(st.sampled_from(resources))
        duration = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0]))
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        plan.add(resource, f"op{i}", duration, deps, phase=F)
    k = draw(st.integers(1, 3))
    capacity = tuple(draw(st.sampled_from([1.0, 1.5, 2.0])) for _ in range(k))
    uses = {}
    for op in plan.ops:
        if op.resource.kind is not ResourceKind.GPU and draw(st.booleans()):
            chosen = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=k, unique=True))
            demand = [(r, draw(st.sampled_from([0.5, 1.0, 1.5]))) for r in chosen]
            # An op alone never exceeds a capacity (the contention model's contract).
            scale = min(1.0, *(capacity[r] / d for r, d in demand))
            uses[op.id] = tuple((r, d * scale) for r, d in demand)
    return plan, Contention(tuple(f"r{i}" for i in range(k)), capacity, uses)


@settings(max_examples=300, deadline=None)
@given(contended_plans())
def test_replay_equals_simpy_under_contention(case: tuple[Plan, Contention]) -> None:
    plan, contention = case
    if engine.effective_contention(plan, contention) is None:
        return  # never oversubscribed: the list path (tests/test_fastpath.py)
    ref = engine.run_plan_detailed(plan, contention)
    start, end, stretch = _replay(plan, contention)
    assert np.array_equal(start, ref.start_s) and np.array_equal(end, ref.end_s)
    assert stretch == ref.stretch_s


def test_two_copies_share_a_link_by_hand() -> None:
    """Two 1 s copies of 1 GB each on a 1 GB/s shared link, both at t=0: each at half speed, both end at 2 s."""
    plan = Plan()
    plan.add(H2D, "up", 1.0, phase=F)
    plan.add(D2H, "down", 1.0, phase=F)
    link = Contention(("bidir",), (1e9,), {0: ((0, 1e9),), 1: ((0, 1e9),)})
    start, end, stretch = _replay(plan, link)
    assert start.tolist() == [0.0, 0.0] and end.tolist() == pytest.approx([2.0, 2.0], rel=1e-12)
    assert stretch == pytest.approx({"bidir": 2.0})


def _effective_reference(plan: Plan, contention: Contention) -> Contention | None:
    """effective_contention as first written (one dict per shared resource keyed by the serial Resource): the
    oracle for the version that keys queues without hashing a Resource."""
    if not contention.uses:
        return None
    worst: dict[int, dict[Resource, float]] = {}
    for op_id, ks in contention.uses.items():
        queue = plan.ops[op_id].resource
        for k, demand in ks:
            per_queue = worst.setdefault(k, {})
            per_queue[queue] = max(per_queue.get(queue, 0.0), demand)
    contended = {k for k, per_queue in worst.items()
                 if sum(per_queue.values()) > contention.capacity[k] * (1 + engine._REL_EPS)}
    if not contended:
        return None
    uses = {}
    for op_id, ks in contention.uses.items():
        kept = tuple((k, d) for k, d in ks if k in contended and d > 0)
        if kept and plan.ops[op_id].duration_s > 0:
            uses[op_id] = kept
    return Contention(contention.names, contention.capacity, uses) if uses else None


@settings(max_examples=300, deadline=None)
@given(contended_plans())
def test_effective_contention_equals_its_reference(case: tuple[Plan, Contention]) -> None:
    """Same resources dropped, same uses kept (in the same order), whichever way queues are keyed. Equal but
    distinct Resource objects (an expanded node plan makes one per op) are one queue."""
    plan, contention = case
    # Every op on a fresh Resource object: equality, not identity, must decide what a queue is.
    for op in plan.ops:
        op.resource = Resource(op.resource.kind, op.resource.instance)
    got, ref = engine.effective_contention(plan, contention), _effective_reference(plan, contention)
    assert (got is None) == (ref is None)
    if got is not None and ref is not None:
        assert list(got.uses.items()) == list(ref.uses.items())
