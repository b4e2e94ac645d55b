"""Each block on a hand-computed tiny plan: layout, hooks, gradient paths, refreshes, the CPU split."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from helpers import tiny_scenario

from sosim import load_scenario
from sosim.costs.analytic import AnalyticCostModel
from sosim.engine.plan import CPU_MAIN, CPU_OPT, Category, Phase, Plan, ResourceKind
from sosim.engine.simpy_engine import run_plan
from sosim.hardware.model import tokens_per_gpu
from sosim.schedules.blocks import cpu
from sosim.schedules.blocks.driver import Ctx, pass_op
from sosim.schedules.blocks.gradients import Stage3Gradients
from sosim.schedules.blocks.layout import (
    Group,
    Tensor,
    Unit,
    gpu_groups_by_fraction,
    gpu_groups_by_ratio,
    make_flushes,
    make_layout,
    subgroups,
)
from sosim.schedules.blocks.steps import BlockingCopy
from sosim.schedules.blocks.weights import Stage3Hooks

# Three units of 4, 3 and 5 elements: tensors (unit, elements) in registration order.
TENSORS = [Tensor(0, 0, 4), Tensor(1, 1, 2), Tensor(2, 1, 1), Tensor(3, 2, 5)]


def test_overflow_flushes_leave_when_the_next_tensor_does_not_fit() -> None:
    # Backward order: t3 (5), t2 (1), t1 (2), t0 (4); cap 6.
    fl = make_flushes(TENSORS, 6, "overflow")
    # t3 + t2 = 6 fits; t1 would overflow -> flush [t3, t2] when t1 arrives (unit 1's backward);
    # t1 + t0 = 6 fits -> the epilogue flushes [t1, t0] after unit 0.
    assert [(f.tensors, f.unit, f.elements) for f in fl] == [((3, 2), 1, 6), ((1, 0), 0, 6)]


def test_fill_buckets_leave_as_soon_as_they_are_full() -> None:
    fl = make_flushes(TENSORS, 6, "fill")
    # t3 (5) not full; + t2 = 6 full -> leaves at unit 1; t1 + t0 = 6 -> leaves at unit 0.
    assert [(f.tensors, f.unit) for f in fl] == [((3, 2), 1), ((1, 0), 0)]
    assert [f.tensors for f in make_flushes(TENSORS, 3, "fill")] == [(3,), (2, 1), (0,)]


def test_subgroups_and_which_stay_on_the_gpu() -> None:
    groups = subgroups(TENSORS, 5)
    # Registration order, closed once >= 5: [t0, t1] = 6, [t2, t3] = 6.
    assert [(g.tensors, g.elements) for g in groups] == [((0, 1), 6), ((2, 3), 6)]
    # DeepSpeed ratio: the first int((1 - ratio) * n) sub-groups, by count.
    assert [g.on_gpu for g in gpu_groups_by_ratio(groups, 0.9)] == [False, False]  # int(0.2) = 0
    assert [g.on_gpu for g in gpu_groups_by_ratio(groups, 0.5)] == [True, False]
    # The paper's fraction: a prefix of groups whose parameters fit in the budget.
    assert [g.on_gpu for g in gpu_groups_by_fraction(groups, 0.5)] == [True, False]
    assert [g.on_gpu for g in gpu_groups_by_fraction(groups, 0.49)] == [False, False]


def test_a_group_is_done_after_the_flush_carrying_its_first_tensor() -> None:
    units = [Unit(i, f"u{i}", n, 1.0, 1.0) for i, n in enumerate((4, 3, 5))]
    lay = make_layout(units, TENSORS, make_flushes(TENSORS, 6, "overflow"), subgroups(TENSORS, 5))
    assert lay.done_after == {0: 1, 1: 0}
    assert lay.unit_groups == {0: (0,), 1: (0, 1), 2: (1,)}


def test_core_split_follows_deepspeed_affinity_rules() -> None:
    # int((1 - 0.99) * 72) = 0: psutil's cpu_affinity([]) = all CPUs; both processes time-share every core.
    # (The plans differ only in the share they record for the contention model, sosim/engine/contention.py.)
    almost = cpu.split_cores(72, 0.99, False, "cpu_adam")
    assert almost.core_share == 0.99 and cpu.one_process(72, "cpu_adam").core_share == 1.0
    assert dataclasses.replace(almost, core_share=1.0) == cpu.split_cores(72, 1.0, False, "cpu_adam")
    shared = cpu.split_cores(72, 1.0, False, "cpu_adam")
    assert shared.shared and shared.optimizer_cores == 72
    ds = cpu.split_cores(16, 0.8, False, "cpu_adam")
    # int(0.2 * 16) = 3 cores for the training process's main thread, 13 for the worker; the training
    # process's OpenMP threads keep every core (the affinity call pins the calling thread only).
    assert (ds.optimizer_cores, ds.bulk_cores, ds.optimizer, ds.bulk) == (13, 16, CPU_OPT, CPU_MAIN)
    paper = cpu.split_cores(16, 0.8, True, "cpu_adam")
    assert paper.bulk_cores == 3


def _ctx(schedule: dict | None = None, **training: object) -> Ctx:  # type: ignore[type-arg]
    sc = load_scenario(tiny_scenario(schedule or {"system": "zero3_offload"}, **training))
    costs = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    units = [Unit(i, f"layer{i}", 1, 1.0, 1.0, is_layer=True) for i in range(3)]
    tensors = [Tensor(i, i, 1) for i in range(3)]
    lay = make_layout(units, tensors, make_flushes(tensors, 1, "overflow"), subgroups(tensors, 1))
    return Ctx(sc, costs, Plan(), lay, cpu.one_process(8, "cpu_adam"))


@pytest.mark.parametrize(("hook_s", "expected_end"), [(0.5, 3.5), (2.0, 7.0)])
def test_stage3_hooks_stall_the_gpu_only_when_longer_than_the_layer(hook_s: float, expected_end: float) -> None:
    ctx = _ctx()
    hooks = Stage3Hooks(hook_s, hook_s)
    for u in ctx.layout.units:
        hooks.around(ctx, u, Phase.FORWARD)
        pass_op(ctx, u, Phase.FORWARD, [])
    _start, end = run_plan(ctx.plan)
    # Short hooks: the first layer waits for one hook, then the GPU runs back to back (0.5 + 3 x 1).
    # Long hooks: each layer starts when its hook ends (2, 4, 6), the last ends at 7.
    assert float(end.max()) == pytest.approx(expected_end)
    assert sum(op.category is Category.HOOK for op in ctx.plan.ops) == 3


@dataclass
class _UnitCopies:
    """A stand-in cost model: every copy, cast and collective takes 1 s."""

    def copy_s(self, n_bytes: float, direction: str, pinned: bool) -> float:
        del n_bytes, direction, pinned
        return 1.0

    def gpu_cast_s(self, elements: float) -> float:
        del elements
        return 1.0

    def ds_refresh_s(self, elements: float, threads: float, pinned: bool, system: str = "zero3_offload") -> float:
        del elements, threads, pinned, system
        return 1.0


def test_stage3_gradient_path_orders_its_stream_and_applies_backpressure() -> None:
    ctx = _ctx()
    ctx.costs = _UnitCopies()  # type: ignore[assignment]
    lay = ctx.layout
    units = [Unit(i, f"layer{i}", 1, 0.0, 0.0, is_layer=True) for i in range(6)]
    tensors = [Tensor(i, i, 1) for i in range(6)]
    ctx.layout = make_layout(units, tensors, make_flushes(tensors, 1, "overflow"), subgroups(tensors, 6))
    del lay
    grads = Stage3Gradients(overlap_comm=True, pinned=True, superoffload=False)
    arrivals: list[int] = []
    grads.start(ctx)
    for u in reversed(units):
        op = pass_op(ctx, u, Phase.BACKWARD, [])
        grads.after_backward(ctx, u, op, lambda c, g, a: arrivals.append(a))
    grads.finish(ctx, lambda c, g, a: None)
    _start, end = run_plan(ctx.plan)
    plan = ctx.plan
    flush_ops = [o for o in plan.ops if o.phase is Phase.GRADIENT and o.category is not Category.SYNC]
    # Five flushes issued at backward ends (the sixth at the epilogue), each: bf16 D2H, bf16 H2D, GPU cast,
    # fp32 D2H on one stream, 1 s each: the stream runs them back to back, 24 s in all.
    assert len(flush_ops) == 24
    assert float(max(end[o.id] for o in flush_ops)) == pytest.approx(24.0)
    # Back-pressure: flushes 3, 4, 5 wait on the host for flushes 0, 1, 2; the backward ops (0 s) issued
    # after a wait start only when the awaited flush has ended (4 s, 8 s, 12 s).
    waits = [o for o in plan.ops if o.name.startswith("grad_backpressure")]
    assert [float(end[w.id]) for w in waits] == [4.0, 8.0, 12.0]
    assert all(o.resource.kind is ResourceKind.CPU_MAIN for o in waits)
    # One sync at the end of backward; the single sub-group is done after the last flush.
    assert float(end[-1]) == pytest.approx(24.0)
    assert len(arrivals) == 1


def test_blocking_refresh_is_one_op_per_cpu_subgroup_and_a_gpu_cast_otherwise() -> None:
    ctx = _ctx()
    ctx.costs = _UnitCopies()  # type: ignore[assignment]
    refresh = BlockingCopy("zero3_offload")
    a = refresh(ctx, Group(0, (0,), 10), [])
    b = refresh(ctx, Group(1, (1,), 10, on_gpu=True), [a])
    ops = ctx.plan.ops
    assert ops[a].resource.kind is ResourceKind.H2D and ops[a].phase is Phase.REFRESH
    assert ops[a].n_bytes == 20  # 2 B/param cross the link
    assert ops[b].resource.kind is ResourceKind.GPU and ops[b].category is Category.CAST
