"""`sosim compare`: side-by-side table, JSON with speedups relative to the first scenario, bar chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sosim import load_scenario, simulate
from sosim.answers.compare import KEY_METRICS, compare_frame, format_table
from sosim.cli import main


def test_compare_json_speedups_relative_to_first(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = root / "scenarios/gh200_zero_offload_4b.yaml", root / "scenarios/h200_x86_zero_offload_llama3b.yaml"
    assert main(["compare", str(a), str(b), "--set", "training.micro_batch=2", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out)
    rows = data["scenarios"]
    assert data["baseline"] == rows[0]["label"] == "gh200_zero_offload_4b"
    assert set(rows[0]) >= set(KEY_METRICS) | {"speedup", "system", "hardware"}
    direct = [simulate(load_scenario(p, ["training.micro_batch=2"])).metrics["tokens_per_s"] for p in (a, b)]
    assert rows[0]["speedup"] == 1.0
    assert rows[1]["speedup"] == pytest.approx(direct[1] / direct[0])
    assert rows[1]["tokens_per_s"] == pytest.approx(direct[1])


def test_compare_table_and_plot(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = root / "scenarios/gh200_zero_offload_4b.yaml"
    png = tmp_path / "c.png"
    # The same file twice: labels must still be distinct columns.
    assert main(["compare", str(a), str(a), "--set", "model.layers=2", "--plot", str(png)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["metric", "0:gh200_zero_offload_4b", "1:gh200_zero_offload_4b"]
    speed = next(line for line in lines if line.startswith("speedup"))
    assert speed.split()[1:] == ["1", "1"]
    assert png.stat().st_size > 0


def test_infeasible_is_noted_under_the_table(root: Path) -> None:
    a = root / "scenarios/gh200_zero_offload_4b.yaml"
    ok = simulate(load_scenario(a, ["model.layers=2"]))
    oom = simulate(load_scenario(a, ["model.layers=2", "hardware.gpu.hbm_gib=3"]))
    assert not oom.metrics["feasible"]
    table = format_table(compare_frame([ok, oom], ["ok", "oom"]))
    assert "oom: INFEASIBLE: GPU memory" in table


def test_compare_bad_file_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "missing.yaml")]) == 2
    assert "Traceback" not in capsys.readouterr().err
