"""Shared resources contended in the engine: hand-computed timelines, the no-contention oracle, invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim.engine.plan import CPU_OPT, D2H, GPU, H2D, Phase, Plan, Resource, ResourceKind, list_schedule
from sosim.engine.simpy_engine import Contention, effective_contention, run_plan, run_plan_detailed

F = Phase.FORWARD
H2D_1 = Resource(ResourceKind.H2D, 1)

GB = 1e9


def _link(capacity_gbps: float) -> tuple[tuple[str, ...], tuple[float, ...]]:
    return ("uplink",), (capacity_gbps * GB,)


def test_two_ranks_sharing_one_link_split_it_evenly() -> None:
    """Two copies (two ranks' copy engines) behind one 10 GB/s uplink, each alone at 10 GB/s: 1 s and 3 s.

    Together each gets 5 GB/s (rate 0.5): the short one ends at 2 s having done its 1 s of work; the long one
    has done 1 of its 3 s by then and runs the remaining 2 s alone: ends at 4 s.
    """
    plan = Plan()
    plan.add(H2D, "rank0", 1.0, phase=F)
    plan.add(H2D_1, "rank1", 3.0, phase=F)
    names, caps = _link(10)
    run = run_plan_detailed(plan, Contention(names, caps, {0: ((0, 10 * GB),), 1: ((0, 10 * GB),)}))
    assert run.start_s.tolist() == [0.0, 0.0]
    assert run.end_s[0] == pytest.approx(2.0, rel=1e-12)
    assert run.end_s[1] == pytest.approx(4.0, rel=1e-12)
    # Each op lost 1 s to the uplink.
    assert run.stretch_s == pytest.approx({"uplink": 2.0}, rel=1e-12)


def test_a_late_arrival_slows_the_copy_already_running() -> None:
    """Rank 1's copy starts at 1 s (after a 1 s kernel). Rank 0's 2 s copy ran alone until then (1 s of work
    done); both at half speed until rank 0 finishes its last second of work at 3 s; rank 1 has done 1 of its
    2 s and ends at 4 s."""
    plan = Plan()
    plan.add(H2D, "rank0", 2.0, phase=F)
    k = plan.add(Resource(ResourceKind.GPU, 1), "kernel", 1.0, phase=F)
    plan.add(H2D_1, "rank1", 2.0, [k], phase=F)
    names, caps = _link(10)
    _start, end = run_plan(plan, Contention(names, caps, {0: ((0, 10 * GB),), 2: ((0, 10 * GB),)}))
    assert end.tolist() == pytest.approx([3.0, 1.0, 4.0], rel=1e-12)


def test_progressive_filling_frees_what_the_bottleneck_leaves() -> None:
    """X uses r1; Y uses r1 and r2; Z uses r2 (each 10 GB/s at full speed). r1 holds 10, r2 holds 30.

    r1 is the first to fill: X and Y run at 0.5. Z then has r2's 25 GB/s left and runs at full speed.
    """
    plan = Plan()
    plan.add(H2D, "X", 1.0, phase=F)
    plan.add(D2H, "Y", 1.0, phase=F)
    plan.add(CPU_OPT, "Z", 1.0, phase=F)
    c = Contention(("r1", "r2"), (10 * GB, 30 * GB),
                   {0: ((0, 10 * GB),), 1: ((0, 10 * GB), (1, 10 * GB)), 2: ((1, 10 * GB),)})
    _start, end = run_plan(plan, c)
    assert end.tolist() == pytest.approx([2.0, 2.0, 1.0], rel=1e-12)


def test_dram_shared_by_adam_and_a_copy_gives_equal_bytes_per_second() -> None:
    """A socket's DRAM (100 GB/s) shared by CPU Adam (100 GB/s alone, 1 s) and a 50 GB/s DMA (0.5 s): together
    they ask 150. Fair shares in bytes: 50 GB/s each, which is all the DMA asks (full speed, ends at 0.5 s);
    Adam runs at half speed meanwhile (0.25 s of its work done) and the remaining 0.75 s alone: 1.25 s."""
    plan = Plan()
    plan.add(CPU_OPT, "adam", 1.0, phase=F)
    plan.add(D2H, "dma", 0.5, phase=F)
    c = Contention(("dram0",), (100 * GB,), {0: ((0, 100 * GB),), 1: ((0, 50 * GB),)})
    _start, end = run_plan(plan, c)
    assert end.tolist() == pytest.approx([1.25, 0.5], rel=1e-12)


def test_a_resource_that_cannot_be_oversubscribed_is_dropped() -> None:
    plan = Plan()
    plan.add(H2D, "a", 1.0, phase=F)
    plan.add(D2H, "b", 1.0, phase=F)
    # Each queue draws at most 10 of 20: never oversubscribed, so the engine runs without contention.
    assert effective_contention(plan, Contention(("r",), (20 * GB,), {0: ((0, 10 * GB),), 1: ((0, 10 * GB),)})) is None


_QUEUES = [GPU, H2D, D2H, CPU_OPT, H2D_1, Resource(ResourceKind.D2H, 1), Resource(ResourceKind.CPU_OPT, 1)]


@st.composite
def plans_with_uses(draw: st.DrawFn, oversubscribed: bool) -> tuple[Plan, Contention]:
    plan = Plan()
    n = draw(st.integers(1, 30))
    n_res = draw(st.integers(1, 3))
    uses: dict[int, tuple[tuple[int, float], ...]] = {}
    for i in range(n):
        queue = draw(st.sampled_from(_QUEUES))
        duration = draw(st.floats(0.0, 5.0, allow_nan=False))
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        plan.add(queue, f"op{i}", duration, deps, phase=F)
        ks = draw(st.lists(st.integers(0, n_res - 1), max_size=n_res, unique=True))
        uses[i] = tuple((k, draw(st.floats(0.1, 10.0))) for k in ks)
    if oversubscribed:
        caps = tuple(draw(st.floats(5.0, 20.0)) for _ in range(n_res))
    else:
        # Every queue at full demand at once still fits: no op can ever be slowed.
        caps = tuple(10.0 * len(_QUEUES) + 1 for _ in range(n_res))
    return plan, Contention(tuple(f"r{k}" for k in range(n_res)), caps, uses)


@settings(max_examples=100, deadline=None)
@given(plans_with_uses(oversubscribed=False))
def test_without_contention_the_engine_is_list_scheduling_bit_for_bit(pc: tuple[Plan, Contention]) -> None:
    plan, contention = pc
    start, end = run_plan(plan, contention)
    ls_start, ls_end = list_schedule(plan)
    assert np.array_equal(start, np.array(ls_start))
    assert np.array_equal(end, np.array(ls_end))


@settings(max_examples=100, deadline=None)
@given(plans_with_uses(oversubscribed=True))
def test_contention_invariants(pc: tuple[Plan, Contention]) -> None:
    plan, contention = pc
    run = run_plan_detailed(plan, contention)
    start, end = run.start_s, run.end_s
    _ls_start, ls_end = list_schedule(plan)
    for op in plan.ops:
        # Never faster than full speed; dependencies respected.
        assert end[op.id] - start[op.id] >= op.duration_s * (1 - 1e-9) - 1e-12
        assert all(end[d] <= start[op.id] + 1e-12 for d in op.deps)
    # No two spans overlap on one serial resource.
    for ids in plan.ops_by_resource().values():
        spans = sorted((start[i], end[i]) for i in ids)
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    # Contention only ever adds time, and the stretch accounts for all of it.
    assert float(end.max(initial=0.0)) >= max(ls_end, default=0.0) - 1e-9
    stretched = sum(float(end[o.id] - start[o.id]) - o.duration_s for o in plan.ops)
    assert sum(run.stretch_s.values()) == pytest.approx(stretched, rel=1e-6, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.floats(0.1, 10.0)), min_size=1, max_size=6),
       st.floats(1.0, 20.0), st.floats(1.0, 3.0))
def test_more_capacity_never_delays_independent_transfers(ops: list[tuple[float, float]], cap: float,
                                                          factor: float) -> None:
    """Transfers on separate queues sharing one resource, all started at 0: raising its capacity never makes
    any of them end later (monotonicity in bandwidth)."""
    plan = Plan()
    uses = {}
    for i, (duration, demand) in enumerate(ops):
        plan.add(Resource(ResourceKind.H2D, i), f"t{i}", duration, phase=F)
        uses[i] = ((0, demand),)
    _s, slow = run_plan(plan, Contention(("link",), (cap,), uses))
    _s, fast = run_plan(plan, Contention(("link",), (cap * factor,), uses))
    assert np.all(fast <= slow + 1e-9)

