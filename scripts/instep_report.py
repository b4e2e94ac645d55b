"""Host components isolated vs in-step, per component kind, on one lease (issue 23 item 1).

    python scripts/instep_report.py CAL_DIR   # a calibration folder with measurements.csv + instep.csv

The in-step figures are the ``instep`` section's (sosim/calibrate/instep_bench.py: short real steps of the 0.5b
Llama, seq 2048, micro-batch 2, under zero2 / zero3 / zero3 + offload_param / superoffload, timed from inside
DeepSpeed's own methods). The isolated figure of the same work is the same lease's isolated section looked up
through sosim's calibration table at the in-step run's sizes (:class:`sosim.costs.calibration_table.CalibrationTable`,
the lookups the simulator makes):

- ``refresh``: ``_reassign_or_swap_out_partitioned_parameters`` per step (zero3, zero3_param: every sub-group,
  ds_refresh/zero3 at elements = params / sub-groups, all threads; superoffload: ds_refresh/superoffload at the
  main process's share of the cores);
- ``adam``: ``_optimizer_step`` per step (zero2, zero3, zero3_param: DeepSpeed CPUAdam over every parameter, in
  sub-groups for stage 3; cpu_adam/deepspeed at all threads). SuperOffload's Adam runs in its worker (not here).

Each line: system, component, in-step median (start / middle / end of the run), isolated, in-step / isolated.
Data only: every number is read from the folder's two files.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class InStep:
    median_s: float
    parts: dict[str, float]
    calls: float
    params: float
    subgroups: float
    threads: float


def read_instep(path: Path) -> dict[tuple[str, str], InStep]:
    rows = list(csv.DictReader(path.open(newline="")))
    by: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    for row in rows:
        by.setdefault((row["system"], row["component"]), {})[row["part"]] = row
    out: dict[tuple[str, str], InStep] = {}
    for (system, component), parts in by.items():
        if component.endswith("_calls") or "all" not in parts:
            continue
        whole = parts["all"]
        calls_row = by.get((system, f"{component}_calls"), {}).get("all")
        out[(system, component)] = InStep(
            median_s=float(whole["median_s"]),
            parts={p: float(r["median_s"]) for p, r in parts.items() if p != "all"},
            calls=float(calls_row["median_s"]) if calls_row else float("nan"),
            params=float(whole["params"] or "nan"),
            subgroups=float(whole["subgroups"] or "nan"),
            threads=float(whole["threads"] or "nan"),
        )
    return out


def isolated_s(table: object, system: str, component: str, step: InStep) -> tuple[float | None, str]:
    """The isolated section's figure for the same work, and how it was looked up."""
    from sosim.costs.calibration_table import CalibrationTable

    assert isinstance(table, CalibrationTable)
    groups = step.subgroups if step.subgroups == step.subgroups and step.subgroups > 0 else 1.0
    if component == "refresh":
        if system == "superoffload":
            # The row's threads: the main process's affinity after its steps, which SuperOffload has pinned to
            # int(0.2 x cores) (SuperOffloadCPUOptimizer._set_cpu_affinity).
            main = int(step.threads)
            per = table.ds_refresh_time_s(step.params / groups, main, "superoffload")
            return (None if per is None else per * groups), f"ds_refresh/superoffload x {groups:g} at {main} threads"
        per = table.ds_refresh_time_s(step.params / groups, step.threads, "zero3")
        return (None if per is None else per * groups), f"ds_refresh/zero3 x {groups:g} at {step.threads:g} threads"
    if component == "optimizer" and system != "superoffload":
        chunks = 1.0 if system == "zero2" else groups
        per = table.cpu_adam_time_s(step.params / chunks, step.threads, "deepspeed")
        return (None if per is None else per * chunks), f"cpu_adam/deepspeed x {chunks:g} at {step.threads:g} threads"
    return None, ""


def report(cal_dir: Path) -> str:
    from sosim.costs.calibration_table import CalibrationTable

    steps = read_instep(cal_dir / "instep.csv")
    table = CalibrationTable.from_csv(cal_dir / "measurements.csv")
    lines = [f"isolated vs in-step, {cal_dir}",
             f"{'system':<13} {'component':<10} {'in-step s':>9} {'start/middle/end s':>22} {'isolated s':>10} "
             f"{'ratio':>6}  isolated lookup"]
    for (system, component), step in sorted(steps.items()):
        iso, how = isolated_s(table, system, component, step)
        if not how:
            continue
        parts = "/".join(f"{step.parts.get(p, float('nan')):.3f}" for p in ("start", "middle", "end"))
        ratio = f"{step.median_s / iso:.2f}" if iso else "-"
        iso_text = f"{iso:.4f}" if iso is not None else "none"
        lines.append(f"{system:<13} {component:<10} {step.median_s:>9.4f} {parts:>22} {iso_text:>10} {ratio:>6}  {how}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cal_dir", type=Path)
    args = parser.parse_args(argv)
    for name in ("instep.csv", "measurements.csv"):
        if not (args.cal_dir / name).is_file():
            print(f"instep_report: {args.cal_dir / name}: not found", file=sys.stderr)
            return 2
    print(report(args.cal_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
