"""``sosim validate``: predictions against published and measured reference points.

The reference points live in ``validation/references.yaml`` (data, shipped with the package): each row
names its source, how the prediction is formed (one metric, a ratio of two schedules, a largest-model
search, an ablation step) and an explicit error budget. The command prints every row with the published
value, the prediction and the error, and exits 1 when any row is outside its budget. A malformed row is an
input error (``file:line: rows[i].key: message``, exit 2), found before anything is simulated.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sosim.answers.ablation import STEPS as ABLATION_STEPS
from sosim.answers.ablation import run_ablation
from sosim.answers.maxsize import PAPER_FAMILY, find_max_size
from sosim.answers.validate_fit import FIT_WORDS, evaluate_fit
from sosim.formats.output import print_json
from sosim.inputs.ds_versions import NEWEST
from sosim.inputs.ds_versions import check as check_version
from sosim.inputs.errors import ConfigError, SosimError
from sosim.inputs.resources import data_root, default_references
from sosim.run.loader import Located, dotted, load_scenario, read_yaml
from sosim.run.simulate import simulate

if TYPE_CHECKING:
    from sosim.answers.validate_measured import Report

# Row scenarios are named relative to the folder that holds scenarios/ (the checkout, or the package data).
ROOT = data_root()
DEFAULT_REFERENCES = default_references()
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
    # The DeepSpeed release the prediction runs (the row's ``deepspeed_version``: the one its run used).
    deepspeed_version: str = NEWEST


def _model_overrides(name: str) -> list[str]:
    layers, hidden = _FAMILY[name]
    return [f"model.layers={layers}", f"model.hidden={hidden}", "model.heads=32", "model.name=gpt-" + name]


def _metric(base: Path, overrides: list[str], metric: str) -> float:
    return float(simulate(load_scenario(base, overrides)).metrics[metric])


def evaluate(row: dict[str, Any], base_dir: Path) -> Row:
    scenario = base_dir / row["scenario"]
    version = str(row.get("deepspeed_version", NEWEST))
    # The version goes last: a row's ``schedule={...}`` replaces the whole schedule section.
    tail = [f"schedule.deepspeed_version={version}"]
    fixed = list(row.get("set", []))
    kind = row["kind"]
    if kind == "metric":
        pred = _metric(scenario, fixed + tail, row["metric"])
    elif kind == "ratio":
        models = row.get("models") or [None]
        ratios = []
        for m in models:
            extra = fixed + (_model_overrides(m) if m else [])
            num = _metric(scenario, extra + row["numerator"] + tail, row["metric"])
            den = _metric(scenario, extra + row["denominator"] + tail, row["metric"])
            ratios.append(num / den)
        pred = max(ratios) if row.get("agg") == "max" else math.exp(sum(map(math.log, ratios)) / len(ratios))
    elif kind == "ablation":
        pred = run_ablation(str(scenario), fixed + tail)[int(row["step"])].incremental
    elif kind == "fits":  # a "trains on N GPUs" claim: memory only (sosim/answers/validate_fit.py)
        published_fit, predicted_fit, margin, ok = evaluate_fit({**row, "set": fixed + tail}, scenario)
        return Row(row["id"], row["source"], published_fit, predicted_fit, margin, 0.0, ok, version)
    elif kind == "maxsize":
        found = find_max_size(load_scenario(scenario, fixed + tail), "paper")
        name = found.model.name.removeprefix("gpt-")
        steps = abs(_FAMILY_ORDER.index(name) - _FAMILY_ORDER.index(row["published_model"]))
        budget = float(row["budget_steps"])
        return Row(row["id"], row["source"], row["published_model"], name, float(steps), budget, steps <= budget,
                   version)
    else:
        raise ConfigError([f"validation row {row.get('id')}: unknown kind '{kind}'"])
    published = float(row["published"])
    err = (pred - published) / published
    budget = float(row["budget_rel"])
    return Row(row["id"], row["source"], published, pred, err, budget, abs(err) <= budget, version)


_KINDS = ("metric", "ratio", "ablation", "maxsize", "fits")
# kind -> (required key, expected type) beyond id, source, kind, scenario.
_REQUIRED: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "metric": (("metric", str), ("published", (int, float)), ("budget_rel", (int, float))),
    "ratio": (("metric", str), ("numerator", list), ("denominator", list), ("published", (int, float)),
              ("budget_rel", (int, float))),
    "ablation": (("step", int), ("published", (int, float)), ("budget_rel", (int, float))),
    "maxsize": (("published_model", str), ("budget_steps", (int, float))),
    "fits": (("published", str),),
}
_TYPE_NAMES = {str: "a string", list: "a list", int: "an integer", (int, float): "a number"}


def row_problems(row: Any, i: int, loc: Located, base_dir: Path) -> list[str]:
    """Everything wrong with one reference row, as ``file:line: rows[i].key: message``."""
    path: tuple[str | int, ...] = ("rows", i)
    if not isinstance(row, dict):
        return [f"{loc.where(path)}: rows[{i}]: must be a mapping (id, source, kind, scenario, ...)"]

    def at(key: str) -> str:
        return f"{loc.where((*path, key))}: rows[{i}].{key}"

    problems = [f"{at(k)}: missing" for k in ("id", "source", "kind", "scenario") if k not in row]
    kind = row.get("kind")
    if "kind" in row and kind not in _KINDS:
        problems.append(f"{at('kind')}: unknown kind {kind!r} (one of {', '.join(_KINDS)})")
    if isinstance(row.get("scenario"), str) and not (base_dir / row["scenario"]).is_file():
        problems.append(f"{at('scenario')}: no such scenario file: {base_dir / row['scenario']}")
    elif "scenario" in row and not isinstance(row["scenario"], str):
        problems.append(f"{at('scenario')}: must be a path (relative to {base_dir})")
    for key, typ in _REQUIRED.get(str(kind), ()):
        value = row.get(key)
        if value is None:
            problems.append(f"{at(key)}: missing (needed by kind {kind})")
        elif isinstance(value, bool) or not isinstance(value, typ):
            problems.append(f"{at(key)}: must be {_TYPE_NAMES.get(typ, str(typ))}, got {value!r}")
        elif isinstance(value, (int, float)) and not (math.isfinite(value) and value > 0) and key != "step":
            problems.append(f"{at(key)}: must be a positive finite number, got {value!r}")
    for key in ("deepspeed_version", "deepspeed_version_why"):
        if key in row and not isinstance(row[key], str):
            problems.append(f"{at(key)}: must be a string, got {row[key]!r}")
    if isinstance(row.get("deepspeed_version"), str):
        try:
            check_version(row["deepspeed_version"])
        except ValueError as exc:
            problems.append(f"{at('deepspeed_version')}: {exc}")
    if "deepspeed_version" in row and "deepspeed_version_why" not in row:
        problems.append(f"{at('deepspeed_version_why')}: missing (say why the run used that release)")
    for key in ("set", "numerator", "denominator", "models"):
        value = row.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            problems.append(f"{at(key)}: must be a list of strings")
    if kind == "ratio" and isinstance(row.get("models"), list):
        unknown = [m for m in row["models"] if m not in _FAMILY]
        if unknown:
            problems.append(f"{at('models')}: unknown model(s) {', '.join(map(str, unknown))} (one of "
                            f"{', '.join(_FAMILY_ORDER)})")
    if kind == "maxsize" and isinstance(row.get("published_model"), str) and row["published_model"] not in _FAMILY:
        problems.append(f"{at('published_model')}: unknown model {row['published_model']!r} (one of "
                        f"{', '.join(_FAMILY_ORDER)})")
    if kind == "ablation" and isinstance(row.get("step"), int) and not 0 <= row["step"] <= len(ABLATION_STEPS):
        problems.append(f"{at('step')}: must be 0..{len(ABLATION_STEPS)}")
    if kind == "fits" and isinstance(row.get("published"), str) and row["published"] not in FIT_WORDS:
        problems.append(f"{at('published')}: must be one of {', '.join(FIT_WORDS)}")
    if kind == "ratio" and row.get("agg", "mean") not in ("mean", "max"):
        problems.append(f"{at('agg')}: must be mean or max")
    return problems


def run_validation(path: Path = DEFAULT_REFERENCES, base_dir: Path = ROOT, progress: bool = False) -> list[Row]:
    loc = read_yaml(path)
    data = loc.data
    rows = data.get("rows") if isinstance(data, dict) else None
    if not rows or not isinstance(rows, list):
        raise ConfigError([f"{loc.where(('rows',))}: rows: no reference rows (a list of mappings)"])
    problems = [p for i, r in enumerate(rows) for p in row_problems(r, i, loc, base_dir)]
    if problems:
        raise ConfigError(problems)
    from tqdm import tqdm  # plain (not .auto): the bar goes to stderr

    out = []
    for i, r in enumerate(tqdm(rows, desc="validate: published rows", unit="row", file=sys.stderr,
                               disable=not progress, dynamic_ncols=True, leave=False)):
        try:
            out.append(evaluate(r, base_dir))
        except SosimError as exc:  # a row whose scenario or overrides do not load
            lines = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            raise ConfigError([f"{loc.where(('rows', i))}: {dotted(('rows', i))} ({r['id']}): {p}"
                               for p in lines]) from None
        except KeyError as exc:  # a metric name the result does not have
            raise ConfigError([f"{loc.where(('rows', i, 'metric'))}: rows[{i}].metric: no metric {exc}"]) from None
    return out


def _measured(args: argparse.Namespace) -> Report | None:
    """The measured DeepSpeed runs (sosim.answers.validate_measured), or None with --no-measured.

    Zero runs compared is an input error, never a silent pass: with the default folders it means the shipped
    calibration data was not found (an install without it, or a path built from the wrong place)."""
    from sosim.answers import validate_measured as vm

    if args.no_measured:
        return None
    if args.measured is None:
        folders = vm.find_run_folders()
        if not folders:
            raise ConfigError([f"{vm.CALIBRATION_DIR}: no measured runs found (no */{vm.STEPS_FILE}); the shipped "
                               "calibration data is missing from this install (reinstall sosim, or pass "
                               "--no-measured to check the published rows only)"])
    else:
        folders = [Path(m) for m in args.measured]
    report = vm.validate_measured(folders, bands=args.band_replays, progress=sys.stderr.isatty())
    if not report.results:
        reasons = [f"  skipped {s.run_id}@{s.machine}: {s.reason} ({s.where})" for s in report.skipped[:5]]
        raise ConfigError([f"{', '.join(map(str, folders))}: 0 measured runs could be compared "
                           f"({len(report.skipped)} skipped)", *reasons])
    return report


def checked_counts(rows: list[Row], measured: Report | None) -> dict[str, int]:
    """How many rows the command checked: the numbers CI compares between a checkout and an installed wheel."""
    return {"published": len(rows),
            "measured": 0 if measured is None else len(measured.results),
            "measured_skipped": 0 if measured is None else len(measured.skipped)}


def _cmd(args: argparse.Namespace) -> int:
    from sosim.answers import validate_measured as vm

    rows = run_validation(Path(args.references), progress=sys.stderr.isatty())
    bad = [r for r in rows if not r.within]
    # The measured DeepSpeed runs: rows read from calibration/*/deepspeed_steps.csv (sosim.answers.validate_measured).
    measured = _measured(args)
    bad_measured = 0 if measured is None else sum(not r.within for r in measured.results)
    counts = checked_counts(rows, measured)
    if args.format == "json":
        print_json({"checked": counts, "data": str(ROOT), "rows": [r.__dict__ for r in rows],
                    "out_of_budget": len(bad) + bad_measured,
                    **({"measured": measured.to_json()} if measured is not None else {})})
    else:
        print(f"{'id':<34} {'published':>10} {'predicted':>10} {'error':>8} {'budget':>7}  ok   deepspeed")
        for r in rows:
            pub = r.published if isinstance(r.published, str) else f"{r.published:.3g}"
            pred = r.predicted if isinstance(r.predicted, str) else f"{r.predicted:.3g}"
            unit = " steps" if isinstance(r.published, str) else ""
            err = f"{r.error:.0f}{unit}" if unit else f"{r.error:+.1%}"
            bud = f"{r.budget:.0f}{unit}" if unit else f"{r.budget:.0%}"
            if r.published in FIT_WORDS:  # error: the tighter memory's use - 1; the claim must hold
                err, bud = f"{r.error:+.0%} mem", "same"
            print(f"{r.id:<34} {pub:>10} {pred:>10} {err:>8} {bud:>7}  {'yes' if r.within else 'NO ':<3}  "
                  f"{r.deepspeed_version}")
        print(f"\n{len(rows) - len(bad)}/{len(rows)} rows within budget")
        if measured is not None:
            print("\n" + vm.format_report(measured))
        print(f"\nchecked {counts['published']} published rows and {counts['measured']} measured runs "
              f"({counts['measured_skipped']} skipped) from {ROOT}")
    return 1 if bad or bad_measured else 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser("validate", help="predictions vs published / measured reference points")
    p.add_argument("--references", default=str(DEFAULT_REFERENCES),
                   help="reference rows (default: the shipped validation/references.yaml)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    from sosim.answers.validate_measured import add_arguments as add_measured_arguments

    add_measured_arguments(p)
    p.set_defaults(func=_cmd)
