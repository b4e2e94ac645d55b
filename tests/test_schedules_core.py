"""gpu_only and zero_offload: hand-computed step times and monotonicity invariants."""

from __future__ import annotations

import pytest
from helpers import tiny_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.costs.analytic import AnalyticCostModel
from sosim.hardware.model import tokens_per_gpu, total_params
from sosim.schedules.blocks.layout import build_units


def _costs(sc):  # the same cost model simulate() builds for a profile without calibration
    return AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))


def test_gpu_only_step_is_forward_backward_and_gpu_adam() -> None:
    sc = load_scenario(tiny_scenario({"system": "gpu_only"}))
    c = _costs(sc)
    units = build_units(sc, c)
    expected = sum(u.fwd_s + u.bwd_s for u in units) + c.gpu_adam_s(total_params(sc.model))
    r = simulate(sc)
    assert r.metrics["step_time_s"] == pytest.approx(expected, rel=1e-12)
    assert r.metrics["gpu_busy_frac"] == pytest.approx(1.0)


def test_zero_offload_one_bucket_serialises_the_cpu_step() -> None:
    # One bucket holding the whole model: the step is F + B, then D2H, CPU fp32 accumulate, norm, Adam,
    # H2D, strictly one after the other (nothing to overlap with).
    sc = load_scenario(tiny_scenario({"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1e6}))
    c = _costs(sc)
    p = total_params(sc.model)
    units = build_units(sc, c)
    cores = sc.hardware.cpu.cores
    expected = (
        sum(u.fwd_s + u.bwd_s for u in units)
        + c.copy_s(2 * p, "d2h", True)
        + c.cpu_cast_s(p, cores)
        + c.cpu_norm_s(p)
        + c.cpu_adam_s(p, "cpu_adam", cores, p)
        + c.copy_s(2 * p, "h2d", True)
    )
    r = simulate(sc)
    assert r.metrics["step_time_s"] == pytest.approx(expected, rel=1e-12)
    # By hand for the tiny profile: Adam is 0.5 s per 1e9 params, so p params cost 0.5 * p / 1e9 s.
    assert c.cpu_adam_s(p, "cpu_adam", cores, p) == pytest.approx(0.5 * p / 1e9)
    assert c.copy_s(2 * p, "d2h", True) == pytest.approx(2 * p / 20e9)
    bd = r.metrics
    parts = ["gpu_compute_s", "gpu_other_s", "exposed_cpu_optimizer_s", "exposed_cpu_cast_s",
             "exposed_d2h_s", "exposed_h2d_s", "exposed_comm_s", "idle_s"]
    assert sum(bd[k] for k in parts) == pytest.approx(bd["step_time_s"], rel=1e-9)
    assert bd["exposed_h2d_s"] == pytest.approx(c.copy_s(2 * p, "h2d", True), rel=1e-9)


def test_no_clipping_in_bf16_skips_the_norm_pass() -> None:
    one_bucket = {"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1e6}
    with_norm = simulate(load_scenario(tiny_scenario(one_bucket)))
    without = simulate(load_scenario(tiny_scenario(one_bucket, gradient_clipping=0.0)))
    sc = without.scenario
    p = total_params(sc.model)
    assert with_norm.metrics["step_time_s"] - without.metrics["step_time_s"] == pytest.approx(
        _costs(sc).cpu_norm_s(p), rel=1e-9)


def test_dpu_hides_the_cpu_step_behind_the_next_iteration() -> None:
    base = {"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1e6}
    plain = simulate(load_scenario(tiny_scenario(base, iterations=6)))
    dpu = simulate(load_scenario(tiny_scenario({**base, "dpu": True}, iterations=6)))
    assert dpu.metrics["step_time_s"] < plain.metrics["step_time_s"]
    # Steady state with DPU: max(GPU work, CPU-side chain) per step.
    sc = dpu.scenario
    c = _costs(sc)
    gpu = sum(u.fwd_s + u.bwd_s for u in build_units(sc, c))
    assert dpu.metrics["step_time_s"] >= gpu - 1e-12


SCALINGS = {
    "hardware.link.h2d_GBps": 20.0, "hardware.link.d2h_GBps": 20.0, "hardware.cpu.cores": 8,
    "hardware.cpu.adam_saturation_cores": 8, "hardware.gpu.peak_bf16_tflops": 100.0,
    "hardware.cpu.cast_GBps": 50.0,
}


SYSTEMS = {
    "gpu_only": {"system": "gpu_only"},
    "zero_offload": {"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1.0},
    "zero_offload_dpu": {"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1.0, "dpu": True},
    "zero_offload_ds": {"system": "zero_offload", "implementation": "deepspeed", "bucket_mb": 1.0},
    "zero3_offload": {"system": "zero3_offload", "implementation": "ideal", "sub_group_elements": 5e5},
    "zero3_offload_ds": {"system": "zero3_offload", "implementation": "deepspeed", "sub_group_elements": 5e5},
    "zero_infinity": {"system": "zero_infinity", "implementation": "ideal", "sub_group_elements": 5e5},
    "zero_infinity_ds": {"system": "zero_infinity", "implementation": "deepspeed", "sub_group_elements": 5e5},
    "superoffload": {"system": "superoffload", "implementation": "ideal", "cpu_adam": "cpu_adam", "bucket_mb": 1.0,
                     "weight_placement": "stationary"},
    "superoffload_flow": {"system": "superoffload", "implementation": "ideal", "cpu_adam": "cpu_adam",
                          "bucket_mb": 1.0, "weight_placement": "flow"},
    "superoffload_ds": {"system": "superoffload", "implementation": "deepspeed", "sub_group_elements": 5e5},
}


@settings(max_examples=80, deadline=None)
@given(
    key=st.sampled_from(sorted(SCALINGS)),
    factor=st.floats(1.0, 8.0),
    system=st.sampled_from(sorted(SYSTEMS)),
    clipping=st.sampled_from([0.0, 1.0]),
)
def test_more_hardware_never_makes_a_step_slower(key: str, factor: float, system: str, clipping: float) -> None:
    base = tiny_scenario(SYSTEMS[system], gradient_clipping=clipping)
    value = SCALINGS[key] * factor
    if isinstance(SCALINGS[key], int):
        value = round(value)
    slow = simulate(load_scenario(base))
    fast = simulate(load_scenario(base, [f"{key}={value}"]))
    assert fast.metrics["step_time_s"] <= slow.metrics["step_time_s"] * (1 + 1e-9)


def test_overlap_comm_off_is_never_faster() -> None:
    base = {"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1.0}
    on = simulate(load_scenario(tiny_scenario(base)))
    off = simulate(load_scenario(tiny_scenario({**base, "overlap_comm": False})))
    assert off.metrics["step_time_s"] >= on.metrics["step_time_s"]


def test_infeasible_result_names_the_side_and_the_bytes() -> None:
    sc = load_scenario(tiny_scenario({"system": "gpu_only"}), ["hardware.gpu.hbm_gib=0.001"])
    r = simulate(sc)
    assert r.metrics["feasible"] is False
    assert r.metrics["reason"].startswith("GPU memory: needs")
    assert "GiB" in r.metrics["reason"] and "tinygpu" in r.metrics["reason"]
