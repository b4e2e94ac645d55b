"""``sosim validate``: predictions against published and measured reference points.

The reference points live in ``validation/references.yaml`` (data): each row names its source, how the
prediction is formed (one metric, a ratio of two schedules, a largest-model search, an ablation step) and
an explicit error budget. The command prints every row with the published value, the prediction and the
error, and exits non-zero when any row is outside its budget.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sosim.ablation import run_ablation
from sosim.errors import ConfigError
from sosim.loader import load_scenario, read_yaml
from sosim.maxsize import PAPER_FAMILY, find_max_size
from sosim.output import print_json
from sosim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCES = ROOT / "validation" / "references.yaml"
_FAMILY = {name: (layers, hidden) for name, layers, hidden in PAPER_FAMILY}
_FAMILY_ORDER = [name for name, _, _ in PAPER_FAMILY]


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    published: float | str
    predicted: float | str
    error: float  # relative error, or model-size steps for maxsize rows
    budget: float
    within: bool


def _model_overrides(name: str) -> list[str]:
    layers, hidden = _FAMILY[name]
    return [f"model.layers={layers}", f"model.hidden={hidden}", "model.heads=32", "model.name=gpt-" + name]


def _metric(base: Path, overrides: list[str], metric: str) -> float:
    return float(simulate(load_scenario(base, overrides)).metrics[metric])


def evaluate(row: dict[str, Any], base_dir: Path) -> Row:
    scenario = base_dir / row["scenario"]
    fixed = list(row.get("set", []))
    kind = row["kind"]
    if kind == "metric":
        pred = _metric(scenario, fixed, row["metric"])
    elif kind == "ratio":
        models = row.get("models") or [None]
        ratios = []
        for m in models:
            extra = fixed + (_model_overrides(m) if m else [])
            num = _metric(scenario, extra + row["numerator"], row["metric"])
            den = _metric(scenario, extra + row["denominator"], row["metric"])
            ratios.append(num / den)
        pred = max(ratios) if row.get("agg") == "max" else math.exp(sum(map(math.log, ratios)) / len(ratios))
    elif kind == "ablation":
        pred = run_ablation(str(scenario), fixed)[int(row["step"])].incremental
    elif kind == "maxsize":
        found = find_max_size(load_scenario(scenario, fixed), "paper")
        name = found.model.name.removeprefix("gpt-")
        steps = abs(_FAMILY_ORDER.index(name) - _FAMILY_ORDER.index(row["published_model"]))
        budget = float(row["budget_steps"])
        return Row(row["id"], row["source"], row["published_model"], name, float(steps), budget, steps <= budget)
    else:
        raise ConfigError([f"validation row {row.get('id')}: unknown kind '{kind}'"])
    published = float(row["published"])
    err = (pred - published) / published
    budget = float(row["budget_rel"])
    return Row(row["id"], row["source"], published, pred, err, budget, abs(err) <= budget)


def run_validation(path: Path = DEFAULT_REFERENCES) -> list[Row]:
    data = read_yaml(path).data
    rows = data.get("rows") if isinstance(data, dict) else None
    if not rows:
        raise ConfigError([f"{path}:1: rows: no reference rows"])
    return [evaluate(r, ROOT) for r in rows]


def _cmd(args: argparse.Namespace) -> int:
    from sosim import validate_measured as vm

    rows = run_validation(Path(args.references))
    bad = [r for r in rows if not r.within]
    # The measured DeepSpeed runs: rows read from calibration/*/deepspeed_steps.csv (sosim.validate_measured).
    measured = None if args.no_measured else vm.validate_measured(
        None if args.measured is None else [Path(m) for m in args.measured], bands=args.band_replays)
    bad_measured = 0 if measured is None else sum(not r.within for r in measured.results)
    if args.format == "json":
        print_json({"rows": [r.__dict__ for r in rows], "out_of_budget": len(bad) + bad_measured,
                    **({"measured": measured.to_json()} if measured is not None else {})})
    else:
        print(f"{'id':<34} {'published':>10} {'predicted':>10} {'error':>8} {'budget':>7}  ok")
        for r in rows:
            pub = r.published if isinstance(r.published, str) else f"{r.published:.3g}"
            pred = r.predicted if isinstance(r.predicted, str) else f"{r.predicted:.3g}"
            unit = " steps" if isinstance(r.published, str) else ""
            err = f"{r.error:.0f}{unit}" if unit else f"{r.error:+.1%}"
            bud = f"{r.budget:.0f}{unit}" if unit else f"{r.budget:.0%}"
            print(f"{r.id:<34} {pub:>10} {pred:>10} {err:>8} {bud:>7}  {'yes' if r.within else 'NO'}")
        print(f"\n{len(rows) - len(bad)}/{len(rows)} rows within budget")
        if measured is not None:
            print("\n" + vm.format_report(measured))
    return 1 if bad or bad_measured else 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser("validate", help="predictions vs published / measured reference points")
    p.add_argument("--references", default=str(DEFAULT_REFERENCES))
    p.add_argument("--format", choices=["table", "json"], default="table")
    from sosim.validate_measured import add_arguments as add_measured_arguments

    add_measured_arguments(p)
    p.set_defaults(func=_cmd)
