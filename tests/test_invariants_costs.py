"""Cost-side invariants over every shipped scenario and profile, calibrated ones included.

* FLOP/s never exceed the peak: hardware_tflops <= peak per GPU and model FLOPs <= hardware FLOPs, for every
  shipped scenario on every shipped profile, and under random overrides of the GPU numbers.
* More bandwidth, cores or FLOP/s never slow a step (extends tests/test_schedules_core.py's property to the
  calibrated H200 profile, whose costs come from its measured table).
* The twin: a resource that the step waits on, made 2x slower, makes the step slower.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.inputs.errors import ConfigError
from sosim.run.loader import available_profiles

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
PROFILES = sorted(available_profiles())
CALIBRATED = ROOT / "scenarios" / "h200_x86_zero_offload_llama3b.yaml"
# Keep the properties fast: a 4-layer version of the calibrated scenario (same layer shape, same table rows).
SMALL = ["model.layers=4"]
TOL = 1e-9


def check_flops(metrics: dict[str, object], peak_tflops: float, where: str) -> None:
    hw = float(metrics["hardware_tflops"])  # type: ignore[arg-type]
    model = float(metrics["model_tflops"])  # type: ignore[arg-type]
    mfu = float(metrics["mfu"])  # type: ignore[arg-type]
    assert hw <= peak_tflops * (1 + TOL), f"{where}: hardware {hw:.1f} > peak {peak_tflops} TF/s"
    assert model <= hw * (1 + TOL), f"{where}: model FLOP/s {model:.1f} > hardware {hw:.1f}"
    assert 0.0 < mfu <= 1.0 + TOL, f"{where}: MFU {mfu}"


def test_flops_never_exceed_peak_on_every_scenario_and_profile() -> None:
    ran = 0
    for path in SCENARIOS:
        for profile in [None, *PROFILES]:
            overrides = [] if profile is None else [f"hardware={profile}"]
            try:
                sc = load_scenario(path, overrides)
            except ConfigError:
                continue  # e.g. GraceAdam on an x86 profile, or several GPUs without an interconnect
            r = simulate(sc)
            check_flops(r.metrics, sc.hardware.gpu.peak_bf16_tflops, f"{path.name} on {sc.hardware.name}")
            ran += 1
    assert ran >= len(SCENARIOS) * 2  # every scenario natively plus most cross-profile combinations


GPU_OVERRIDES = st.fixed_dictionaries(
    {},
    optional={
        "hardware.gpu.peak_bf16_tflops": st.floats(1.0, 5000.0),
        "hardware.gpu.attention_efficiency": st.floats(0.05, 1.0),
        "hardware.gpu.attention_bwd_factor": st.floats(0.5, 6.0),
        "hardware.gpu.gemm_efficiency": st.floats(0.05, 1.0).map(lambda e: [[1.0, e]]),
        "hardware.gpu.hbm_GBps": st.floats(100.0, 20000.0),
        "hardware.gpu.layer_min_fwd_us": st.floats(0.0, 5000.0),
        "hardware.gpu.elementwise_traffic_factor": st.floats(0.1, 10.0),
        "hardware.link.h2d_GBps": st.floats(0.5, 1000.0),
    },
)
FLOP_SCENARIOS = [CALIBRATED, ROOT / "scenarios" / "h200_x86_llama1.1b_zero2_measured.yaml",
                  ROOT / "scenarios" / "gh200x8_superoffload_ulysses_13b_1m.yaml",
                  ROOT / "scenarios" / "gh200_superoffload_flow_13b_64k.yaml",
                  ROOT / "scenarios" / "h100_gpu_only_llama2b.yaml"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(FLOP_SCENARIOS), overrides=GPU_OVERRIDES)
def test_flops_never_exceed_peak_under_overrides(path: Path, overrides: dict[str, object]) -> None:
    sets = [f"{k}={v}" for k, v in overrides.items()]
    sc = load_scenario(path, sets)
    check_flops(simulate(sc).metrics, sc.hardware.gpu.peak_bf16_tflops, f"{path.name} {sets}")


# ---- monotonicity on the calibrated profile -----------------------------------------------------------------

SYSTEMS: dict[str, list[str]] = {
    name: [f"schedule={{{spec}}}"]
    for name, spec in {
        "zero_offload": "system: zero_offload",
        "zero_offload_ds": "system: zero_offload, implementation: deepspeed",
        "zero3_offload_ds": "system: zero3_offload, implementation: deepspeed, sub_group_elements: 1.0e+8",
        "zero_infinity": "system: zero_infinity, sub_group_elements: 1.0e+8",
        "superoffload": "system: superoffload, cpu_adam: cpu_adam, bucket_mb: 64",
        "superoffload_ds": "system: superoffload, implementation: deepspeed, sub_group_elements: 1.0e+8",
        "gpu_only": "system: gpu_only",
    }.items()
}
# Hardware numbers and their baseline values on the calibrated profile; "more" = multiplied by >= 1.
MORE = {
    "hardware.link.h2d_GBps": 55.5, "hardware.link.d2h_GBps": 55.4, "hardware.link.bidir_GBps": 100.0,
    "hardware.cpu.cores": 16, "hardware.cpu.cast_GBps": 45.0, "hardware.cpu.mem_GBps": 105.0,
    "hardware.gpu.peak_bf16_tflops": 989.0, "hardware.gpu.hbm_GBps": 4800.0,
}
def _value(key: str, factor: float) -> float | int:
    base = MORE[key]
    return round(base * factor) if isinstance(base, int) else base * factor


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from(sorted(SYSTEMS)), key=st.sampled_from(sorted(MORE)), factor=st.floats(1.0, 8.0),
       clipping=st.sampled_from([0.0, 1.0]))
def test_more_hardware_never_slows_a_calibrated_step(system: str, key: str, factor: float, clipping: float) -> None:
    base = [*SMALL, *SYSTEMS[system], f"training.gradient_clipping={clipping}"]
    slow = simulate(load_scenario(CALIBRATED, base))
    fast = simulate(load_scenario(CALIBRATED, [*base, f"{key}={_value(key, factor)}"]))
    assert slow.provenance["cost_model"] == "table"
    assert fast.metrics["step_time_s"] <= slow.metrics["step_time_s"] * (1 + TOL)


# ---- the twin: a resource the step waits on, 2x slower, slows the step --------------------------------------

# Every number that sets the speed of one resource, halved (or its time doubled).
SLOWER: dict[str, list[str]] = {
    "gpu": ["hardware.gpu.peak_bf16_tflops=494.5", "hardware.gpu.hbm_GBps=2400", "hardware.gpu.layer_min_fwd_us=2400"],
    "link": ["hardware.link.h2d_GBps=27.75", "hardware.link.d2h_GBps=27.7", "hardware.link.bidir_GBps=50",
             "hardware.link.latency_us=20"],
    "cpu": ["hardware.cpu.cast_GBps=22.5", "hardware.cpu.mem_GBps=52.5",
            "hardware.cpu.adam_s_by_gparams={torch: [[0.001, 0.001078], [0.01, 0.01994], [0.1, 0.1942]], "
            "cpu_adam: [[0.001, 0.0001696], [0.01, 0.001906], [0.1, 0.0532]]}"],
}
# Breakdown buckets in which only that resource works while the GPU waits (so it is on the critical path).
WAITED_ON = {"gpu": ("gpu_compute_s", "gpu_other_s"), "link": ("exposed_h2d_s", "exposed_d2h_s"),
             "cpu": ("exposed_cpu_optimizer_s", "exposed_cpu_cast_s")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.sampled_from(sorted(SYSTEMS)), resource=st.sampled_from(sorted(SLOWER)),
       clipping=st.sampled_from([0.0, 1.0]))
def test_a_waited_on_resource_twice_as_slow_slows_the_step(system: str, resource: str, clipping: float) -> None:
    base = [*SMALL, *SYSTEMS[system], f"training.gradient_clipping={clipping}"]
    ref = simulate(load_scenario(CALIBRATED, base))
    waited_s = sum(float(ref.metrics[k]) for k in WAITED_ON[resource])
    slow = simulate(load_scenario(CALIBRATED, [*base, *SLOWER[resource]]))
    if waited_s <= 0.01 * ref.metrics["step_time_s"]:
        assert slow.metrics["step_time_s"] >= ref.metrics["step_time_s"] * (1 - TOL)  # never faster
        return
    # Every op of the resource takes >= its old time, and the GPU waited on it alone for waited_s.
    assert slow.metrics["step_time_s"] > ref.metrics["step_time_s"] * (1 + 1e-6)
