"""The SimPy engine against hand-computed timelines and the list-scheduling oracle."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import random_plan_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim.engine.plan import CPU_OPT, D2H, GPU, H2D, Phase, Plan, critical_path_s, list_schedule
from sosim.engine.simpy_engine import Contention, run_plan

F = Phase.FORWARD


def test_hand_computed_two_resources() -> None:
    plan = Plan()
    a = plan.add(GPU, "a", 1.0, phase=F)
    b = plan.add(D2H, "b", 2.0, [a], phase=F)
    c = plan.add(GPU, "c", 0.5, phase=F)  # runs right after a on the GPU, overlapping b
    d = plan.add(CPU_OPT, "d", 1.0, [b, c], phase=F)
    plan.add(GPU, "e", 1.0, [d], phase=F)
    start, end = run_plan(plan)
    assert list(start) == [0.0, 1.0, 1.0, 3.0, 4.0]
    assert list(end) == [1.0, 3.0, 1.5, 4.0, 5.0]


def test_duplex_link_is_shared_while_both_directions_run() -> None:
    """Duplex contention comes from the link's bidirectional total, handed to the engine as a shared resource.

    Each direction 20 GB/s, both together 30: while both copies run, each gets 15 (rate 0.75). 'up' (1 s at
    full speed) ends at 4/3 s; 'down' has done 1 s of its 2 s by then and finishes the rest at full speed.
    """
    plan = Plan()
    plan.add(D2H, "down", 2.0, phase=F)
    plan.add(H2D, "up", 1.0, phase=F)
    gb = 1e9
    contention = Contention(("h2d", "d2h", "bidir"), (20 * gb, 20 * gb, 30 * gb),
                            {0: ((1, 20 * gb), (2, 20 * gb)), 1: ((0, 20 * gb), (2, 20 * gb))})
    _start, end = run_plan(plan, contention)
    assert end[1] == pytest.approx(4 / 3, rel=1e-12)
    assert end[0] == pytest.approx(7 / 3, rel=1e-12)


def random_plans() -> st.SearchStrategy[Plan]:
    return random_plan_strategy(st.floats(0.0, 5.0, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(random_plans())
def test_engine_matches_list_scheduling_and_respects_bounds(plan: Plan) -> None:
    start, end = run_plan(plan)
    ls_start, ls_end = list_schedule(plan)
    np.testing.assert_allclose(start, ls_start, rtol=0, atol=1e-9)
    np.testing.assert_allclose(end, ls_end, rtol=0, atol=1e-9)
    makespan = float(end.max())
    total = sum(op.duration_s for op in plan.ops)
    assert critical_path_s(plan) - 1e-9 <= makespan <= total + 1e-9
    for op in plan.ops:
        assert all(end[d] <= start[op.id] + 1e-12 for d in op.deps)
    # No two spans overlap on one serial resource.
    for ids in plan.ops_by_resource().values():
        spans = sorted((start[i], end[i]) for i in ids)
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in itertools.pairwise(spans))
