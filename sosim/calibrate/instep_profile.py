"""In-step figures into a profile (issue 23 item 1): the isolated sections' curves rescaled to what the same work
cost inside this machine's real steps (the ``instep`` section, instep_bench.py).

Torch-free and sosim-free (the profile writer runs it on the GPU machine). For each component the instep
section times with DeepSpeed's own method, the factor is the in-step per-call time over the isolated section's
time for the same call (same elements per call, same thread count, per-element time interpolated over log
elements between the measured sizes, clamped at the ends):

- ``ds_refresh/zero3``: zero3's ``_reassign_or_swap_out_partitioned_parameters`` per call (one call per
  sub-group; elements per call = parameters / sub-groups; all threads);
- ``ds_refresh/superoffload``: the same under SuperOffload, at the main process's share of the cores
  (int(0.2 x cores), SuperOffloadCPUOptimizer._set_cpu_affinity: the instep row's threads, read after the steps);
- ``cpu_adam/deepspeed``: ZeRO-2's ``_optimizer_step`` (DeepSpeed CPUAdam over every parameter, one call, all
  threads).

The derived rows are the isolated rows (every size and thread count) times the factor, under variant
``<variant>@instep`` (a variant of its own, so the calibration table's lease-to-lease spread never reads the
isolated-vs-in-step difference as a second lease); CalibrationTable's lookups take an ``@instep`` variant where
one exists. One factor per component: the in-step run measures one size, so the shape of the curve over sizes
and threads stays the isolated section's (an approximation the profile's sources state).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Row = Mapping[str, str]
INSTEP_SUFFIX = "@instep"
# (op, variant of the isolated section) <- (instep system, component).
SOURCES: tuple[tuple[str, str, str, str], ...] = (
    ("ds_refresh", "zero3", "zero3", "refresh"),
    ("ds_refresh", "superoffload", "superoffload", "refresh"),
    ("cpu_adam", "deepspeed", "zero2", "optimizer"),
)


@dataclass(frozen=True)
class Factor:
    op: str
    variant: str
    factor: float
    instep_s: float
    isolated_s: float
    elements: float
    threads: int
    how: str


def _f(row: Row, key: str) -> float:
    text = (row.get(key) or "").strip()
    return float(text) if text else math.nan


def per_element_at(rows: Iterable[Row], elements: float, threads: int) -> float | None:
    """Isolated per-element time at ``elements`` from the rows at exactly ``threads`` (log-linear in elements,
    flat beyond the measured sizes); None without rows at that thread count."""
    points = sorted((_f(r, "elements"), _f(r, "median_s") / _f(r, "elements")) for r in rows
                    if _f(r, "threads") == threads and _f(r, "elements") > 0 and _f(r, "median_s") > 0)
    if not points:
        return None
    if elements <= points[0][0]:
        return points[0][1]
    if elements >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= elements <= x1:
            w = (math.log(elements) - math.log(x0)) / (math.log(x1) - math.log(x0)) if x1 > x0 else 0.0
            return y0 + w * (y1 - y0)
    return None


def read_instep(path: Path) -> dict[tuple[str, str], Row]:
    """(system, component) -> its ``all`` row (and ``<component>_calls``) of instep.csv."""
    with path.open(newline="") as handle:
        return {(r["system"], r["component"]): r for r in csv.DictReader(handle) if r.get("part") == "all"}


def factors(measurements: Sequence[Row], instep: Mapping[tuple[str, str], Row]) -> list[Factor]:
    out = []
    for op, variant, system, component in SOURCES:
        step = instep.get((system, component))
        calls_row = instep.get((system, f"{component}_calls"))
        isolated = [r for r in measurements if r.get("op") == op and r.get("variant") == variant]
        if step is None or calls_row is None or not isolated:
            continue
        calls = _f(calls_row, "median_s")
        params, cores = _f(step, "params"), int(_f(step, "threads"))
        if not (calls >= 1 and params > 0 and cores > 0):
            continue
        # The instep row's threads are the measuring process's affinity after its steps: under SuperOffload the main
        # process that refreshes is pinned to its share of the cores by then (int(0.2 x cores)).
        threads = cores
        elements = params / calls
        per = per_element_at(isolated, elements, threads)
        if per is None:
            continue
        instep_s, isolated_s = _f(step, "median_s") / calls, per * elements
        out.append(Factor(op, variant, instep_s / isolated_s, instep_s, isolated_s, elements, threads,
                          f"{system} {component} in step: {instep_s * 1e3:.1f} ms per call ({calls:g} calls of "
                          f"{elements:.3g} elements, {threads} threads) vs {op}/{variant} isolated "
                          f"{isolated_s * 1e3:.1f} ms: x{instep_s / isolated_s:.3f}"))
    return out


def derived_rows(measurements: Sequence[Row], found: list[Factor]) -> list[dict[str, str]]:
    """The isolated rows of each factor's section, times scaled, under variant ``<variant>@instep``."""
    out = []
    for f in found:
        for r in measurements:
            if r.get("op") != f.op or r.get("variant") != f.variant:
                continue
            row = dict(r)
            row["variant"] = f.variant + INSTEP_SUFFIX
            for key in ("median_s", "p10_s", "p90_s"):
                if (r.get(key) or "").strip():
                    row[key] = f"{float(r[key]) * f.factor:.9g}"
            out.append(row)
    return out


def write_instep_table(cal_dir: Path, columns: Iterable[str]) -> tuple[Path | None, list[Factor]]:
    """``cal_dir/instep_table.csv`` from ``measurements.csv`` and ``instep.csv`` there; (None, []) without them."""
    meas_path, instep_path = cal_dir / "measurements.csv", cal_dir / "instep.csv"
    if not meas_path.is_file() or not instep_path.is_file():
        return None, []
    with meas_path.open(newline="") as handle:
        measurements = list(csv.DictReader(handle))
    found = factors(measurements, read_instep(instep_path))
    rows = derived_rows(measurements, found)
    if not rows:
        return None, found
    path = cal_dir / "instep_table.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path, found
