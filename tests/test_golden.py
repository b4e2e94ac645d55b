"""Golden table: the predicted metrics of every shipped scenario (CI regression of predicted throughput).

A deliberate model change regenerates the table with ``pytest tests/test_golden.py --update-golden`` and
the diff of tests/golden/scenarios.csv is reviewed in the commit. Tolerance: 1e-4 relative on every number
(the simulator is deterministic; this only absorbs float reordering), exact on feasibility.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from sosim import load_scenario, simulate

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "scenarios.csv"
COLUMNS = ["step_time_s", "tokens_per_s", "model_tflops", "hardware_tflops", "mfu", "gpu_busy_frac",
           "exposed_cpu_optimizer_s", "exposed_h2d_s", "exposed_d2h_s", "gpu_mem_peak_gib", "cpu_mem_peak_gib",
           "feasible"]
REL_TOL = 1e-4
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def _predict(path: Path) -> dict[str, object]:
    m = simulate(load_scenario(path)).metrics
    return {"scenario": path.stem, **{k: m[k] for k in COLUMNS}}


def test_golden_table(request: pytest.FixtureRequest) -> None:
    rows = [_predict(p) for p in SCENARIOS]
    fresh = pd.DataFrame(rows).set_index("scenario")
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(exist_ok=True)
        fresh.to_csv(GOLDEN, float_format="%.10g")
        pytest.skip("golden table rewritten")
    assert GOLDEN.exists(), "no golden table: run pytest tests/test_golden.py --update-golden"
    golden = pd.read_csv(GOLDEN, index_col="scenario")
    missing = sorted(set(fresh.index) - set(golden.index))
    assert not missing, f"scenarios without a golden row (run --update-golden): {missing}"
    stale = sorted(set(golden.index) - set(fresh.index))
    assert not stale, f"golden rows for scenarios that no longer exist: {stale}"
    diffs = []
    for name, row in fresh.iterrows():
        for col in COLUMNS:
            new, old = row[col], golden.loc[name, col]
            if col == "feasible":
                same = bool(new) == bool(old)
            else:
                same = math.isclose(float(new), float(old), rel_tol=REL_TOL, abs_tol=1e-9)
            if not same:
                diffs.append(f"{name}.{col}: golden {old} -> now {new}")
    assert not diffs, "predictions changed:\n" + "\n".join(diffs)
