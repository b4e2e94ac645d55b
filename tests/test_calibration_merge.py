"""A profile naming several calibration tables: later tables add the ops they measured (issue 9)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from sosim.calibrate.records import COLUMNS
from sosim.costs.calibration_table import CalibrationTable, component_class
from sosim.inputs.errors import ConfigError
from sosim.run.loader import load_profile
from tests.test_whatif import H200, costs_of

ROOT = Path(__file__).resolve().parents[1]
DAY1 = ROOT / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv"
DAY2 = ROOT / "calibration" / "nvidia-h200-2026-11-30" / "measurements.csv"
DAY2B = ROOT / "calibration" / "nvidia-h200-2026-11-30b" / "measurements.csv"
REPEAT = ROOT / "calibration" / "nvidia-h200-2026-11-30c" / "measurements.csv"
# The fifth lease (2026-12-01): the layer_offload section (ZeRO-2 flush, ZeRO-Infinity fetch), listed first: its
# HF layer rows are replaced by the 2026-11-30 table's and add to the lease spread.
MECH = ROOT / "calibration" / "nvidia-h200-2026-12-01-mech" / "measurements.csv"
# The torch CPU AdamW variants (issue 24), listed last: new (op, variant) pairs only, nothing earlier replaced.
FSDP2 = ROOT / "calibration" / "nvidia-h200-2026-12-01-fsdp2" / "measurements.csv"


def test_merged_table_adds_the_later_ops_and_keeps_the_earlier() -> None:
    a, b = CalibrationTable.from_csv(DAY1), CalibrationTable.from_csv(DAY2)
    m = CalibrationTable.merged([a, b])
    assert set(m.columns_by_op) == set(a.columns_by_op) | set(b.columns_by_op)
    # An op only the first day measured answers from its rows; one only the second day measured from its.
    assert m.cpu_adam_time_s(1e8, 16, "deepspeed") == a.cpu_adam_time_s(1e8, 16, "deepspeed")
    assert a.ds_refresh_time_s(1e8, 16, "zero3") is None
    assert m.ds_refresh_time_s(1e8, 16, "zero3") == pytest.approx(0.05536325, rel=1e-9)
    assert m.origin[("ds_refresh", "zero3")] == DAY2
    assert m.parts == ((DAY1, a.sha256), (DAY2, b.sha256))
    assert m.sha256 == hashlib.sha256((a.sha256 + b.sha256).encode()).hexdigest()


def test_a_later_table_replaces_an_op_it_measured_again(tmp_path: Path) -> None:
    lines = DAY1.read_text().splitlines()
    header, rows = lines[0], [r for r in lines[1:] if r.startswith("cpu_adam,deepspeed,")]
    cols = header.split(",")
    i = cols.index("median_s")
    doubled = []
    for r in rows:
        cells = r.split(",")
        cells[i] = repr(2 * float(cells[i]))
        doubled.append(",".join(cells))
    later = tmp_path / "later.csv"
    later.write_text("\n".join([header, *doubled]) + "\n")
    a = CalibrationTable.from_csv(DAY1)
    m = CalibrationTable.merged([a, CalibrationTable.from_csv(later)])
    assert m.cpu_adam_time_s(1e8, 16, "deepspeed") == pytest.approx(2 * a.cpu_adam_time_s(1e8, 16, "deepspeed"))


def test_the_h200_profile_names_every_session_and_provenance_lists_each_sha() -> None:
    hw = load_profile("h200-pcie-gen5-x86")
    assert [Path(p) for p in hw.calibration_paths] == [MECH, REPEAT, DAY1, DAY2, DAY2B, FSDP2]
    c = costs_of(H200)
    p = c.provenance
    assert p["hardware_vs_baseline"] == "same"
    for path in (MECH, REPEAT, DAY1, DAY2, DAY2B, FSDP2):
        assert hashlib.sha256(path.read_bytes()).hexdigest() in p["calibration_parts"]
    assert p["calibration"] == ("nvidia-h200-2026-12-01-mech/measurements.csv, "
                                "nvidia-h200-2026-11-30c/measurements.csv, nvidia-h200-2026-11-29/measurements.csv, "
                                "nvidia-h200-2026-11-30/measurements.csv, nvidia-h200-2026-11-30b/measurements.csv, "
                                "nvidia-h200-2026-12-01-fsdp2/measurements.csv")


def test_the_repeat_lease_listed_first_moves_no_point_estimate() -> None:
    # Every (op, variant) the repeat lease measured was measured again by a later table, which replaces it:
    # the profile's costs are those of the tables after it; the repeat only adds the lease spread.
    first = CalibrationTable.merged([CalibrationTable.from_csv(p) for p in (DAY1, DAY2, DAY2B)])
    every = CalibrationTable.merged([CalibrationTable.from_csv(p) for p in (REPEAT, DAY1, DAY2, DAY2B)])
    assert set(every.columns_by_op) == set(first.columns_by_op)
    for key, cols in first.columns_by_op.items():
        assert every.origin[key] == first.origin[key]
        np.testing.assert_array_equal(every.columns_by_op[key]["median_s"], cols["median_s"])
    assert not first.session_log_sd  # no point measured twice without the repeat
    assert set(every.session_log_sd) == {"host", "device"}
    # Host-side components move between leases far more than GPU kernels and pinned DMA do.
    assert 0.10 < every.session_log_sd["host"] < 0.30
    assert every.session_log_sd["device"] < every.session_log_sd["host"] / 2


def _one_op_csv(path: Path, medians: dict[float, float]) -> CalibrationTable:
    header = ",".join(COLUMNS)
    rows = []
    for elements, median in medians.items():
        cells = dict.fromkeys(COLUMNS, "")
        cells.update(op="cpu_adam", variant="deepspeed", dtype="fp32", elements=repr(elements), threads="16",
                     median_s=repr(median), p10_s=repr(median), p90_s=repr(median), n_samples="5")
        rows.append(",".join(cells[c] for c in COLUMNS))
    path.write_text("\n".join([header, *rows]) + "\n")
    return CalibrationTable.from_csv(path)


def test_session_spread_is_the_pooled_log_sd_of_repeated_points(tmp_path: Path) -> None:
    # Two sessions, two points each: log ratios ln(1.2) and ln(0.9). With k = 2 sessions per point, each
    # point's squared deviations from its mean log sum to d^2 / 2 (one degree of freedom).
    a = _one_op_csv(tmp_path / "a.csv", {1e7: 0.010, 1e8: 0.100})
    b = _one_op_csv(tmp_path / "b.csv", {1e7: 0.012, 1e8: 0.090, 1e9: 0.9})
    m = CalibrationTable.merged([a, b])
    d1, d2 = math.log(1.2), math.log(0.9)
    assert m.session_log_sd == {"host": pytest.approx(math.sqrt((d1**2 / 2 + d2**2 / 2) / 2), rel=1e-9)}
    assert m.session_points == {"host": 2}
    # The point estimate is the later session's rows (replace rule), the 1e9 point included.
    assert m.cpu_adam_time_s(1e8, 16, "deepspeed") == pytest.approx(0.090)


def test_points_under_a_millisecond_carry_no_session_spread(tmp_path: Path) -> None:
    a = _one_op_csv(tmp_path / "a.csv", {1e5: 0.0002})
    b = _one_op_csv(tmp_path / "b.csv", {1e5: 0.0009})
    assert CalibrationTable.merged([a, b]).session_log_sd == {}


def test_a_sampled_table_moves_each_kind_by_its_lease_draw(tmp_path: Path) -> None:
    a = _one_op_csv(tmp_path / "a.csv", {1e7: 0.010, 1e8: 0.100})
    b = _one_op_csv(tmp_path / "b.csv", {1e7: 0.012, 1e8: 0.090})
    m = CalibrationTable.merged([a, b])
    sd = m.session_log_sd["host"]
    lows, highs = [], []
    for seed in range(200):
        table, draws = m.sampled(np.random.default_rng(seed))
        factor = table.cpu_adam_time_s(1e8, 16, "deepspeed") / m.cpu_adam_time_s(1e8, 16, "deepspeed")
        u = min(max(draws["cpu_adam lease"], 0.1), 0.9)
        assert factor == pytest.approx(math.exp(sd * 1.2815515655446004 * (u - 0.5) / 0.4), rel=1e-9)
        (lows if u <= 0.1 else highs if u >= 0.9 else []).append(factor)
    # p10 / p90 of the lease factor sit at exp(-+1.2816 sd): the factor's 80% interval is the measured spread.
    assert lows and min(lows) == pytest.approx(math.exp(-1.2815515655446004 * sd))
    assert highs and max(highs) == pytest.approx(math.exp(1.2815515655446004 * sd))
    # A table from one session has no lease draw: its sampling is unchanged.
    _, draws_a = a.sampled(np.random.default_rng(0))
    assert not any(k.endswith(" lease") for k in draws_a)


def test_component_classes() -> None:
    assert component_class("cpu_adam", "deepspeed") == "host"
    assert component_class("copy", "d2h_pageable") == "host"
    assert component_class("copy", "d2h_pinned") == "device"
    assert component_class("cast", "cpu_fp32_to_bf16") == "host"
    assert component_class("cast", "gpu_fp32_to_bf16") == "device"
    assert component_class("layer", "z3_fwd_bwd") == "host"
    assert component_class("layer", "fwd_bwd") == "device"
    assert component_class("gemm", "fwd") == "device"


def test_whatif_still_rescales_a_cost_from_the_second_table() -> None:
    base, slow = costs_of(H200), costs_of(H200, ["hardware.link.h2d_GBps=5.55"])
    # The refresh (second table) is a CPU cast + pageable copy: a 10x slower link slows it, by the analytic
    # model's ratio, and the provenance says it was rescaled.
    assert slow.ds_refresh_s(1e8, 16, False) > base.ds_refresh_s(1e8, 16, False)
    assert "ds_refresh" in slow.provenance["costs_rescaled"]


def test_a_non_string_entry_is_a_load_error_naming_the_line(tmp_path: Path) -> None:
    prof = yaml.safe_load((ROOT / "hardware_profiles" / "h200-pcie-gen5-x86.yaml").read_text())
    prof["calibration"] = [str(DAY1), 3]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert "calibration" in str(err.value) and "p.yaml" in str(err.value)


def test_the_two_gpu_profile_states_the_h200_kinds_measured_lease_spread() -> None:
    # The 2-GPU machine's tables repeat no section: its profile states the spread measured on the H200 kind's
    # leases (an estimate for this kind, sourced); the numbers must be those the H200 tables give.
    h200 = load_profile("h200-pcie-gen5-x86")
    measured = CalibrationTable.merged([CalibrationTable.from_csv(p) for p in h200.calibration_paths])
    x2 = load_profile("h200x2-pcie-gen5-x86")
    assert x2.lease_spread is not None
    assert x2.lease_spread.host_log_sd == pytest.approx(measured.session_log_sd["host"], abs=0.005)
    assert x2.lease_spread.device_log_sd == pytest.approx(measured.session_log_sd["device"], abs=0.0005)
    assert "estimate" in x2.lease_spread.sources["host_log_sd"]


def test_a_stated_lease_spread_is_drawn_when_the_table_has_none(tmp_path: Path) -> None:
    a = _one_op_csv(tmp_path / "a.csv", {1e8: 0.100})
    table, draws = a.sampled(np.random.default_rng(3), {"host": 0.2, "device": 0.05})
    u = min(max(draws["cpu_adam lease"], 0.1), 0.9)
    base = a.at_quantile(draws["cpu_adam"]).cpu_adam_time_s(1e8, 16, "deepspeed")
    assert table.cpu_adam_time_s(1e8, 16, "deepspeed") == pytest.approx(
        base * math.exp(0.2 * 1.2815515655446004 * (u - 0.5) / 0.4), rel=1e-9)
