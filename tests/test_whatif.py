"""What-if on a calibrated machine: overriding a hardware number rescales the measured costs it governs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sosim import load_scenario, simulate
from sosim.costs.analytic import AnalyticCostModel
from sosim.costs.table import TableCostModel, hardware_changes
from sosim.hardware.model import tokens_per_gpu
from sosim.run.loader import find_baseline, load_profile

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "scenarios" / "h200_x86_zero_offload_llama3b.yaml"
MEASURED = ROOT / "scenarios" / "h200_x86_llama1.1b_zero2_measured.yaml"
SLOW_LINK = ["hardware.link.h2d_GBps=1", "hardware.link.d2h_GBps=1"]


def costs_of(path: Path, overrides: list[str] | None = None) -> TableCostModel:
    sc = load_scenario(path, overrides)
    analytic = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    return TableCostModel.from_profile(analytic)


def test_the_baseline_is_the_profile_file_that_names_the_table() -> None:
    c = costs_of(H200, SLOW_LINK)
    assert c.baseline_source.endswith("h200-pcie-gen5-x86.yaml")
    assert hardware_changes(c.baseline, c.hw) == {"link.h2d_GBps": (55.5, 1.0), "link.d2h_GBps": (55.4, 1.0)}
    # Without overrides nothing differs and every factor is exactly 1.
    plain = costs_of(H200)
    assert hardware_changes(plain.baseline, plain.hw) == {}


def test_slow_link_rescales_the_measured_copy_curves() -> None:
    base, slow = costs_of(H200), costs_of(H200, SLOW_LINK)
    n = 256 * 2**20
    for direction, bw in (("h2d", 55.5), ("d2h", 55.4)):
        for pinned in (True, False):
            measured = base.copy_s(n, direction, pinned)  # type: ignore[arg-type]
            # Factor = analytic(1 GB/s) / analytic(baseline): latency + bytes / bandwidth on both sides.
            a_now = slow._now.copy_s(n, direction, pinned)  # type: ignore[arg-type]
            a_base = base._now.copy_s(n, direction, pinned)  # type: ignore[arg-type]
            assert slow.copy_s(n, direction, pinned) == pytest.approx(measured * a_now / a_base, rel=1e-12)  # type: ignore[arg-type]
            assert a_now / a_base == pytest.approx(bw, rel=0.01)  # ~ the bandwidth ratio at 256 MiB
    # Compute is untouched.
    assert slow.layer_fwd_s() == base.layer_fwd_s()


def test_issue_numbers_slow_link_and_low_peak() -> None:
    """issue 8: link=1 GB/s used to give the same step time; peak=100 gave MFU 1.08."""
    base = simulate(load_scenario(H200))
    slow = simulate(load_scenario(H200, SLOW_LINK))
    assert slow.metrics["step_time_s"] > 5 * base.metrics["step_time_s"]
    low = simulate(load_scenario(H200, ["hardware.gpu.peak_bf16_tflops=100"]))
    assert low.metrics["step_time_s"] > base.metrics["step_time_s"]
    assert low.metrics["mfu"] < 1.0
    assert low.metrics["hardware_tflops"] <= 100.0
    prov = slow.provenance
    assert "link.h2d_GBps 55.5 -> 1.0" in prov["hardware_vs_baseline"]
    assert "copy_h2d_pinned" in prov["costs_rescaled"] and "link.h2d_GBps" in prov["costs_rescaled"]
    assert "copy_h2d_pinned" not in prov["costs_measured"]
    assert "gemm" in prov["costs_measured"]  # GEMMs did not move
    assert "gemm" in simulate(load_scenario(H200, ["hardware.gpu.peak_bf16_tflops=100"])).provenance["costs_rescaled"]


def test_peak_ratio_rescales_measured_gemms_and_layers() -> None:
    base, low = costs_of(MEASURED), costs_of(MEASURED, ["hardware.gpu.peak_bf16_tflops=494.5"])
    m, n, k = 8192, 2048, 2048
    assert low.gemm_shape_s(m, n, k) == pytest.approx(2.0 * base.gemm_shape_s(m, n, k), rel=1e-12)
    # A measured whole layer moves by its composition's ratio: less than 2x (memory-bound and launch-bound
    # parts do not depend on the peak), more than 1x.
    ratio = low.layer_fwd_s() / base.layer_fwd_s()
    expected = low._now.layer_fwd_s() / base._now.layer_fwd_s()
    assert ratio == pytest.approx(expected, rel=1e-12)
    assert 1.0 <= ratio <= 2.0
    assert "layer_fwd" in low.provenance["costs_rescaled"]


def test_hbm_bandwidth_moves_the_memory_bound_part_only() -> None:
    base, slow = costs_of(MEASURED), costs_of(MEASURED, ["hardware.gpu.hbm_GBps=2400"])
    assert slow.gpu_cast_s(1e8) == pytest.approx(2.0 * base.gpu_cast_s(1e8), rel=1e-9)
    assert slow.gemm_shape_s(8192, 2048, 2048) == base.gemm_shape_s(8192, 2048, 2048)
    assert base.layer_fwd_s() < slow.layer_fwd_s() < 2.0 * base.layer_fwd_s()


def test_core_override_uses_measured_thread_counts_and_scales_beyond_them() -> None:
    base = costs_of(H200)
    eight = costs_of(H200, ["hardware.cpu.cores=8"])
    table = base.table
    # 8 threads were measured: the table's 8-thread row, not a rescaled 16-thread one.
    assert eight.cpu_cast_s(1e8, 8) == pytest.approx(table.cast_time_s(1e8, "cpu", "bf16", 8), rel=1e-12)
    assert eight.cpu_adam_s(1e8, "cpu_adam", 8, 1e8) == pytest.approx(
        table.cpu_adam_time_s(1e8, 8, "deepspeed"), rel=1e-12)
    # 32 threads were not: the 16-thread measurement times the analytic model's core scaling.
    many = costs_of(H200, ["hardware.cpu.cores=32"])
    assert many.cpu_adam_s(1e8, "cpu_adam", 32, 1e8) == pytest.approx(base.cpu_adam_s(1e8, "cpu_adam", 16, 1e8))
    assert many.cpu_cast_s(1e8, 32) <= base.cpu_cast_s(1e8, 16)


def test_another_profile_pointed_at_the_table_is_rescaled_to_its_hardware() -> None:
    table = str(ROOT / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv")
    c = costs_of(H200, ["hardware=gh200", f"hardware.calibration={table}", "schedule.cpu_adam=cpu_adam"])
    assert c.baseline_source.endswith("h200-pcie-gen5-x86.yaml")
    assert "link.h2d_GBps" in c.provenance["hardware_vs_baseline"]
    n = 2**30
    h200 = costs_of(H200)
    # GH200's C2C link is ~8x the H200 box's PCIe: the measured curve moves by the analytic ratio.
    assert c.copy_s(n, "h2d", True) < h200.copy_s(n, "h2d", True) / 5


def test_inline_profile_without_a_file_is_its_own_baseline() -> None:
    hw = load_profile("h200-pcie-gen5-x86")
    inline = hw.model_copy(update={"name": "my-inline-box"})
    assert find_baseline(inline)[0] is not None  # found through the table it names
    alone = inline.model_copy(update={"calibration": str(ROOT / "pyproject.toml")})
    assert find_baseline(alone) == (None, "")


def test_analytic_profiles_are_unchanged_by_the_table_machinery() -> None:
    sc = load_scenario(ROOT / "scenarios" / "gh200_zero_offload_4b.yaml", ["hardware=gh200-480gb"])
    r = simulate(sc)
    assert r.provenance["cost_model"] == "analytic"
