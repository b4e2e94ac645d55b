"""Error bands: a tiny scenario on a synthetic table of known spread, seeds, the u = 0.5 identity, estimates."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sosim import load_scenario
from sosim.answers.bands import (
    ESTIMATE_SPREADS,
    SpreadCostModel,
    band_unavailable_reason,
    coverage,
    quantile_factor,
    sampled_cost_models,
    simulate_band,
)
from sosim.calibrate.records import COLUMNS
from sosim.costs.table import TableCostModel
from sosim.hardware.model import global_tokens_per_step
from sosim.run.simulate import make_cost_model, make_costs, simulate
from tests.helpers import tiny_scenario

ROOT = Path(__file__).resolve().parents[1]
# Tiny Llama-style shape (SwiGLU: the harness times such layers): hidden 512, 8 heads, 2 kv heads, ffn 1408.
MODEL = {"layers": 2, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn": 1408, "ffn_kind": "swiglu", "vocab": 1024}
SEQ, BATCH = 512, 2
# Whole-layer timings (seconds): p10 / median / p90. The step of a serial GPU-only plan with checkpointing
# off is  head + Adam + layers x fwd_bwd  (forward + backward-only = fwd_bwd).
FWD = (0.9e-3, 1.0e-3, 1.2e-3)
FWD_BWD = (2.8e-3, 3.0e-3, 3.5e-3)


def _write_table(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})
    return path


def _layer_row(variant: str, t: tuple[float, float, float]) -> dict[str, Any]:
    return {"op": "layer", "variant": variant, "dtype": "bf16", "batch": BATCH, "seq": SEQ, "heads": 8, "kv_heads": 2,
            "head_dim": 64, "hidden": 512, "ffn": 1408, "median_s": t[1], "p10_s": t[0], "p90_s": t[2],
            "n_samples": 20}


def _head_gemm_row() -> dict[str, Any]:
    # The logits GEMM at its exact shape, with no spread: the head is then measured (not an estimate).
    return {"op": "gemm", "variant": "fwd", "dtype": "bf16", "m": SEQ * BATCH, "n": 1024, "k": 512,
            "median_s": 50e-6, "p10_s": 50e-6, "p90_s": 50e-6, "n_samples": 20}


def _scenario(table: Path, **sched: Any) -> Any:
    d = tiny_scenario({"system": "gpu_only", **sched}, seq_len=SEQ, micro_batch=BATCH)
    d["model"] = dict(MODEL)
    d["hardware"]["calibration"] = str(table)
    return load_scenario(d)


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    return _write_table(tmp_path / "t.csv", [_layer_row("fwd", FWD), _layer_row("fwd_bwd", FWD_BWD), _head_gemm_row()])


def test_band_of_a_tiny_scenario_by_hand(table: Path) -> None:
    sc = _scenario(table)
    median_step = simulate(sc).metrics["step_time_s"]
    layers = MODEL["layers"]
    # One draw for the "layer" kind moves every layer together: step(u) = step(0.5) + layers x (fwd_bwd(u) - median).
    expect = (median_step + layers * (FWD_BWD[0] - FWD_BWD[1]), median_step,
              median_step + layers * (FWD_BWD[2] - FWD_BWD[1]))
    band = simulate_band(sc, n=400, seed=1)
    # Sample quantiles of 400 draws: u's p10 is within ~0.015 of 0.1, i.e. within 4% of the p10-median gap.
    assert band.step_time_s[0] == pytest.approx(expect[0], abs=0.1 * layers * (FWD_BWD[1] - FWD_BWD[0]))
    assert band.step_time_s[1] == pytest.approx(expect[1], abs=0.1 * layers * (FWD_BWD[2] - FWD_BWD[0]))
    assert band.step_time_s[2] == pytest.approx(expect[2], abs=0.1 * layers * (FWD_BWD[2] - FWD_BWD[1]))
    # The extremes are exactly the table's p10 and p90 (flat outside [0.1, 0.9]).
    assert min(band.samples_s) == pytest.approx(expect[0], rel=1e-12)
    assert max(band.samples_s) == pytest.approx(expect[2], rel=1e-12)
    tokens = global_tokens_per_step(sc)
    assert band.tokens_per_s[0] == pytest.approx(tokens / band.step_time_s[2], rel=1e-3)
    assert band.tokens_per_s[2] == pytest.approx(tokens / band.step_time_s[0], rel=1e-3)
    m = band.metrics()
    assert m["step_time_s_p10"] < m["step_time_s_p50"] < m["step_time_s_p90"]
    assert m["tokens_per_s_p10"] < m["tokens_per_s_p90"]
    assert band.estimates_used == ()  # the head GEMM is measured: no estimate in this scenario
    assert band.half_width_rel == pytest.approx((band.step_time_s[2] - band.step_time_s[0]) / 2 / band.step_time_s[1])


def test_band_is_deterministic_for_a_seed(table: Path) -> None:
    sc = _scenario(table)
    a, b, c = simulate_band(sc, n=20, seed=5), simulate_band(sc, n=20, seed=5), simulate_band(sc, n=20, seed=6)
    assert a.samples_s == b.samples_s and a.step_time_s == b.step_time_s
    assert a.samples_s != c.samples_s


def test_replay_at_the_median_is_simulate_bit_for_bit() -> None:
    sc = load_scenario(ROOT / "scenarios" / "h200_x86_llama1.1b_zero2_measured.yaml",
                       ["schedule.system=superoffload", "schedule.sub_group_elements=1e8"])
    base = make_cost_model(sc)
    assert isinstance(base, TableCostModel)
    spread = SpreadCostModel.from_analytic(base, base.table, base.baseline, base.baseline_source)
    at_median = dataclasses.replace(spread.at_quantile(0.5), estimate_factors=dict.fromkeys(ESTIMATE_SPREADS, 1.0))
    plain = simulate(sc)
    costs = make_costs(sc, at_median)
    for _ in range(2):  # the second replay on the same object is answered from its cache: still bit for bit
        replay = simulate(sc, costs=costs)
        assert replay.metrics == plain.metrics
        assert np.array_equal(replay.start_s, plain.start_s) and np.array_equal(replay.end_s, plain.end_s)


def test_estimate_factor_scales_only_the_analytic_fallback(table: Path) -> None:
    sc = _scenario(table)
    base = make_cost_model(sc)
    assert isinstance(base, TableCostModel)
    spread = SpreadCostModel.from_analytic(base, base.table)
    scaled = dataclasses.replace(spread, estimate_factors={"gemm": 1.1})
    # A GEMM shape the table does not have (thinner than any measured: analytic) is scaled; the measured one is not.
    assert scaled.gemm_shape_s(8, 512, 512) == pytest.approx(1.1 * base.gemm_shape_s(8, 512, 512), rel=1e-12)
    assert scaled.gemm_shape_s(SEQ * BATCH, 1024, 512) == base.gemm_shape_s(SEQ * BATCH, 1024, 512)
    assert scaled.layer_fwd_s() == base.layer_fwd_s()


def test_quantile_factor_by_hand() -> None:
    assert quantile_factor(0.5, 0.2) == 1.0
    assert quantile_factor(0.1, 0.2) == pytest.approx(0.8)
    assert quantile_factor(0.3, 0.2) == pytest.approx(0.9)
    assert quantile_factor(0.9, 0.2) == pytest.approx(1.2)
    assert quantile_factor(0.0, 0.2) == pytest.approx(0.8) and quantile_factor(1.0, 0.2) == pytest.approx(1.2)


def test_every_estimate_spread_is_stated_and_bounded() -> None:
    for kind, spread in ESTIMATE_SPREADS.items():
        assert 0 < spread.rel < 1, kind
        assert len(spread.why) > 40, kind


def test_sampled_models_draw_estimates_per_replay(table: Path) -> None:
    sc = _scenario(table)
    models = list(sampled_cost_models(sc, 3, seed=2))
    factors = [m.components.estimate_factors for m in models]  # type: ignore[attr-defined]
    assert all(set(f) == set(ESTIMATE_SPREADS) for f in factors)
    assert factors[0] != factors[1]
    again = [m.components.estimate_factors for m in sampled_cost_models(sc, 3, seed=2)]  # type: ignore[attr-defined]
    assert again == factors


def test_no_band_without_spread_data(tmp_path: Path) -> None:
    sc = load_scenario(tiny_scenario({"system": "gpu_only"}))
    assert "no calibration table" in (band_unavailable_reason(sc) or "")
    flat = _write_table(tmp_path / "flat.csv", [{**_layer_row("fwd", FWD), "p10_s": "", "p90_s": ""}])
    sc2 = _scenario(flat)
    assert "no p10/p90 spread" in (band_unavailable_reason(sc2) or "")
    with pytest.raises(ValueError, match="spread"):
        simulate_band(sc2, n=4)
    calibrated = load_scenario(ROOT / "scenarios" / "h200_x86_llama1.1b_zero2_measured.yaml")
    assert band_unavailable_reason(calibrated) is None


def test_coverage_on_synthetic_data() -> None:
    measured = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    bands = {"a": (0.9, 1.1), "b": (2.1, 2.5), "c": (3.0, 3.0), "d": (3.5, 3.99)}
    assert coverage(measured, bands) == (2, 4, ["b", "d"])


def test_a_band_says_which_lease_spread_it_drew() -> None:
    from sosim.run.loader import load_scenario

    measured = simulate_band(load_scenario("h200_x86_llama1.1b_zero2_measured"), n=4)
    assert set(measured.lease_log_sd) == {"host", "device"}
    assert measured.lease_source.startswith("measured:")
    assert measured.describe()["lease_log_sd"] == measured.lease_log_sd
    stated = simulate_band(load_scenario("h200x2_llama0.5b_measured"), n=4)
    assert stated.lease_log_sd == {"host": 0.19, "device": 0.053}
    assert stated.lease_source.startswith("stated in the profile")
