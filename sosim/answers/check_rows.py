"""A ``sosim check`` baseline's rows, checked as ``--write`` writes them: each problem as ``file:line: key:
message`` (sosim/answers/check.py reads the baseline through :func:`entry_problems`)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

# Metrics a prediction always has above zero (step time, throughput); the others are at least 0.
_POSITIVE_METRICS = frozenset(("tokens_per_s", "step_time_s"))
# Each row's keys and their types.
ENTRY_KEYS: dict[str, type | tuple[type, ...]] = {
    "id": str, "source": str, "example": bool, "overrides": list, "metrics": dict, "inputs": dict}


def entry_problems(row: Any, i: int, loc: Any, metrics_keys: Collection[str]) -> list[str]:
    """Problems of row ``i`` (``loc``: the baseline's Located; ``metrics_keys``: the compared numbers)."""
    where = loc.where(("scenarios", i))
    if not isinstance(row, dict):
        return [f"{where}: scenarios[{i}]: must be a mapping"]
    problems = [f"{loc.where(('scenarios', i, key))}: scenarios[{i}].{key}: "
                + ("missing" if key not in row else f"must be {typ.__name__ if isinstance(typ, type) else typ}")
                for key, typ in ENTRY_KEYS.items() if not isinstance(row.get(key), typ)]
    metrics = row.get("metrics")
    if isinstance(metrics, dict):
        for key in metrics_keys:
            value = metrics.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"{loc.where(('scenarios', i, 'metrics', key))}: scenarios[{i}].metrics.{key}: "
                                f"must be a finite number, got {value!r}")
            elif value < 0 or (value == 0 and key in _POSITIVE_METRICS):
                # --write never records these (a step takes time, a feasible or not run moves tokens): an edited
                # baseline, which would be compared as +inf% and blamed on the environment.
                problems.append(f"{loc.where(('scenarios', i, 'metrics', key))}: scenarios[{i}].metrics.{key}: "
                                f"must be {'positive' if key in _POSITIVE_METRICS else 'at least 0'}, got {value!r}; "
                                "sosim check --write never records that (an edited baseline?)")
        if not isinstance(metrics.get("feasible"), bool):
            problems.append(f"{where}: scenarios[{i}].metrics.feasible: must be true or false")
    if isinstance(row.get("overrides"), list) and not all(isinstance(o, str) for o in row["overrides"]):
        problems.append(f"{loc.where(('scenarios', i, 'overrides'))}: scenarios[{i}].overrides: must be a list of "
                        "strings (KEY.PATH=VALUE)")
    if isinstance(row.get("inputs"), dict):
        problems += _inputs_problems(row["inputs"], i, loc)
    return problems


_TEXT_INPUTS = ("scenario_file", "scenario_sha256", "profile", "profile_sha256", "system", "implementation",
                "sosim_version", "sosim_code_sha256")


def _inputs_problems(inputs: dict[str, Any], i: int, loc: Any) -> list[str]:
    """The recorded inputs are compared with the current ones: each must have the type --write gives it."""
    def at(key: str) -> str:
        return f"{loc.where(('scenarios', i, 'inputs', key))}: scenarios[{i}].inputs.{key}"

    problems = [f"{at(k)}: must be a string" for k in _TEXT_INPUTS if not isinstance(inputs.get(k), str)]
    if not isinstance(inputs.get("profile_file"), (str, type(None))):
        problems.append(f"{at('profile_file')}: must be a path or null")
    overrides = inputs.get("overrides")
    if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
        problems.append(f"{at('overrides')}: must be a list of strings")
    tables = inputs.get("calibration")
    if not (isinstance(tables, list) and all(isinstance(t, dict) and isinstance(t.get("file"), str)
                                             and isinstance(t.get("sha256"), str) for t in tables)):
        problems.append(f"{at('calibration')}: must be a list of {{\"file\": path, \"sha256\": digest}}")
    return problems


__all__ = ["ENTRY_KEYS", "entry_problems"]
