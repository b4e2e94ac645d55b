"""ZeRO-3 hook host time follows parameter modules, not tensors (issue 21 item 2): the lent H200's GPT-2 /
Llama hook timing (calibration/nvidia-h200-2026-12-01-z3hooks) and the cost model that follows it."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from sosim import load_scenario
from sosim.costs.analytic import parameter_modules_per_layer, parameter_tensors_per_layer
from sosim.run.simulate import make_cost_model

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / "calibration" / "nvidia-h200-2026-12-01-z3hooks" / "z3_hooks.csv"


def _rows() -> list[dict[str, str]]:
    with HOOKS.open() as f:
        return [r for r in csv.DictReader(f) if r["family"] in ("gpt2", "llama") and r["run_id"].endswith("-hooks")]


def _fit_error(rows: list[dict[str, str]], column: str) -> float:
    x = np.array([[float(r[column])] for r in rows])
    y = np.array([float(r["t_hook_total_s"]) for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(np.mean(np.abs(x @ coef / y - 1.0)))


def test_the_measured_hook_time_follows_modules() -> None:
    rows = _rows()
    assert len(rows) == 8  # two timings of four jobs: GPT-2 and Llama at 12 x 2048 and 8 x 4096
    per_module, per_tensor = _fit_error(rows, "param_modules"), _fit_error(rows, "param_tensors")
    assert per_module < 0.15 < per_tensor  # 11.8% against 28.8%

    def mean(prefix: str) -> float:
        vals = [float(r["t_hook_total_s"]) for r in rows if r["run_id"].startswith(prefix)]
        return sum(vals) / len(vals)

    # GPT-2 layers hold more tensors (12 vs 9) but fewer modules (6 vs 9): their hooks take less time.
    for g, ll in (("G12", "L12"), ("G8", "L8")):
        assert 0.6 < mean(g) / mean(ll) < 0.8


def test_the_cost_model_counts_parameter_modules() -> None:
    gpt = load_scenario("scenarios/gh200_superoffload_deepspeed_8b.yaml")
    llama = load_scenario("scenarios/alps_gh200x4_superoffload_6.7b.yaml")
    assert (parameter_modules_per_layer(gpt.model), parameter_tensors_per_layer(gpt.model)) == (6, 12)
    assert (parameter_modules_per_layer(llama.model), parameter_tensors_per_layer(llama.model)) == (9, 9)
    # The measured GPT-2 / Llama ratio of the hook time is the modules' 6 / 9, within the data's spread.
    ratio = make_cost_model(gpt).stage3_hook_s(2048, False) / make_cost_model(llama).stage3_hook_s(2048, False)
    assert ratio == pytest.approx(6 / 9)
