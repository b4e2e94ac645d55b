"""A profile naming several calibration tables: later tables add the ops they measured (issue 9)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from sosim.calibration_table import CalibrationTable
from sosim.errors import ConfigError
from sosim.loader import load_profile
from tests.test_whatif import H200, costs_of

ROOT = Path(__file__).resolve().parents[1]
DAY1 = ROOT / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv"
DAY2 = ROOT / "calibration" / "nvidia-h200-2026-11-30" / "measurements.csv"


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


def test_the_h200_profile_names_both_days_and_provenance_lists_each_sha() -> None:
    hw = load_profile("h200-pcie-gen5-x86")
    assert [Path(p) for p in hw.calibration_paths] == [DAY1, DAY2]
    c = costs_of(H200)
    p = c.provenance
    assert p["hardware_vs_baseline"] == "same"
    assert hashlib.sha256(DAY1.read_bytes()).hexdigest() in p["calibration_parts"]
    assert hashlib.sha256(DAY2.read_bytes()).hexdigest() in p["calibration_parts"]
    assert p["calibration"] == "nvidia-h200-2026-11-29/measurements.csv, nvidia-h200-2026-11-30/measurements.csv"


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
