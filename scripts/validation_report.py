"""Markdown tables for docs/validation.md and docs/calibration.md from `validation/references.yaml`.

    python scripts/validation_report.py > /tmp/report.md

Prints (1) every reference row with the prediction and its error, and (2) for the rows measured on the
H200 machine, the prediction with the calibrated profile (measured table) next to the analytic profile
(the same profile with ``calibration`` removed), so the value of calibration is visible.
"""

from __future__ import annotations

from pathlib import Path

from sosim.loader import read_yaml
from sosim.validate import DEFAULT_REFERENCES, ROOT, evaluate, run_validation


def _fmt(v: float | str) -> str:
    return v if isinstance(v, str) else f"{v:.4g}"


def main() -> None:
    rows = run_validation()
    print("| id | published | predicted | error | budget | within |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        steps = isinstance(r.published, str)
        err = f"{r.error:.0f} steps" if steps else f"{r.error:+.1%}"
        bud = f"{r.budget:.0f} steps" if steps else f"±{r.budget:.0%}"
        ok = "yes" if r.within else "**no**"
        print(f"| {r.id} | {_fmt(r.published)} | {_fmt(r.predicted)} | {err} | {bud} | {ok} |")
    ok = sum(r.within for r in rows)
    print(f"\n{ok}/{len(rows)} rows within budget.\n")
    data = read_yaml(Path(DEFAULT_REFERENCES)).data["rows"]
    measured = [d for d in data if d["id"].startswith("measured_")]
    print("| measured run | measured (s) | calibrated profile | error | analytic profile | error |")
    print("|---|---|---|---|---|---|")
    for d in measured:
        cal = evaluate(d, ROOT)
        ana = evaluate({**d, "set": [*d.get("set", []), "hardware.calibration=null"]}, ROOT)
        print(f"| {d['id'].removeprefix('measured_')} | {d['published']:.3f} | {cal.predicted:.3f} | "
              f"{cal.error:+.1%} | {ana.predicted:.3f} | {ana.error:+.1%} |")


if __name__ == "__main__":
    main()
