"""DeepSpeed paths fed by the 2026-11-30 component measurements (issue 9): step() pieces, the unscale pass,
the worker round trip, the refresh and the hook host time, on hand-computed values and tiny plans."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import tiny_scenario

from sosim import load_scenario
from sosim.costs.analytic import AnalyticCostModel, model_parameter_tensors
from sosim.costs.calibration_table import CalibrationTable
from sosim.costs.table import STEP_FIXED_MEASURED_TENSORS, TableCostModel
from sosim.engine.plan import Category, Phase, Plan, ResourceKind
from sosim.engine.simpy_engine import run_plan
from sosim.hardware.model import tokens_per_gpu
from sosim.schedules.blocks import cpu
from sosim.schedules.blocks.driver import Ctx
from sosim.schedules.blocks.layout import Tensor, Unit, make_flushes, make_layout, subgroups
from sosim.schedules.blocks.steps import Stage2Step, Stage3Step
from tests.test_whatif import H200, costs_of

ROOT = Path(__file__).resolve().parents[1]
DAY2 = CalibrationTable.from_csv(ROOT / "calibration" / "nvidia-h200-2026-11-30" / "measurements.csv")


def _piece(variant: str, name: str) -> float:
    p = DAY2.ds_step_piece(variant, name)
    assert p is not None
    return p[0]


def test_step_fixed_pieces_scale_by_what_they_loop_over() -> None:
    c = costs_of(H200)  # Llama 3B of 28 layers: 28 x 9 + 3 tensors
    tensors = model_parameter_tensors(c.model)
    assert tensors == c.model.layers * 9 + 3
    sg = 12
    norm = _piece("zero3", "norm") / 5 * sg  # measured over 5 sub-groups
    part = _piece("zero3", "partition_all") * tensors / STEP_FIXED_MEASURED_TENSORS
    fixed = sum(_piece("zero3", n) for n in ("pre_step", "overflow_check", "post_step"))
    assert c.ds_step_fixed_s(1e9, sg, "zero3_offload") == pytest.approx(norm + part + fixed, rel=1e-12)
    # The measured model itself: the pieces add back to step()'s fixed part minus its unscale pass.
    whole = _piece("zero3", "norm") + _piece("zero3", "partition_all") + fixed
    assert whole == pytest.approx(0.041347811 - _piece("zero3", "unscale_clip"), abs=2e-3)


def test_unscale_is_a_per_element_pass_at_the_measured_rate() -> None:
    c = costs_of(H200)
    rate = _piece("zero3", "unscale_clip") / 491816960
    assert c.ds_unscale_clip_s(1e8, "zero3_offload") == pytest.approx(rate * 1e8, rel=1e-12)
    assert 0.055 < rate * 1e9 < 0.07  # 0.062 s per 1e9 (docs/calibration.md)
    assert c.ds_unscale_clip_s(1e8, "superoffload") > c.ds_unscale_clip_s(1e8, "zero3_offload")


def test_worker_round_trip_is_the_measured_one_minus_its_adam() -> None:
    c = costs_of(H200)
    total = DAY2.so_worker_time_s(1e8, "alone")
    assert total is not None
    adam = c.cpu_adam_s(1e8, "cpu_adam", 13, 1e8)  # the worker's 13 threads, 2026-11-29 cpu_adam rows
    assert c.so_worker_roundtrip_s(1e8) == pytest.approx(total - adam, rel=1e-12)
    # Adam + the rest = the measured round trip; while the main process copies it is slower.
    assert c.so_worker_roundtrip_s(1e8) + adam == pytest.approx(0.057953809, rel=1e-9)
    assert c.so_worker_roundtrip_s(1e8, True) > c.so_worker_roundtrip_s(1e8)


def test_refresh_and_hooks_as_measured() -> None:
    c = costs_of(H200)
    assert c.ds_refresh_s(1e8, 16, False, "zero3_offload") == pytest.approx(0.05536325, rel=1e-9)
    # SuperOffload's variant answers at the pool's 16 threads as measured (main thread on 3 cores).
    assert c.ds_refresh_s(1e8, 16, False, "superoffload") == pytest.approx(0.055907998, rel=1e-9)
    # The H200 scenario's layer is not measured (hidden 3072): nearest measured hidden (4096) at its tokens.
    assert c.stage3_hook_s(8192, False) == pytest.approx(0.00988740725, rel=1e-9)
    assert c.stage3_hook_s(8192, True) == pytest.approx(0.0230463155 - 0.00988740725, rel=1e-9)


def _tiny(schedule: dict, n_groups: int, flush_cap: int, **training: object) -> Ctx:  # type: ignore[type-arg]
    sc = load_scenario(tiny_scenario(schedule, **training))
    costs = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    units = [Unit(i, f"layer{i}", 1, 1.0, 1.0, is_layer=True) for i in range(n_groups)]
    tensors = [Tensor(i, i, 10**8) for i in range(n_groups)]
    lay = make_layout(units, tensors, make_flushes(tensors, flush_cap, "overflow"), subgroups(tensors, 10**8))
    return Ctx(sc, costs, Plan(), lay, cpu.split_cores(16, 0.8, False, "cpu_adam"))


class _Spy:
    """Records the worker round trips asked for (with_copies or not)."""

    def __init__(self, costs: object) -> None:
        self.costs = costs
        self.asked: list[bool] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.costs, name)

    def so_worker_roundtrip_s(self, elements: float, with_copies: bool = False) -> float:
        self.asked.append(with_copies)
        return 0.01


def test_every_handed_over_subgroup_pays_the_worker_round_trip_measured_alone() -> None:
    ctx = _tiny({"system": "superoffload"}, 3, 10**8, gradient_clipping=0.0)  # 3 flushes, 3 sub-groups
    spy = _Spy(ctx.costs)
    ctx.costs = spy  # type: ignore[assignment]
    step = Stage3Step(lambda c, g, d: d[-1], system="superoffload", worker=True, handed_off=True)
    # Flush 0 (sub-group 2, backward order) and flush 1 (sub-group 1) leave while flush 2 is still to come; the
    # main process's copies meanwhile are ops of their own, so no sub-group takes the with_copies rows (those
    # load the main process without a pause, which backward does not; docs/model.md).
    for g in reversed(ctx.layout.groups):
        arrival = ctx.add(ctx.cpu.host, f"arrive{g.index}", 0.0, [], phase=Phase.GRADIENT, category=Category.SYNC)
        step.on_done(ctx, g, arrival)
    assert spy.asked == [False, False, False]


@pytest.mark.parametrize(("clip", "has_unscale"), [(0.0, False), (1.0, True)])
def test_stage2_unscale_pass_only_with_clipping(clip: float, has_unscale: bool) -> None:
    ctx = _tiny({"system": "zero_offload"}, 2, 10**9, gradient_clipping=clip)
    ctx.cpu = cpu.one_process(16, "cpu_adam")
    step = Stage2Step(lambda c, g, d: d[-1])
    step.run(ctx, {}, -1)
    names = [o.name for o in ctx.plan.ops]
    assert ("unscale_clip" in names) is has_unscale
    run_plan(ctx.plan)
    assert all(o.resource.kind is ResourceKind.CPU_MAIN for o in ctx.plan.ops)


def test_table_model_reads_pieces_only_when_all_are_there(tmp_path: Path) -> None:
    # A table with whole-step rows only keeps the old fit (its rows include the unscale pass).
    c = costs_of(H200)
    t = TableCostModel.from_analytic(AnalyticCostModel(c.hw, c.model, c.training, c.tokens_per_gpu),
                                     CalibrationTable.from_csv(ROOT / "calibration" / "nvidia-h200-2026-11-29"
                                                               / "measurements.csv"))
    assert t.ds_step_fixed_s(1e9, 10, "zero3_offload") == t._now.ds_step_fixed_s(1e9, 10, "zero3_offload")


@pytest.mark.parametrize("waits", [False, True])
def test_stage2_overflow_check_makes_the_backward_wait_for_each_flush(waits: bool) -> None:
    """Three 1 s layers, three flushes (f0 after layer 1's backward, f1 and f2 at the end: overflow rule), each
    1 s of GPU cast and 1 s of copy on a side stream (overlap_comm). Without the host wait the copies run
    beside the backward: the last layer ends at 3 s, the copies at 6 s. With it (0.19.8's per-parameter
    overflow check) layer 0 is issued only after f0's copy (4 s) and ends at 5 s; f1 runs 5-7 s and f2, queued
    by the host after f1's check, 7-9 s."""
    from sosim.schedules.blocks.driver import pass_op
    from sosim.schedules.blocks.gradients import Stage2Gradients
    from tests.test_blocks import _UnitCopies

    ctx = _tiny({"system": "zero_offload"}, 3, 1)
    ctx.costs = _UnitCopies()  # type: ignore[assignment]
    grads = Stage2Gradients(overlap_comm=True, pinned=True, host_waits_for_copies=waits)
    grads.start(ctx)
    last_bwd = -1
    for u in reversed(ctx.layout.units):
        last_bwd = pass_op(ctx, u, Phase.BACKWARD, [])
        grads.after_backward(ctx, u, last_bwd, lambda c, g, a: None)
    _start, end = run_plan(ctx.plan)
    assert float(end[last_bwd]) == pytest.approx(5.0 if waits else 3.0)
    assert float(end.max()) == pytest.approx(9.0 if waits else 6.0)
