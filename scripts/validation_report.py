"""The generated tables of docs/validation.md: reference rows, measured DeepSpeed runs (step, phases, paired
effects, error bands), calibrated vs analytic profile.

    python scripts/validation_report.py                          # print every generated section
    python scripts/validation_report.py --write docs/validation.md

With ``--write`` each section replaces the text between its markers in the page
(``<!-- generated:NAME -->`` ... ``<!-- /generated:NAME -->``); everything outside the markers (prose,
sections other people add) is kept as it is. A marker pair missing from the page is reported, not added.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

from sosim.answers.validate import run_validation
from sosim.answers.validate_measured import (
    BAND_TARGET_COVERAGE,
    BAND_TARGET_HALF_WIDTH,
    SECTION_NAMES,
    SYSTEM_NAMES,
    TIMERS,
    Report,
    measured_timers,
    validate_measured,
)

BAND_REPLAYS = 100
BAND_SEED = 0


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _s(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _run(r: object) -> str:
    run = r.run  # type: ignore[attr-defined]
    return f"{run.run_id} ({run.machine.removeprefix('nvidia-')})"


def references() -> str:
    rows = run_validation()
    out = ["| id | published | predicted | error | budget | within |", "|---|---|---|---|---|---|"]
    for r in rows:
        steps = isinstance(r.published, str)
        err = f"{r.error:.0f} steps" if steps else f"{r.error:+.1%}"
        bud = f"{r.budget:.0f} steps" if steps else f"±{r.budget:.0%}"
        pub = r.published if isinstance(r.published, str) else f"{r.published:.4g}"
        pred = r.predicted if isinstance(r.predicted, str) else f"{r.predicted:.4g}"
        out.append(f"| {r.id} | {pub} | {pred} | {err} | {bud} | {'yes' if r.within else '**no**'} |")
    out.append(f"\n{sum(r.within for r in rows)}/{len(rows)} rows within budget.")
    return "\n".join(out)


def measured_steps(rep: Report) -> str:
    out = ["| run | system | measured median (p10-p90) s | predicted s | error | predicted band p10-p90 s | "
           "in band | within 10% |", "|---|---|---|---|---|---|---|---|"]
    for r in rep.results:
        m = r.run.step
        band = f"{r.band[0]:.3f}-{r.band[2]:.3f} (±{r.band_half_width:.1%})" if r.band else "—"
        inside = "—" if r.in_band is None else ("yes" if r.in_band else "no")
        out.append(f"| {_run(r)} | {SYSTEM_NAMES[r.run.config]} | {m.median:.3f} ({m.p10:.3f}-{m.p90:.3f}) | "
                   f"{r.predicted_s:.3f} | {_pct(r.error)} | {band} | {inside} | "
                   f"{'yes' if r.within else '**no**'} |")
    by_reason: dict[str, list[str]] = {}
    for skip in rep.skipped:
        by_reason.setdefault(skip.reason, []).append(f"{skip.run_id} ({skip.machine.removeprefix('nvidia-')})")
    for reason, runs in by_reason.items():
        out.append(f"\nNot compared ({len(runs)}): {', '.join(runs)}: {reason}.")
    return "\n".join(out)


def systems(rep: Report) -> str:
    out = ["| system | runs | mean abs error | max abs error | within 10% of median |", "|---|---|---|---|---|"]
    for name, s in rep.systems().items():
        out.append(f"| {SYSTEM_NAMES.get(name, name)} | {s['runs']} | {s['mean_abs_error']:.1%} | "
                   f"{s['max_abs_error']:.1%} | {s['within_10pct']}/{s['runs']} |")
    return "\n".join(out)


def phases(rep: Report) -> str:
    head = " | ".join(f"{p} meas / pred (err)" for p in SECTION_NAMES)
    out = [f"| run | system | {head} | phased total meas / pred |", "|---|---|---|---|---|---|"]
    for r in rep.results:
        cells = []
        for name in SECTION_NAMES:
            if name in r.run.phases and name in r.phases_pred:
                meas, pred = r.run.phases[name].median, r.phases_pred[name]
                cells.append(f"{meas:.3f} / {pred:.3f} ({_pct(pred / meas - 1 if meas > 0 else math.nan)})")
            else:
                cells.append("—")
        total = r.run.phased_total
        tot = f"{total.median:.3f} / {_s(r.phased_total_pred)}" if total and math.isfinite(r.phased_total_pred) else "—"
        out.append(f"| {_run(r)} | {r.run.config} | {' | '.join(cells)} | {tot} |")
    timed = [r for r in rep.results if measured_timers(r.run)]
    if timed:
        names = [t.name for t in TIMERS if any(t.name in measured_timers(r.run) for r in timed)]
        out.append("")
        out.append("Inside `step()`: medians of the phased steps' timers around DeepSpeed's own methods, measured / "
                   "predicted, seconds (the step script's `t_<name>_s` columns):")
        out.append("")
        out += [f"* **{t.name}**: {t.description}." for t in TIMERS if t.name in names]
        out.append("")
        out.append("| run | " + " | ".join(names) + " |")
        out.append("|---|" + "---|" * len(names))
        for r in timed:
            meas = measured_timers(r.run)
            cells = []
            for k in names:
                m, p = meas.get(k), r.timers_pred.get(k)
                cells.append("—" if m is None else (f"{m:.3f}" if p is None else f"{m:.3f} / {p:.3f}"))
            out.append(f"| {_run(r)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def effects(rep: Report) -> str:
    out = ["| effect | run (vs base) | measured Δ step | predicted Δ step | error of the effect | "
           "Δ forward meas / pred | Δ backward meas / pred | Δ step() meas / pred |",
           "|---|---|---|---|---|---|---|---|"]
    for e in rep.effects():
        ph = e["phases"]
        cells = [f"{ph[p]['measured_s']:+.3f} / {ph[p]['predicted_s']:+.3f}" if p in ph else "—" for p in SECTION_NAMES]
        err = _pct(e["error_of_effect"])
        if not e["resolved"]:
            err += f" (measured Δ within the runs' spread ±{e['measured_noise_s']:.3f} s: not resolved)"
        if not e["same_session"]:
            err += " (the two runs come from different device sessions: machine drift not controlled)"
        out.append(f"| {e['effect']} | {e['run_id']} (vs {e['base_run_id']}) | {e['measured_s']:+.3f} s "
                   f"({e['measured_rel']:+.1%}) | {e['predicted_s']:+.3f} s ({e['predicted_rel']:+.1%}) | "
                   f"{err} | {' | '.join(cells)} |")
    return "\n".join(out)


def bands(rep: Report) -> str:
    cov = rep.coverage()
    if not cov["runs_with_band"]:
        return "No measured run has a band (no profile with spread data)."
    lines = [
        f"{cov['inside']}/{cov['runs_with_band']} measured medians lie inside their predicted p10-p90 band "
        f"(coverage {cov['coverage']:.0%}; target >= {BAND_TARGET_COVERAGE:.0%}). Band half-width: median "
        f"±{cov['half_width_median']:.1%}, widest ±{cov['half_width_max']:.1%} "
        f"(target <= ±{BAND_TARGET_HALF_WIDTH:.0%}). "
        f"{BAND_REPLAYS} replays per run, seed {BAND_SEED}.",
    ]
    if cov["outside"]:
        lines.append("")
        lines.append("Outside their band: " + ", ".join(cov["outside"]) + ".")
    return "\n".join(lines)


def calibrated_vs_analytic(rep: Report) -> str:
    analytic = validate_measured(overrides=["hardware.calibration=null"])
    by_id = {(r.run.run_id, r.run.machine): r for r in analytic.results}
    out = ["| run | measured s | calibrated profile | error | analytic profile | error |", "|---|---|---|---|---|---|"]
    for r in rep.results:
        a = by_id.get((r.run.run_id, r.run.machine))
        out.append(f"| {_run(r)} | {r.run.step.median:.3f} | {r.predicted_s:.3f} | {_pct(r.error)} | "
                   f"{_s(a.predicted_s if a else None)} | {_pct(a.error if a else None)} |")
    return "\n".join(out)


def sections() -> dict[str, Callable[[], str]]:
    cache: dict[str, Report] = {}

    def rep() -> Report:
        if "r" not in cache:
            cache["r"] = validate_measured(bands=BAND_REPLAYS, seed=BAND_SEED)
        return cache["r"]

    return {
        "references": references,
        "measured-steps": lambda: measured_steps(rep()),
        "measured-systems": lambda: systems(rep()),
        "measured-phases": lambda: phases(rep()),
        "measured-effects": lambda: effects(rep()),
        "measured-bands": lambda: bands(rep()),
        "calibrated-vs-analytic": lambda: calibrated_vs_analytic(rep()),
    }


def write(page: Path) -> int:
    text = page.read_text()
    missing = []
    for name, make in sections().items():
        tag = re.escape(name)
        pattern = re.compile(rf"(<!-- generated:{tag} -->\n)(?:.*?\n)?(<!-- /generated:{tag} -->)", re.DOTALL)
        if not pattern.search(text):
            missing.append(name)
            continue
        body = make()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    page.write_text(text)
    for name in missing:
        print(f"validation_report: {page}: no markers for section '{name}'", file=sys.stderr)
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="PAGE.md", help="replace the generated sections of this page in place")
    args = p.parse_args(argv)
    if args.write:
        return write(Path(args.write))
    for name, make in sections().items():
        print(f"<!-- generated:{name} -->\n{make()}\n<!-- /generated:{name} -->\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
