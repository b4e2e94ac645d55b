"""ZeRO-2's flush, overlap_comm, ZeRO-Infinity's fetch and CPU passes beyond the measured thread counts
(issue 18 item 3): hand-computed values from tiny tables, and the plans built on the shipped H200 profile."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from sosim.answers.validate_measured import read_runs, scenario_for
from sosim.calibrate.records import COLUMNS
from sosim.costs.analytic import model_parameter_tensors
from sosim.costs.calibration_table import CalibrationTable
from sosim.costs.offload_mechanisms import (
    Z2_FLUSH_H200,
    ZINF_FETCH_H200_S_PER_TENSOR,
    fetched_tensors_per_layer,
    z2_flush_costs,
    zinf_fetch_s_per_tensor,
)
from sosim.costs.table import CPU_CAST_BYTES_PER_ELEMENT, beyond_measured_threads_s
from sosim.inputs.units import MB
from sosim.run.simulate import make_cost_model, simulate

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "calibration" / "nvidia-h200-2026-12-01"
SHIPPED = "h200-pcie-gen5-x86"


def _table(tmp_path: Path, rows: list[dict[str, object]]) -> CalibrationTable:
    path = tmp_path / "measurements.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({name: row.get(name, "") for name in COLUMNS})
    return CalibrationTable.from_csv(path)


def _run(run_id: str) -> object:
    runs, _ = read_runs(LEASE)
    return next(r for r in runs if r.run_id == run_id)


def test_z2_flush_costs_pool_the_measured_flushes(tmp_path: Path) -> None:
    """Two flushes (2 tensors / 100 elements, 6 tensors / 300 elements): per tensor (sync - no_sync) summed
    over summed tensors, per element (no_sync - cast_copy) summed over summed elements."""
    rows: list[dict[str, object]] = []
    for elements, tensors, times in ((100, 2, (0.010, 0.006, 0.004)), (300, 6, (0.030, 0.020, 0.014))):
        for variant, t in zip(("sync", "no_sync", "cast_copy"), times, strict=True):
            rows.append({"op": "z2_flush", "variant": variant, "dtype": "bf16", "elements": elements,
                         "subgroups": tensors, "median_s": t, "p10_s": t, "p90_s": t, "n_samples": 4})
    table = _table(tmp_path, rows)
    got = z2_flush_costs(SimpleNamespace(measured_table=lambda: table))  # type: ignore[arg-type]
    assert got is not None
    assert got.sync_s_per_tensor == pytest.approx((0.004 + 0.010) / 8)
    assert got.norm_overflow_s_per_element == pytest.approx((0.002 + 0.006) / 400)


def test_no_rows_no_measured_mechanism() -> None:
    """A profile without the layer_offload rows keeps the earlier model (no carried host costs)."""
    analytic = SimpleNamespace(measured_table=lambda: None)  # what the analytic model answers
    assert z2_flush_costs(analytic) is None  # type: ignore[arg-type]
    assert zinf_fetch_s_per_tensor(analytic) is None  # type: ignore[arg-type]


def test_zero2_flush_on_the_shipped_profile_costs_what_was_measured() -> None:
    """The 1.1b ZeRO-2 run: the host's waits sum to one measured wait per parameter tensor, the norm and
    overflow kernels to the measured rate times the parameters; the old per-layer estimate is gone."""
    sc = scenario_for(_run("1.1b-s2048-mb4-zero2-clip0"), SHIPPED)
    res = simulate(sc)
    it = res.plan.measured_iteration
    ops = [op for op in res.plan.ops if op.iteration == it]
    waits = sum(op.duration_s for op in ops if op.name.startswith("grad_overflow_check_sync"))
    kernels = sum(op.duration_s for op in ops if op.name.startswith("grad_norm_overflow"))
    tensors = model_parameter_tensors(sc.model)
    assert tensors == 22 * 9 + 3
    # The shipped profile lists the 2026-12-01-mech table: its pooled values are the reference constants.
    assert waits == pytest.approx(tensors * Z2_FLUSH_H200.sync_s_per_tensor, rel=1e-9)
    assert kernels == pytest.approx(1_123_117_056 * Z2_FLUSH_H200.norm_overflow_s_per_element, rel=1e-6)
    assert not any(op.name.startswith("host_syncs") for op in ops)


def test_overlap_comm_changes_memory_not_time_on_one_gpu() -> None:
    """DeepSpeed 0.19.8 on one GPU: the per-tensor overflow test blocks the host until each flush's copies are
    done and average_tensor makes the side stream wait for the compute stream, so the flush is serial with the
    backward either way (measured: layer z2_offload vs z2_offload_no_overlap, overlapping p10-p90); what
    overlap_comm changes is the second reduce bucket (setup_buckets)."""
    run = _run("0.5b-s2048-mb4-zero2-clip0")
    on = simulate(scenario_for(run, SHIPPED, ["schedule.overlap_comm=true"]))
    off = simulate(scenario_for(run, SHIPPED, ["schedule.overlap_comm=false"]))
    assert on.metrics["step_time_s"] == pytest.approx(off.metrics["step_time_s"], rel=1e-12)
    bucket_gib = on.scenario.schedule.bucket_mb * MB / 2**30  # type: ignore[union-attr]
    assert on.metrics["gpu_mem_peak_gib"] - off.metrics["gpu_mem_peak_gib"] == pytest.approx(bucket_gib)
    table = CalibrationTable.from_csv(ROOT / "calibration" / "nvidia-h200-2026-12-01-mech" / "measurements.csv")
    cols_on = table.columns_by_op[("layer", "z2_offload_fwd_bwd")]
    cols_off = table.columns_by_op[("layer", "z2_offload_no_overlap_fwd_bwd")]
    assert cols_on["p10_s"][0] <= cols_off["p90_s"][0] and cols_off["p10_s"][0] <= cols_on["p90_s"][0]


def test_zero_infinity_fetch_waits_per_fetched_tensor() -> None:
    """0.5b with offload_param: one host wait per offloaded unit in forward (8 layers of 7 fetched tensors,
    the embedding and the head of one each), none in backward (the measured stack showed none)."""
    sc = scenario_for(_run("0.5b-s2048-mb4-zero3-clip0-offparam"), SHIPPED)
    assert fetched_tensors_per_layer(sc.model) == 7
    res = simulate(sc)
    it = res.plan.measured_iteration
    waits = [op for op in res.plan.ops if op.iteration == it and op.name.startswith("param_fetch_wait")]
    assert all(op.name.startswith("param_fetch_wait_fwd") for op in waits)
    assert sum(op.duration_s for op in waits) == pytest.approx((8 * 7 + 2) * ZINF_FETCH_H200_S_PER_TENSOR)


def test_beyond_measured_threads_one_rule_for_adam_and_casts() -> None:
    """1 s measured on 16 threads, 64 cores: core-bound 0.25 s unless the bytes need longer at mem_GBps."""
    adam = beyond_measured_threads_s(1.0, 16, 64.0, 28e9, 105.0)
    cast = beyond_measured_threads_s(1.0, 16, 64.0, 6e9, 105.0)
    assert adam == pytest.approx(28 / 105)
    assert cast == pytest.approx(0.25)
    assert beyond_measured_threads_s(0.1, 16, 64.0, 28e9, 105.0) == pytest.approx(0.1)  # never slower
    assert CPU_CAST_BYTES_PER_ELEMENT == 6.0


def test_cores_what_if_moves_adam_and_cast_by_the_same_rule() -> None:
    """On the H200 profile (16 threads measured, 105 GB/s): CPU Adam already at the ceiling stays, the cast
    gains at most mem_GBps over its measured traffic."""
    run = _run("0.5b-s2048-mb4-zero2-clip0")
    base = make_cost_model(scenario_for(run, SHIPPED))
    wide = make_cost_model(scenario_for(run, SHIPPED, ["hardware.cpu.cores=64"]))
    n = 491_816_960.0
    assert wide.cpu_adam_s(n, "cpu_adam", 64, n) == pytest.approx(base.cpu_adam_s(n, "cpu_adam", 16, n), rel=0.02)
    cast16, cast64 = base.cpu_cast_s(n, 16), wide.cpu_cast_s(n, 64)
    assert cast64 == pytest.approx(max(cast16 / 4, 6.0 * n / 105e9), rel=1e-6)
    assert 1.3 < cast16 / cast64 < 1.8
