"""Measured spread for error bands: a table at a quantile, and seeded draws per component kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sosim import load_scenario
from sosim.costs.analytic import AnalyticCostModel
from sosim.costs.calibration_table import CalibrationTable, quantile_times
from sosim.costs.table import TableCostModel
from sosim.hardware.model import tokens_per_gpu

ROOT = Path(__file__).resolve().parents[1]
H200_CSV = ROOT / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv"
SCENARIO = ROOT / "scenarios" / "h200_x86_zero_offload_llama3b.yaml"


def test_quantile_times_by_hand() -> None:
    cols = {"median_s": np.array([2.0, 5.0]), "p10_s": np.array([1.0, np.nan]), "p90_s": np.array([4.0, np.nan])}
    assert quantile_times(cols, 0.5).tolist() == [2.0, 5.0]
    assert quantile_times(cols, 0.1).tolist() == [1.0, 5.0]  # no spread measured: the median
    assert quantile_times(cols, 0.3).tolist() == pytest.approx([1.5, 5.0])
    assert quantile_times(cols, 0.7).tolist() == pytest.approx([3.0, 5.0])
    assert quantile_times(cols, 0.9).tolist() == [4.0, 5.0]
    # Flat outside [0.1, 0.9]: the table says nothing about the tails.
    assert quantile_times(cols, 0.0).tolist() == [1.0, 5.0]
    assert quantile_times(cols, 1.0).tolist() == [4.0, 5.0]


@pytest.fixture(scope="module")
def table() -> CalibrationTable:
    return CalibrationTable.from_csv(H200_CSV)


def test_quantile_tables_order_every_lookup(table: CalibrationTable) -> None:
    low, high = table.at_quantile(0.1), table.at_quantile(0.9)
    assert table.at_quantile(0.5).copy_time_s(2**30, "h2d", True, False) == table.copy_time_s(2**30, "h2d", True, False)
    lookups = [
        lambda t: t.gemm_time_s(8192, 4096, 4096),
        lambda t: t.attention_time_s(2, 4096, 32, 128, backward=True),
        lambda t: t.layer_time_s(4096, 2048, 4, backward=True),
        lambda t: t.copy_time_s(2**28, "d2h", False, False),
        lambda t: t.cpu_adam_time_s(5e7, 12, "deepspeed"),
        lambda t: t.cast_time_s(3e7, "cpu", "bf16", 16),
    ]
    for lookup in lookups:
        assert lookup(low) <= lookup(table) <= lookup(high)
    assert lookups[0](low) < lookups[0](high)  # GEMMs have a measured spread
    with pytest.raises(ValueError, match="quantile"):
        table.at_quantile(1.5)


def test_samples_are_seeded_and_drawn_once_per_component_kind(table: CalibrationTable) -> None:
    a, draws_a = table.sampled(np.random.default_rng(7))
    b, draws_b = table.sampled(np.random.default_rng(7))
    _, draws_c = table.sampled(np.random.default_rng(8))
    assert draws_a == draws_b and draws_a != draws_c
    assert sorted(draws_a) == ["attention", "cast", "copy", "cpu_adam", "gemm", "layer"]
    assert a.gemm_time_s(8192, 4096, 4096) == b.gemm_time_s(8192, 4096, 4096)
    # One quantile for every copy variant: the H2D and D2H lookups sit at the same point of their spreads.
    u = draws_a["copy"]
    for variant in ("h2d_pinned", "d2h_pinned", "h2d_pageable"):
        expected = quantile_times(table.columns_by_op[("copy", variant)], u)
        assert a.columns_by_op[("copy", variant)]["median_s"].tolist() == pytest.approx(expected.tolist())


def test_cost_model_at_quantile_and_sample() -> None:
    sc = load_scenario(SCENARIO)
    base = TableCostModel.from_profile(AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc)))
    p10, p90 = base.at_quantile(0.1), base.at_quantile(0.9)
    for cost in (lambda m: m.layer_fwd_s(), lambda m: m.copy_s(2**28, "h2d", True),
                 lambda m: m.cpu_adam_s(1e8, "cpu_adam", 16, 3e9)):
        assert cost(p10) <= cost(base) <= cost(p90)
    assert p90.provenance["calibration_timings"] == "quantile 0.9"
    s1 = base.sample(np.random.default_rng(3), label="replay 1")
    s2 = base.sample(np.random.default_rng(3), label="replay 1")
    assert s1.layer_bwd_s() == s2.layer_bwd_s()
    assert s1.provenance["calibration_timings"].startswith("replay 1 (quantiles: attention ")
    # The base model is untouched by its samples (frozen tables, fresh ledgers).
    assert base.provenance["calibration_timings"] == "median"
    # What-if rescaling applies to sampled timings too.
    slow = load_scenario(SCENARIO, ["hardware.link.h2d_GBps=5.55"])
    slow_model = TableCostModel.from_profile(
        AnalyticCostModel(slow.hardware, slow.model, slow.training, tokens_per_gpu(slow))).at_quantile(0.9)
    assert slow_model.copy_s(2**30, "h2d", True) == pytest.approx(10 * p90.copy_s(2**30, "h2d", True), rel=1e-3)
