"""``sosim compare A.yaml B.yaml ...``: key metrics of several scenarios side by side, with the speedup of
each relative to the first. ``--set`` overrides apply to every scenario (e.g. the same micro-batch)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from sosim.formats import safe_write
from sosim.formats.output import (
    format_value,
    plot_suffixes,
    print_json,
    provenance_fields,
)
from sosim.run.result import BREAKDOWN_KEYS, Result

# Rows of the table, in order; the breakdown follows so that the reader sees why one is faster.
KEY_METRICS: tuple[str, ...] = (
    "step_time_s", "tokens_per_s", "model_tflops", "mfu", "gpu_busy_frac",
    *BREAKDOWN_KEYS,
    "gpu_mem_peak_gib", "cpu_mem_peak_gib", "params_b", "link_gb_per_step", "feasible",
)


def unique_labels(results: Sequence[Result], paths: Sequence[str | Path] | None = None) -> list[str]:
    """Scenario names, falling back to file stems (then an index) where names repeat."""
    labels = [r.scenario.name for r in results]
    if len(set(labels)) < len(labels) and paths is not None:
        labels = [Path(p).stem for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{i}:{label}" for i, label in enumerate(labels)]
    return labels


def compare_frame(results: Sequence[Result], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per result: system, hardware, the key metrics and ``speedup`` (tokens/s over the first's)."""
    names = list(labels) if labels is not None else unique_labels(results)
    rows = []
    base = float(results[0].metrics["tokens_per_s"]) if results else math.nan
    for label, r in zip(names, results):
        m = r.metrics
        tps = float(m["tokens_per_s"])
        speedup = tps / base if base > 0 else math.nan
        prov = provenance_fields(r.scenario)
        rows.append({"label": label, "system": r.scenario.schedule.system, "hardware": r.scenario.hardware.name,
                     "implementation": prov["implementation"], "calibration": prov["calibration"] or "none",
                     **{k: m[k] for k in KEY_METRICS}, "speedup": speedup, "reason": m["reason"]})
    return pd.DataFrame(rows).set_index("label")


def format_table(frame: pd.DataFrame) -> str:
    """Metrics as rows, scenarios as columns (reads well for 2-6 scenarios)."""
    shown = frame.drop(columns=["reason"]).T
    header = ["metric", *shown.columns]
    body = [[str(idx), *(format_value(v) for v in row)] for idx, row in zip(shown.index, shown.itertuples(index=False))]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in [header, *body]]
    notes = [f"{label}: INFEASIBLE: {reason}" for label, reason in frame["reason"].items() if reason]
    return "\n".join([*lines, *(["", *notes] if notes else [])])


def cmd_compare(args: argparse.Namespace) -> int:
    from sosim.run.loader import input_files, load_scenario
    from sosim.run.simulate import simulate

    force, inputs = getattr(args, "force", False), input_files(args.scenarios)
    plot = (safe_write.prepare_output(args.plot, "--plot", "figure", safe_write.FIGURE, force=force, inputs=inputs,
                                      suffixes=plot_suffixes()) if args.plot is not None else None)
    # Load everything first so that a typo in the last file is reported before any simulation runs.
    scenarios = [load_scenario(path, args.overrides) for path in args.scenarios]
    results = [simulate(sc) for sc in scenarios]
    frame = compare_frame(results, unique_labels(results, args.scenarios))
    if plot is not None:
        from sosim.formats.plot import plot_compare

        safe_write.write_atomic(plot, "--plot", "figure", lambda p: plot_compare(results, p, list(frame.index)),
                                safe_write.FIGURE, force=force, inputs=inputs)
    if args.format == "json":
        rows = [{"label": label, **row} for label, row in frame.to_dict(orient="index").items()]
        print_json({"baseline": frame.index[0], "scenarios": rows})
    else:
        print(format_table(frame))
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("compare", help="key metrics of several scenarios side by side")
    p.add_argument("scenarios", nargs="+", metavar="SCENARIO.yaml", help="scenario files; the first is the baseline")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override applied to every scenario; repeatable")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--plot", metavar="OUT.png", help="write a tokens/s + breakdown bar chart")
    p.set_defaults(func=cmd_compare)
