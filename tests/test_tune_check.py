"""scripts/tuner_check.py on a synthetic measured grid: rank correlation and the 5% pick, computed right."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

from sosim import load_scenario, simulate
from sosim.formats import dsconfig
from sosim.formats.hf_model import HfModel
from sosim.formats.jsonio import read_json

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "scenarios" / "deepspeed" / "measured"
PROFILE = "h200-pcie-gen5-x86"
# The measured 1.1b Llama of calibration/nvidia-h200-2026-11-29 (scripts/ds_train_step.py SIZES).
MODEL = {"model": "1.1b", "layers": 22, "hidden": 2048, "heads": 16, "kv_heads": 4, "head_dim": 128, "ffn": 5632,
         "vocab": 32000}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tuner_check", ROOT / "scripts" / "tuner_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tuner_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _grid(tmp: Path) -> list[dict[str, Any]]:
    """12 settings (SuperOffload ratio x micro-batch, ZeRO-2 and ZeRO-3 x micro-batch) as DeepSpeed configs."""
    runs = []
    sources = {"superoffload": "1.1b-s2048-mb4-superoffload-clip0.ds_config.json",
               "zero2": "1.1b-s2048-mb4-zero2-clip0.ds_config.json",
               "zero3": "1.1b-s2048-mb4-zero3-clip0.ds_config.json"}
    settings = [("superoffload", r, mb) for r in (1.0, 0.9, 0.8, 0.7) for mb in (2, 4)]
    settings += [("zero2", None, mb) for mb in (2, 4)] + [("zero3", None, mb) for mb in (2, 4)]
    (tmp / "runs").mkdir()
    for config, ratio, mb in settings:
        ds = json.loads((MEASURED / sources[config]).read_text())
        ds["train_micro_batch_size_per_gpu"] = mb
        if ratio is not None:
            ds["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
        run_id = f"1.1b-s2048-mb{mb}-{config}" + (f"-ratio{ratio}" if ratio is not None else "")
        name = f"runs/{run_id}.ds_config.json"
        (tmp / name).write_text(json.dumps(ds))
        runs.append({"run_id": run_id, "config": config, "seq": 2048, "micro_batch": mb, **MODEL,
                     "activation_checkpointing": True, "ds_config_file": name, "status": "ok"})
    return runs


def _predicted(tmp: Path, run: dict[str, Any]) -> float:
    model = {k: run[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")}
    model.update(ffn_kind="swiglu", name="1.1b")
    mapping = dsconfig.map_ds_config(read_json(tmp / run["ds_config_file"]), HfModel(model=model, origin="t"),
                                     dsconfig.RunInputs(hardware=PROFILE, seq_len=2048, activation_checkpointing=True))
    return float(simulate(load_scenario(mapping.scenario)).metrics["tokens_per_s"])


def _write(tmp: Path, runs: list[dict[str, Any]], measured: list[float]) -> Path:
    rows = []
    for run, tps in zip(runs, measured):
        # Both timing modes, as the harness writes them; the check must use one (unsynced).
        rows.append({**run, "timing": "unsynced", "tokens_per_s": tps})
        rows.append({**run, "timing": "phased", "tokens_per_s": 1.0})
    # A run without a DeepSpeed config (the plain-PyTorch floor) and a failed run are skipped.
    rows.append({**runs[0], "run_id": "floor", "config": "floor", "ds_config_file": None, "timing": "unsynced",
                 "tokens_per_s": 1e9})
    rows.append({**runs[0], "run_id": "oom", "status": "error", "timing": "unsynced", "tokens_per_s": 1e9})
    path = tmp / "deepspeed_steps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_spearman_with_ties() -> None:
    tc = _script()
    assert tc.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert tc.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # Ranks [1.5, 1.5, 3] vs [1, 2, 3]: Pearson of those = 0.866.
    assert tc.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(tc.spearman([1.0], [2.0]))


def test_a_grid_measured_as_predicted_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tc = _script()
    runs = _grid(tmp_path)
    predicted = [_predicted(tmp_path, r) for r in runs]
    assert len(set(predicted)) > 6  # the grid really spreads (not a vacuous ranking)
    # Measured = predicted x a small wobble that keeps the order except among near-ties.
    measured = [p * (1.0 + 0.002 * ((i % 3) - 1)) for i, p in enumerate(predicted)]
    csv = _write(tmp_path, runs, measured)
    report = tc.check(csv, PROFILE)
    group = report["groups"]["1.1b seq 2048"]
    assert group["settings"] == 12 and group["checked"]
    assert group["spearman"] > 0.95
    assert group["recommended"] == runs[max(range(12), key=lambda i: predicted[i])]["run_id"]
    assert group["shortfall"] <= 0.01 and group["within_5pct"]
    assert group["mean_abs_error"] == pytest.approx(0.002 * 8 / 12, abs=1e-6)
    assert group["spearman_within"]["superoffload"] > 0.9  # 8 SuperOffload settings ranked among themselves
    assert report["passed"]
    assert tc.main([str(csv)]) == 0
    out = capsys.readouterr().out
    assert "Spearman rho" in out and "PASSED" in out and "floor" not in out and "oom" not in out


def test_a_grid_measured_in_reverse_fails(tmp_path: Path) -> None:
    tc = _script()
    runs = _grid(tmp_path)
    predicted = [_predicted(tmp_path, r) for r in runs]
    csv = _write(tmp_path, runs, [1e8 / p for p in predicted])
    report = tc.check(csv, PROFILE)
    group = report["groups"]["1.1b seq 2048"]
    assert group["spearman"] < -0.9
    # The pick (highest prediction) is the slowest measured setting.
    slowest = min(range(12), key=lambda i: 1e8 / predicted[i])
    assert group["recommended"] == runs[slowest]["run_id"]
    assert not group["within_5pct"] and not report["passed"]
    assert tc.main([str(csv)]) == 1


def test_configs_moved_by_the_harness_are_found_by_name(tmp_path: Path) -> None:
    tc = _script()
    (tmp_path / "deepspeed_runs").mkdir()
    (tmp_path / "deepspeed_runs" / "a.ds_config.json").write_text("{}")
    assert tc.resolve_config(tmp_path, "runs/a.ds_config.json") == tmp_path / "deepspeed_runs" / "a.ds_config.json"
    with pytest.raises(ValueError, match="not found"):
        tc.resolve_config(tmp_path, "runs/b.ds_config.json")


def test_too_few_settings_are_reported_not_checked(tmp_path: Path) -> None:
    tc = _script()
    runs = _grid(tmp_path)[:3]
    csv = _write(tmp_path, runs, [1000.0, 2000.0, 3000.0])
    report = tc.check(csv, PROFILE)
    assert report["groups_checked"] == 0 and not report["passed"]
    assert tc.main([str(csv)]) == 1
    assert tc.main([str(tmp_path / "missing.csv")]) == 2
