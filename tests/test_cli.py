"""CLI contracts: one JSON object, plausible tables, maxsize, python -m sosim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sosim.cli import main

METRIC_KEYS = {"step_time_s", "tokens_per_s", "samples_per_s", "model_tflops", "hardware_tflops", "mfu",
               "gpu_busy_frac", "exposed_cpu_optimizer_s", "exposed_h2d_s", "exposed_d2h_s",
               "gpu_mem_peak_gib", "cpu_mem_peak_gib", "feasible"}


def test_run_json_is_one_object_with_the_contract_metrics(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(root / "scenarios/gh200_zero_offload_4b.yaml"), "--format", "json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert set(data) >= METRIC_KEYS
    assert out.count("\n") == 1


def test_run_table_and_set(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(root / "scenarios/h100_gpu_only_1b.yaml"), "--set", "training.micro_batch=2"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "MFU" in out


def test_profiles_lists_shipped_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--format", "json"]) == 0
    names = {p["name"] for p in json.loads(capsys.readouterr().out)["profiles"]}
    assert {"gh200", "h100-sxm-pcie5-x86", "h200-pcie-gen5-x86", "v100-dgx2"} <= names


def test_maxsize_paper_family(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["maxsize", str(root / "scenarios/gh200_gpu_only_2b.yaml"), "--grow", "paper",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_params_b"] < 6  # all model state in 96 GB HBM: a few billion parameters at most
    assert data["next_size_fails_because"].startswith("GPU memory")


def test_python_dash_m(root: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sosim", "profiles"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "gh200" in proc.stdout


def test_calibrate_passes_options_through_and_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI has no torch and no GPU: one line on stderr, exit 2, no traceback.
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "cal")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("torch" in err or "GPU" in err or "CUDA" in err)


def test_json_output_is_strict(capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from sosim.output import print_json

    print_json({"a": float("nan"), "b": np.float64(1.5), "c": [np.int64(2), float("inf")], "d": None})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": 1.5, "c": [2, None], "d": None}
