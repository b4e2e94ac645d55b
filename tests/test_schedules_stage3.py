"""The ZeRO-3 family: each SuperOffload technique (paper schedule) and DeepSpeed 0.19.8's rules, on tiny
scenarios whose numbers can be checked by hand. Ops are selected by their typed fields, never by name."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest
from helpers import tiny_scenario

from sosim import ConfigError, load_scenario, simulate
from sosim.costs.analytic import AnalyticCostModel
from sosim.engine.plan import Phase, ResourceKind
from sosim.hardware.model import tokens_per_gpu, total_params
from sosim.run.result import Result
from sosim.schedules.zero3_offload import Zero3OffloadKnobs

ROOT = Path(__file__).resolve().parent.parent
SO = {"system": "superoffload", "implementation": "ideal", "cpu_adam": "cpu_adam", "weight_placement": "stationary",
      "gpu_optimizer_fraction": 0.0, "bucket_mb": 1.0}
SO_DS = {"system": "superoffload", "implementation": "deepspeed", "sub_group_elements": 1e5, "bucket_mb": 0.2}
Z3_DS = {"system": "zero3_offload", "implementation": "deepspeed", "sub_group_elements": 1e5, "bucket_mb": 0.2}


def _run(schedule: dict, overrides: list[str] | None = None, **training) -> Result:  # type: ignore[type-arg, no-untyped-def]
    return simulate(load_scenario(tiny_scenario(schedule, **training), overrides))


def _steady(r: Result) -> pd.DataFrame:
    s = r.spans
    return s[s.iteration == r.plan.measured_iteration]


def _busy(r: Result, resource: str, category: str | None = None) -> float:
    s = _steady(r)
    s = s[s.resource == resource]
    if category is not None:
        s = s[s.category == category]
    return float((s.end_s - s.start_s).sum())


def _last_backward_end(s: pd.DataFrame) -> float:
    return float(s[(s.phase == "backward") & (s.category == "compute")].end_s.max())


def _cpu_adam(s: pd.DataFrame) -> pd.DataFrame:
    return s[(s.phase == "optimizer") & (s.category == "optimizer") & s.resource.str.startswith("cpu_opt")]


# --- the paper's schedule --------------------------------------------------------------------------------------
def test_gpu_casting_doubles_link_bytes_and_removes_cpu_casts() -> None:
    gpu = _run({**SO, "cast": "gpu"})
    cpu = _run({**SO, "cast": "cpu"})
    p = total_params(gpu.scenario.model)
    # cast on CPU: bf16 grads down (2 B) + bf16 params up (2 B); on GPU: fp32 both ways (4 + 4).
    assert cpu.metrics["link_gb_per_step"] == pytest.approx(4 * p / 1e9)
    assert gpu.metrics["link_gb_per_step"] == pytest.approx(2 * cpu.metrics["link_gb_per_step"])
    # With all cores given to Adam, the CPU casts share its resource (they compete for the same cores).
    assert _busy(gpu, "cpu_opt", "cast") == 0.0
    sc = cpu.scenario
    costs = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    # Two CPU casts per parameter per step (gradients to fp32, parameters to bf16), linear in elements.
    assert _busy(cpu, "cpu_opt", "cast") == pytest.approx(2 * costs.cpu_cast_s(p, sc.hardware.cpu.cores), rel=1e-9)


def test_speculation_starts_adam_during_backward() -> None:
    # A fast CPU Adam, so that the step is not bound by the CPU alone (then overlap cannot help).
    fast = ["hardware.cpu.adam_s_by_gparams.cpu_adam=[[1.0, 0.02]]"]
    spec = _run({**SO, "speculation": True}, fast, gradient_clipping=0.0)
    plain = _run({**SO, "speculation": False}, fast, gradient_clipping=0.0)
    for r, overlaps in ((spec, True), (plain, False)):
        s = _steady(r)
        assert bool(_cpu_adam(s).start_s.min() < _last_backward_end(s)) is overlaps
    assert spec.metrics["step_time_s"] < plain.metrics["step_time_s"]


def test_gpu_optimizer_fraction_keeps_first_buckets_off_the_link() -> None:
    none = _run({**SO, "gpu_optimizer_fraction": 0.0})
    tail = _run({**SO, "gpu_optimizer_fraction": 0.5})
    assert tail.metrics["link_gb_per_step"] < none.metrics["link_gb_per_step"]
    gpu_adam = lambda r: _steady(r)[(_steady(r).resource == "gpu") & (_steady(r).phase == "optimizer")]  # noqa: E731
    assert len(gpu_adam(tail)) > 0 and len(gpu_adam(none)) == 0
    assert tail.memory.gpu_bytes["gpu_optimizer_state"] > 0


def test_rollback_cost_scales_with_clip_rate() -> None:
    base = _run({**SO, "speculation": True}, clip_rate=0.0)
    rolled = _run({**SO, "speculation": True}, clip_rate=0.5)
    assert rolled.metrics["step_time_s"] > base.metrics["step_time_s"]


def test_weight_flow_streams_weights_twice_and_frees_hbm() -> None:
    eight = ["model.layers=8"]  # more layers than the prefetch window, so streaming saves HBM
    sched = {"implementation": "ideal", "sub_group_elements": 1e5}
    inf = _run({"system": "zero_infinity", **sched}, eight)
    z3 = _run({"system": "zero3_offload", **sched}, eight)
    m = inf.scenario.model
    layer_p = total_params(m) - (m.vocab * m.hidden * 2 + 2 * m.hidden)
    p = total_params(m)
    # ZeRO-3 offload: bf16 grads down + bf16 params up (4 B/param). ZeRO-Infinity: the same grads, no
    # refresh copy (weights stay on the CPU), but layer weights fetched in forward and again in backward.
    assert z3.metrics["link_gb_per_step"] == pytest.approx(4 * p / 1e9)
    assert inf.metrics["link_gb_per_step"] == pytest.approx((2 * p + 2 * 2 * layer_p) / 1e9)
    assert inf.metrics["gpu_mem_peak_gib"] < z3.metrics["gpu_mem_peak_gib"]


def test_auto_placement_falls_back_to_flow_when_weights_do_not_fit() -> None:
    fits = _run({**SO, "weight_placement": "auto"})
    assert fits.provenance["weight_placement"] == "stationary"
    d = tiny_scenario({**SO, "weight_placement": "auto"})
    d["hardware"]["gpu"]["hbm_gib"] = 0.02
    small = simulate(load_scenario(d))
    assert small.provenance["weight_placement"] == "flow"
    assert "does not fit" in small.provenance["placement_reason"]


# --- DeepSpeed 0.19.8 -------------------------------------------------------------------------------------------
def test_deepspeed_superoffload_moves_ten_bytes_per_param() -> None:
    ds = _run(SO_DS, gradient_clipping=0.0)
    p = total_params(ds.scenario.model)
    # grads: bf16 down (2) + bf16 up (2) + fp32 down (4); params: bf16 up after the CPU cast (2).
    assert ds.metrics["link_gb_per_step"] == pytest.approx(10 * p / 1e9)
    assert ds.provenance["speculation_active"] == "True"
    assert _run(SO_DS, gradient_clipping=1.0).provenance["speculation_active"] == "False"


def test_deepspeed_superoffload_adam_overlaps_backward_only_without_clipping() -> None:
    for clip, overlaps in ((0.0, True), (1.0, False)):
        s = _steady(_run(SO_DS, gradient_clipping=clip))
        adam = _cpu_adam(s)
        assert len(adam) > 1
        assert bool(adam.start_s.min() < _last_backward_end(s)) is overlaps
        if not overlaps:
            # Clipping: synchronous per sub-group after backward: each update starts after the previous
            # sub-group's refresh (one host thread).
            refresh = s[s.phase == "refresh"].sort_values("start_s")
            starts = adam.sort_values("start_s").start_s.to_numpy()[1:]
            assert all(a >= e - 1e-12 for a, e in zip(starts, refresh.end_s.to_numpy()[:-1]))


def test_deepspeed_superoffload_host_waits_for_every_flush() -> None:
    r = _run(SO_DS, gradient_clipping=0.0)
    s = _steady(r)
    flushes = s[(s.phase == "gradient") & (s.op.str.contains("d2h_fp32"))]
    syncs = s[(s.phase == "gradient") & (s.category == "sync") & (s.resource == "cpu_main")
              & (s.end_s > 0) & ~s.op.str.contains("backpressure|stream_sync")]
    assert len(syncs) == len(flushes) > 1
    z3 = _steady(_run(Z3_DS))
    # ZeRO-3 does not wait per flush: one sync at the end of backward (plus back-pressure waits).
    z3_syncs = z3[(z3.phase == "gradient") & (z3.category == "sync") & ~z3.op.str.contains("backpressure")]
    assert len(z3_syncs) == 1


def test_deepspeed_refresh_is_one_blocking_op_per_subgroup() -> None:
    for sched in (Z3_DS, SO_DS):
        r = _run(sched)
        s = _steady(r)
        refresh = s[s.phase == "refresh"].sort_values("start_s")
        assert (refresh.resource == "h2d").all()
        # One op per sub-group (the tiny model has several at sub_group_elements 1e5).
        cpu_groups = {o.group for o in r.plan.ops if o.phase is Phase.OPTIMIZER and o.group >= 0
                      and o.iteration == r.plan.measured_iteration}
        assert len(refresh) == len(cpu_groups) > 1
        # One after the other (the host thread blocks in each copy_), and the next forward after the last.
        assert all(b >= a - 1e-12 for a, b in zip(refresh.end_s.to_numpy()[:-1], refresh.start_s.to_numpy()[1:]))
        nxt = r.spans[(r.spans.iteration == r.plan.measured_iteration + 1) & (r.spans.phase == "forward")]
        assert float(nxt.start_s.min()) >= float(refresh.end_s.max()) - 1e-12


def test_deepspeed_zero3_alternates_adam_and_copy_per_subgroup() -> None:
    s = _steady(_run(Z3_DS))
    adams = s[(s.phase == "optimizer") & (s.category == "optimizer") & (s.op.str.startswith("cpu_adam"))]
    adams = adams.sort_values("start_s")
    copies = s[s.phase == "refresh"].sort_values("start_s")
    assert len(adams) > 1
    # Adam of sub-group k+1 starts only after the copy of sub-group k has finished.
    assert all(a >= c - 1e-12 for a, c in zip(adams.start_s.iloc[1:], copies.end_s.iloc[:-1]))
    assert float(adams.start_s.min()) >= _last_backward_end(s)


def test_bucket_mb_below_a_layer_changes_the_deepspeed_plan() -> None:
    base = ROOT / "scenarios/gh200_zero3_offload_4b.yaml"
    two = ["model.layers=2"]  # a 4B-shape layer holds ~64M parameters = 128 MB of bf16 gradients
    flushes = {}
    for mb in (16, 64):
        r = simulate(load_scenario(base, [*two, f"schedule.bucket_mb={mb}"]))
        s = _steady(r)
        flushes[mb] = int((s.op.str.startswith("grad_d2h_bf16")).sum())
    assert flushes[16] > flushes[64] > 2


def test_ratio_below_one_keeps_subgroups_on_the_gpu() -> None:
    full = _run(SO_DS, gradient_clipping=0.0)
    part = _run({**SO_DS, "gpu_optimizer_fraction": 0.5}, gradient_clipping=0.0)
    p = total_params(full.scenario.model)
    gpu_ops = _steady(part)
    on_gpu = gpu_ops[(gpu_ops.resource == "gpu") & (gpu_ops.phase == "optimizer") & (gpu_ops.category == "optimizer")]
    assert len(on_gpu) > 0
    # GPU sub-groups: no fp32 gradient copy (4 B), no refresh copy (2 B); the bf16 round trip stays (4 B).
    cpu_adam = _cpu_adam(gpu_ops)
    it = part.plan.measured_iteration
    cpu_params = sum(o.n_bytes for o in part.plan.ops
                     if o.iteration == it and o.phase is Phase.REFRESH and o.resource.kind is ResourceKind.H2D) / 2
    assert 0 < cpu_params < p
    assert part.metrics["link_gb_per_step"] == pytest.approx((4 * p + 6 * cpu_params) / 1e9)
    assert len(cpu_adam) < len(_cpu_adam(_steady(full)))


def test_cpu_adam_core_fraction_has_no_cliff() -> None:
    base = ROOT / "scenarios/gh200_zero3_offload_4b.yaml"
    steps = {f: simulate(load_scenario(base, ["schedule.system=superoffload",
                                              f"schedule.cpu_adam_core_fraction={f}"])).metrics["step_time_s"]
             for f in (0.5, 0.75, 0.9, 0.99, 1.0)}
    # More cores for the worker never slows the step; 0.99 of 72 cores leaves int(0.72) = 0 cores to the
    # training process, which psutil reads as "all cores": the same as 1.0.
    values = list(steps.values())
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(values))
    assert steps[0.99] == steps[1.0]
    with pytest.raises(ConfigError, match="cpu_adam_core_fraction"):
        load_scenario(base, ["schedule.cpu_adam_core_fraction=0.5"])  # ZeRO-3: Adam runs in-process


def test_defaults_have_one_source() -> None:
    direct = Zero3OffloadKnobs(system="zero3_offload", implementation="ideal")
    via = load_scenario(tiny_scenario({"system": "zero3_offload", "implementation": "ideal"})).schedule
    assert direct == via and direct.sub_group_elements == 6e8
    assert Zero3OffloadKnobs(system="zero3_offload").implementation == "deepspeed"
    assert Zero3OffloadKnobs(system="zero3_offload").sub_group_elements == 1e9
