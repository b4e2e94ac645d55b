"""``sosim run`` carries the band by default on a profile with spread data; --no-bands / --bands; trace/plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sosim.cli import main

ROOT = Path(__file__).resolve().parents[1]
CALIBRATED = str(ROOT / "scenarios" / "h200_x86_llama1.1b_zero2_measured.yaml")
# gh200 names a table of published values (docs/gh200.md); the V100 profile is analytic.
UNCALIBRATED = str(ROOT / "scenarios" / "v100_zero_offload_1b.yaml")
BAND_KEYS = ("step_time_s_p10", "step_time_s_p90", "tokens_per_s_p10", "tokens_per_s_p90")


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["run", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_carries_the_band_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    d = _run_json(capsys, CALIBRATED, "--band-replays", "16")
    assert all(k in d for k in BAND_KEYS)
    assert d["step_time_s_p10"] <= d["step_time_s_p50"] <= d["step_time_s_p90"]
    assert d["step_time_s_p10"] <= d["step_time_s"] <= d["step_time_s_p90"]
    assert d["tokens_per_s_p10"] <= d["tokens_per_s"] <= d["tokens_per_s_p90"]
    assert d["band"]["available"] is True and d["band"]["replays"] == 16
    assert "copy" in d["band"]["sampled_component_kinds"]
    again = _run_json(capsys, CALIBRATED, "--band-replays", "16")
    assert again["step_time_s_p90"] == d["step_time_s_p90"]  # seeded
    other = _run_json(capsys, CALIBRATED, "--band-replays", "16", "--band-seed", "3")
    assert other["step_time_s_p90"] != d["step_time_s_p90"]


def test_no_bands_and_uncalibrated(capsys: pytest.CaptureFixture[str]) -> None:
    off = _run_json(capsys, CALIBRATED, "--no-bands")
    assert not any(k in off for k in BAND_KEYS) and off["band"] == {"available": False,
                                                                    "reason": "turned off (--no-bands)"}
    plain = _run_json(capsys, UNCALIBRATED)
    assert not any(k in plain for k in BAND_KEYS)
    assert "no calibration table" in plain["band"]["reason"]
    assert main(["run", UNCALIBRATED, "--bands"]) == 2
    assert "--bands: profile 'v100-dgx2' names no calibration table" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: at least 2 replays
        main(["run", CALIBRATED, "--band-replays", "1"])
    assert exc.value.code == 2
    assert "expected a whole number >= 2" in capsys.readouterr().err


def test_table_trace_and_plot_show_the_band(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "p.png"
    assert main(["run", CALIBRATED, "--band-replays", "8", "--trace", str(trace), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "band: p10-p90 step" in out and "8 replays, seed 0" in out
    data = json.loads(trace.read_text())
    markers = [e for e in data["traceEvents"] if e["name"] in ("step p10 (band)", "step p90 (band)")]
    assert len(markers) == 2 and markers[0]["ts"] <= markers[1]["ts"]
    assert data["otherData"]["step_time_s_p10"] == markers[0]["args"]["step_time_s_p10"]
    assert png.stat().st_size > 0
