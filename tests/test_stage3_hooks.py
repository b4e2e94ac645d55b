"""DeepSpeed ZeRO-3's hooks interleave with a layer's kernels (sosim/schedules/blocks/stage3.py InterleavedHooks):
hand-computed three-layer plans, GPU pass 1 s per layer."""

from __future__ import annotations

import pytest
from helpers import tiny_scenario

from sosim import load_scenario
from sosim.costs.analytic import AnalyticCostModel, parameter_modules_per_layer
from sosim.engine.plan import GPU, Category, Phase, Plan
from sosim.engine.simpy_engine import run_plan
from sosim.hardware.model import tokens_per_gpu
from sosim.schedules.blocks import cpu, stage3
from sosim.schedules.blocks.driver import Ctx, pass_op
from sosim.schedules.blocks.layout import Tensor, Unit, make_flushes, make_layout, subgroups
from sosim.schedules.blocks.weights import Stage3Hooks


def _ctx() -> Ctx:
    sc = load_scenario(tiny_scenario({"system": "zero3_offload"}))
    costs = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    units = [Unit(i, f"layer{i}", 1, 1.0, 1.0, is_layer=True) for i in range(3)]
    tensors = [Tensor(i, i, 1) for i in range(3)]
    lay = make_layout(units, tensors, make_flushes(tensors, 1, "overflow"), subgroups(tensors, 1))
    return Ctx(sc, costs, Plan(), lay, cpu.one_process(8, "cpu_adam"))


def _run(hooks: stage3.InterleavedHooks | Stage3Hooks, sync_after_first: bool = False) -> tuple[float, list[float]]:
    """Forward of the three layers; optionally the host waits for layer 0's kernels (a stream sync) before
    layer 1's hooks. Returns the plan's end and each layer's GPU start."""
    ctx = _ctx()
    gpu_ops = []
    for u in ctx.layout.units:
        hooks.around(ctx, u, Phase.FORWARD)
        op = pass_op(ctx, u, Phase.FORWARD, [])
        gpu_ops.append(op)
        if sync_after_first and u.index == 0:
            ctx.host_op("stream_sync", 0.0, [op], Phase.FORWARD)
    start, end = run_plan(ctx.plan)
    return float(end.max()), [float(start[i]) for i in gpu_ops]


def test_short_hooks_hold_the_gpu_for_one_tensor_share_only() -> None:
    # 0.4 s of hooks over 4 tensors: the first layer starts after 0.1 s, the rest of the hooks run beside it.
    end, starts = _run(stage3.InterleavedHooks(0.4, 0.4, 1.0, 1.0, 4))
    assert starts == pytest.approx([0.1, 1.1, 2.1])
    assert end == pytest.approx(3.1)


def test_after_a_stream_sync_the_gpu_waits_for_one_piece_not_the_layer() -> None:
    # The host waits for layer 0 (ends at 1.1), then layer 1's lead (0.1 s): GPU idle 0.1 s.
    _end, starts = _run(stage3.InterleavedHooks(0.4, 0.4, 1.0, 1.0, 4), sync_after_first=True)
    assert starts[1] == pytest.approx(1.2)
    # The block model (weights.Stage3Hooks) idles the GPU for the whole 0.4 s of the layer's hooks.
    _end, block_starts = _run(Stage3Hooks(0.4, 0.4), sync_after_first=True)
    assert block_starts[1] == pytest.approx(0.4 + 1.0 + 0.4)


def test_hooks_longer_than_the_layer_still_bound_the_step() -> None:
    # 2 s of hooks against 1 s of GPU: lead = 2 - 1 = 1 s, so each layer ends when its last hook ends (host-bound:
    # 3 x 2 s), exactly as the block model.
    end, _starts = _run(stage3.InterleavedHooks(2.0, 2.0, 1.0, 1.0, 4))
    assert end == pytest.approx(6.0)
    block_end, _ = _run(Stage3Hooks(2.0, 2.0))
    assert block_end == pytest.approx(6.0 + 1.0)  # the block model adds one layer of GPU after the last hook


def test_deepspeed_hooks_split_by_the_layer_tensors_and_gpu_passes() -> None:
    sc = load_scenario(tiny_scenario({"system": "zero3_offload"}, activation_checkpointing=True))
    costs = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    h = stage3.deepspeed_hooks(sc, costs)
    assert h.modules == parameter_modules_per_layer(sc.model)
    assert h.fwd_gpu_s == pytest.approx(costs.layer_fwd_s())
    assert h.bwd_gpu_s == pytest.approx(costs.layer_bwd_s())  # recompute included
    # Backward runs the recompute's forward hooks again.
    assert h.bwd_s == pytest.approx(costs.stage3_hook_s(tokens_per_gpu(sc), True) + h.fwd_s)
    ctx = _ctx()
    h.around(ctx, ctx.layout.units[0], Phase.BACKWARD)
    hooks = [op for op in ctx.plan.ops if op.category is Category.HOOK]
    assert sum(op.duration_s for op in hooks) == pytest.approx(h.bwd_s)
    assert all(op.resource != GPU for op in hooks)
