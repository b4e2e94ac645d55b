"""Design-space sweeps: a grid (or list) of ``key.path`` overrides over a base scenario, one row per point.

Sweep file::

    base: ../gh200_zero_offload_4b.yaml      # relative to this file
    set: {training.iterations: 3}            # fixed overrides for every point (optional)
    grid:                                    # cartesian product (optional)
      schedule.bucket_mb: [64, 256, 1000]
      training.micro_batch: [1, 2, 4, 8]
    points:                                  # explicit points (optional); with a grid, each point is
      - {model.layers: 20, model.hidden: 2048}   # crossed with every grid combination
      - {model.layers: 40, model.hidden: 2048}

Points run through any :class:`concurrent.futures.Executor` (a local process pool, or Dask's
``Client.get_executor()``), batched into chunks so that inter-process traffic does not dominate a 5 ms
simulation. The CLI appends each finished chunk to the output (CSV rows, or one Parquet part file per
chunk) so an interrupted sweep loses nothing, and ``--resume`` skips points whose id (a hash of their
overrides) is already there. A point that fails becomes a row with an ``error``; an infeasible point is a
row with ``feasible`` False.

Why this module is over 500 lines: a sweep is one command with four parts that share SweepSpec and the row schema:
the sweep file with located errors, chunked running on any executor, the incremental output that survives an
interruption (_Output), and the CLI; the incremental output could join sweep_resume.py next.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import importlib.util
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sosim.answers.sweep_resume import check_out_target, check_parts, read_done_csv
from sosim.formats.output import check_output_path, non_finite_metrics, print_json, provenance_fields
from sosim.inputs.config import Scenario
from sosim.inputs.errors import KEY_PATH_KINDS, ConfigError, Problem, SosimError
from sosim.inputs.safe_read import is_file, path_problem, shown_path
from sosim.run.loader import KeyPath, Located, dotted, read_yaml, resolve_scenario_path

Point = dict[str, Any]  # dotted key path -> value
Row = dict[str, Any]

SWEEP_KEYS = ("base", "set", "grid", "points", "name", "description")
# Chunks per worker kept in flight: enough to hide scheduling gaps, few enough to bound memory.
IN_FLIGHT_PER_WORKER = 3
MAX_CHUNK = 250  # points per task: ~1.5 s of work, so per-task IPC (~ms) is noise
ID_COLUMN = "point_id"
ERROR_COLUMN = "error"
# Provenance of every row: the system, its implementation, the hardware profile and the calibration table.
PROVENANCE_COLUMNS = ("system", "implementation", "profile", "calibration")
TEXT_COLUMNS = ("scenario", *PROVENANCE_COLUMNS, "reason", ERROR_COLUMN)
# Points in one sweep. Points, their ids and overrides are held in memory (~2 KB each); a million is ~2 GB
# and a day of simulation on a 16-core machine. Larger studies: several sweep files.
MAX_SWEEP_POINTS = 1_000_000
# Local processes per core: a simulation is CPU-bound pure Python, so more gains nothing.
MAX_WORKERS_PER_CORE = 4


# --------------------------------------------------------------------------------------------- points


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[Point]:
    """Cartesian product of ``{key.path: [values]}`` in key order (the last key varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(list(grid[k]) for k in keys))]


def override_strings(point: Mapping[str, Any]) -> list[str]:
    """``{key: value}`` -> ``["key=value", ...]``; values are written as JSON, which the loader reads as YAML."""
    return [f"{key}={json.dumps(value)}" for key, value in point.items()]


def point_id(point: Mapping[str, Any]) -> str:
    """Stable id of a point: a hash of its overrides (independent of key order and of the run)."""
    blob = json.dumps(dict(point), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------- simulation


def _metrics_row(sc: Scenario) -> Row:
    from sosim.run.simulate import simulate

    result = simulate(sc)
    bad = non_finite_metrics(result.metrics)
    if bad:  # not an answer: an error row, never a number that is not one
        return {ERROR_COLUMN: f"the simulation gave non-finite {', '.join(bad)}: an input is outside the range "
                              "the model handles"}
    return {"scenario": sc.name, "system": sc.schedule.system, **provenance_fields(sc), **result.metrics,
            ERROR_COLUMN: None}


def _simulate_point(base: Mapping[str, Any] | None, target: list[str] | Scenario) -> Row:
    """Metrics of one point, or its error: a sweep never stops for one bad point."""
    from sosim.run.loader import load_scenario

    try:
        sc = target if isinstance(target, Scenario) else load_scenario(base or {}, target)
        return _metrics_row(sc)
    except SosimError as exc:
        return {ERROR_COLUMN: str(exc)}
    except Exception as exc:  # a bug in a schedule for an odd point: record it, keep sweeping
        return {ERROR_COLUMN: f"{type(exc).__name__}: {exc}"}


def run_chunk(base: Mapping[str, Any] | None, items: Sequence[tuple[str, list[str] | Scenario]]) -> list[Row]:
    """Worker task: simulate a batch of ``(point_id, overrides or Scenario)``. Module-level so it pickles."""
    return [{ID_COLUMN: pid, **_simulate_point(base, target)} for pid, target in items]


# ------------------------------------------------------------------------------------------ sweep file


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: the base scenario as data, fixed overrides and the points."""

    path: Path | None
    base: dict[str, Any]  # raw scenario data with the hardware profile resolved into it
    fixed: Point
    points: list[Point]
    keys: list[str]  # swept key paths, in first-seen order
    metric_keys: list[str] = field(default_factory=list)

    def overrides(self, point: Mapping[str, Any]) -> list[str]:
        return override_strings({**self.fixed, **point})

    def full_point(self, point: Mapping[str, Any]) -> Point:
        return {**self.fixed, **point}


def _where(loc: Located, path: KeyPath) -> str:
    return loc.where(path)


def hardware_data(sc: Scenario) -> dict[str, Any]:
    """The resolved profile as data for the workers: only the fields the profile states. Fields left at their
    defaults stay out, or the profile check would ask for a source for numbers the profile never gave."""
    return sc.hardware.model_dump(mode="json", exclude_unset=True)


def _base_data(base_path: Path) -> tuple[dict[str, Any], Scenario]:
    """The base as raw YAML data plus its resolved hardware.

    Raw data rather than ``Scenario.model_dump``: a dump would freeze the implementation-dependent schedule
    defaults, so a swept ``schedule.implementation`` would silently keep the other implementation's values.
    """
    from sosim.run.loader import load_scenario

    sc = load_scenario(base_path)
    raw = read_yaml(base_path).data
    data = dict(raw) if isinstance(raw, dict) else {}
    data["hardware"] = hardware_data(sc)
    return data, sc


def _structure_problems(loc: Located) -> list[str]:
    data = loc.data
    if not isinstance(data, dict):
        return [f"{loc.origin}:1: (top level): a sweep file must be a mapping with 'base' and 'grid' and/or 'points'"]
    problems = [f"{_where(loc, (k,))}: {dotted((k,))}: unknown key (expected one of {', '.join(SWEEP_KEYS)})"
                for k in data if k not in SWEEP_KEYS]
    if not isinstance(data.get("base"), str):
        problems.append(f"{_where(loc, ('base',))}: base: missing (the scenario YAML, relative to this file)")
    grid, points, fixed = data.get("grid"), data.get("points"), data.get("set")
    if grid is None and points is None:
        problems.append(f"{loc.origin}:1: (top level): nothing to sweep: give 'grid' and/or 'points'")
    if grid is not None:
        if not isinstance(grid, dict):
            problems.append(f"{_where(loc, ('grid',))}: grid: must be a mapping of key.path: [values]")
        elif not grid:
            problems.append(f"{_where(loc, ('grid',))}: grid: empty grid (give at least one key.path: [values])")
        else:
            for key, values in grid.items():
                if not isinstance(values, list) or not values:
                    where = _where(loc, ("grid", key))
                    problems.append(f"{where}: {dotted(('grid', key))}: must be a non-empty list of values")
    if points is not None:
        if not isinstance(points, list) or not points:
            problems.append(f"{_where(loc, ('points',))}: points: must be a non-empty list of mappings")
        else:
            for i, p in enumerate(points):
                if not isinstance(p, dict) or not p:
                    problems.append(f"{_where(loc, ('points', i))}: points[{i}]: must be a non-empty mapping")
    if fixed is not None and not isinstance(fixed, dict):
        problems.append(f"{_where(loc, ('set',))}: set: must be a mapping of key.path: value")
    for path, key in _keys(data):
        if not isinstance(key, str):
            problems.append(f"{_where(loc, path)}: {dotted(path)}: a key must be a key.path string, not {key!r}")
    for path, value in _leaves(data, ()):
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{_where(loc, path)}: {dotted(path)}: not a finite number ({value}); give a finite value")
    if not problems:
        problems += _size_problems(loc, data)
    return problems


def _keys(data: Mapping[str, Any]) -> Iterator[tuple[KeyPath, Any]]:
    """(location, key) of every override key in set/grid/points."""
    for section in ("set", "grid"):
        if isinstance(data.get(section), dict):
            for key in data[section]:
                yield (section, key), key
    if isinstance(data.get("points"), list):
        for i, p in enumerate(data["points"]):
            if isinstance(p, dict):
                for key in p:
                    yield ("points", i, key), key


def _leaves(value: Any, path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def _size_problems(loc: Located, data: Mapping[str, Any]) -> list[str]:
    """The number of points, computed before any point is built."""
    grid = data.get("grid") or {}
    sizes = [len(v) for v in grid.values()]
    listed = len(data.get("points") or [None])
    total = math.prod(sizes) * listed
    if total <= MAX_SWEEP_POINTS:
        return []
    shape = " x ".join(f"{n:,}" for n in ([*sizes, listed] if data.get("points") else sizes))
    return [f"{_where(loc, ('grid',) if grid else ('points',))}: {'grid' if grid else 'points'}: {shape} = "
            f"{total:,} points, more than the {MAX_SWEEP_POINTS:,} one sweep runs; split it into several sweep "
            "files"]


def _key_locations(loc: Located, data: dict[str, Any]) -> dict[str, str]:
    """Swept/fixed key -> 'file:line' of its first mention in the sweep file."""
    where: dict[str, str] = {}
    for key in data.get("set") or {}:
        where.setdefault(str(key), _where(loc, ("set", key)))
    for key in data.get("grid") or {}:
        where.setdefault(str(key), _where(loc, ("grid", key)))
    for i, p in enumerate(data.get("points") or []):
        for key in p:
            where.setdefault(str(key), _where(loc, ("points", i, key)))
    return where


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _map_problem(problem: Problem, texts: Mapping[str, str], where: Mapping[str, str]) -> tuple[str | None, str]:
    """A load_scenario problem about an override -> (sweep key or None, 'file:line: key: message')."""
    for text in problem.overrides:  # the --set texts the loader put it on
        key = texts.get(text)
        if key is not None:
            message = problem.message if problem.path and _related(problem.path, key) else problem.what
            return key, f"{where[key]}: {dotted((key,))}: {message}"
    # A whole-section check ('<dict>:N: dotted.path: message'): blame the swept key it concerns, if any.
    for key in where:
        if problem.path and _related(problem.path, key):
            return key, f"{where[key]}: {dotted((key,))}: {problem.message}"
    return None, str(problem)


def _check_keys(spec: SweepSpec, where: Mapping[str, str]) -> list[str]:
    """Try the first point that mentions each key (and the fixed overrides) through the loader.

    Unknown key paths, and any problem with a fixed ``set:`` override (it would fail every point), stop the
    sweep before it starts; a bad value at one grid point is left for that point's row.
    """
    from sosim.run.loader import load_scenario

    problems: list[str] = []
    seen: set[str] = set()
    probes: list[Point] = []
    for p in spec.points:
        if not set(p) <= seen:  # this point introduces a key not tried yet
            probes.append(p)
            seen.update(p)
    for point in probes or [{}]:
        full = spec.full_point(point)
        texts = dict(zip(override_strings(full), full))
        try:
            load_scenario(spec.base, list(texts))
        except ConfigError as exc:
            for problem in exc.details:
                key, line = _map_problem(problem, texts, where)
                # A problem with the key path itself (not a bad value at one point), or with a fixed override.
                fatal = key is not None and (problem.kind in KEY_PATH_KINDS or (key in spec.fixed and key not in point))
                if fatal and line not in problems:
                    problems.append(line)
    return problems


def sweep_spec(base: str | Path | Scenario | Mapping[str, Any], points: Iterable[Mapping[str, Any]],
               fixed: Mapping[str, Any] | None = None) -> SweepSpec:
    """A SweepSpec from Python values (no key-path validation; bad points become error rows)."""
    from sosim.run.loader import load_scenario

    if isinstance(base, Scenario):
        data = base.model_dump(mode="json")
        data["hardware"] = hardware_data(base)
    elif isinstance(base, Mapping):
        # Resolve a profile name once here rather than once per point in the workers.
        data = dict(base)
        data["hardware"] = hardware_data(load_scenario(base))
    else:
        data, _ = _base_data(Path(base))
    pts = []
    for p in points:
        pts.append(dict(p))
        if len(pts) > MAX_SWEEP_POINTS:
            raise SosimError(f"more than {MAX_SWEEP_POINTS:,} points in one sweep; split it into several")
    keys = list(dict.fromkeys(k for p in pts for k in p))
    from sosim.run.result import METRICS

    return SweepSpec(path=None, base=data, fixed=dict(fixed or {}), points=pts, keys=keys,
                     metric_keys=[spec.name for spec in METRICS])


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file; every problem is reported (as file:line) before any point runs."""
    sweep_path = resolve_scenario_path(path)  # a file, or a shipped example such as sweeps/NAME
    loc = read_yaml(sweep_path)
    problems = _structure_problems(loc)
    if problems:
        raise ConfigError(problems)
    data: dict[str, Any] = loc.data
    problem = path_problem(str(data["base"]))  # a name no file can have: not resolved, not stat'ed
    if problem is not None:
        raise ConfigError([f"{_where(loc, ('base',))}: base: {problem}"])
    base_path = (sweep_path.parent / data["base"]).resolve()
    if not is_file(base_path):
        raise ConfigError([f"{_where(loc, ('base',))}: base: no such scenario file: {shown_path(base_path)}"])
    base, _ = _base_data(base_path)
    grid_points = expand_grid(data["grid"]) if data.get("grid") else [{}]
    listed = [dict(p) for p in data["points"]] if data.get("points") else [{}]
    points = [{**p, **g} for p in listed for g in grid_points]
    keys = list(dict.fromkeys(str(k) for p in points for k in p))
    from sosim.run.result import METRICS

    # The declared metric schema fixes the output columns, even if the first points fail (no probe run).
    metric_keys = [spec.name for spec in METRICS]
    spec = SweepSpec(path=sweep_path, base=base, fixed={str(k): v for k, v in (data.get("set") or {}).items()},
                     points=points, keys=keys, metric_keys=metric_keys)
    problems = _check_keys(spec, _key_locations(loc, data))
    if problems:
        raise ConfigError(problems)
    return spec


# ------------------------------------------------------------------------------------------- running


def default_chunk_size(n_points: int, workers: int) -> int:
    """A few hundred points per task, but at least a few tasks per worker so small sweeps still spread."""
    return max(1, min(MAX_CHUNK, math.ceil(n_points / max(1, workers * IN_FLIGHT_PER_WORKER))))


def _executor_workers(executor: Executor | None) -> int:
    return int(getattr(executor, "_max_workers", 0) or os.cpu_count() or 1)


class ChunksFailed(SosimError):
    """Tasks of a run failed as a whole (a worker died, a lost connection); the other chunks were handed on."""


def run_items(
    base: Mapping[str, Any] | None,
    items: Sequence[tuple[str, list[str] | Scenario]],
    sink: Callable[[list[Row]], None],
    *,
    executor: Executor | None = None,
    chunk_size: int | None = None,
    progress: bool | None = False,
) -> None:
    """Simulate ``items`` in chunks, handing each finished chunk's rows to ``sink`` (in completion order).

    ``executor=None`` runs in this process. A chunk whose task fails as a whole (a worker died) is not
    handed to the sink; the others are, then a SosimError names the failure so a resumed run retries it.
    """
    from tqdm import tqdm  # plain (not .auto): no ipywidgets warning in notebooks; the bar goes to stderr

    workers = 1 if executor is None else _executor_workers(executor)
    size = chunk_size or default_chunk_size(len(items), workers)
    n_chunks = math.ceil(len(items) / size)
    # Strided, not contiguous: neighbouring grid points cost alike (the same bucket count, say), so striding
    # gives every chunk a similar mix and the last chunks do not leave one worker finishing alone.
    chunks = [list(items[i::n_chunks]) for i in range(n_chunks)]
    bar = tqdm(total=len(items), unit="pt", file=sys.stderr, disable=(None if progress is None else not progress),
               desc="sweep", dynamic_ncols=True)
    failures: list[str] = []
    try:
        if executor is None:
            for chunk in chunks:
                sink(run_chunk(base, chunk))
                bar.update(len(chunk))
            return
        todo: Iterator[list[tuple[str, list[str] | Scenario]]] = iter(chunks)
        pending: dict[Future[list[Row]], int] = {}

        def refill() -> None:
            while len(pending) < workers * IN_FLIGHT_PER_WORKER:
                chunk = next(todo, None)
                if chunk is None:
                    return
                pending[executor.submit(run_chunk, base, chunk)] = len(chunk)

        refill()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                n = pending.pop(fut)
                try:
                    rows = fut.result()
                except Exception as exc:  # the task, not a point, failed (worker crash, lost connection)
                    failures.append(f"{type(exc).__name__}: {exc}")
                else:
                    sink(rows)
                bar.update(n)
            refill()
    finally:
        bar.close()
    if failures:
        raise ChunksFailed(f"{len(failures)} of {n_chunks} chunk(s) failed (first: {failures[0]})")


def _column_dtypes(keys: Sequence[str], points: Sequence[Mapping[str, Any]], metric_keys: Sequence[str],
                   sample: Mapping[str, Any]) -> dict[str, str]:
    """One dtype per column, fixed up front so every chunk (CSV or Parquet part) has the same schema."""
    dtypes: dict[str, str] = {ID_COLUMN: "string"}
    for key in keys:
        values = [p[key] for p in points if key in p]
        if values and all(isinstance(v, bool) for v in values):
            dtypes[key] = "boolean"
        elif values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            dtypes[key] = "Int64"
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            dtypes[key] = "float64"
        else:
            dtypes[key] = "string"
    for col in ("scenario", *PROVENANCE_COLUMNS, *metric_keys, ERROR_COLUMN):
        value = sample.get(col)
        if col in TEXT_COLUMNS or isinstance(value, str):
            dtypes[col] = "string"
        elif isinstance(value, bool):
            dtypes[col] = "boolean"
        else:
            dtypes[col] = "float64"
    return dtypes


def rows_frame(rows: Sequence[Row], dtypes: Mapping[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(list(rows)).reindex(columns=list(dtypes))
    for col, dtype in dtypes.items():
        if dtype == "string":
            frame[col] = frame[col].map(lambda v: v if v is None or isinstance(v, str) or pd.isna(v) else str(v))
        frame[col] = frame[col].astype(dtype)  # type: ignore[call-overload]
    return frame


@dataclass
class _Collector:
    """Rows of finished chunks, with the swept values attached."""

    points: Mapping[str, Point]
    rows: list[Row] = field(default_factory=list)

    def __call__(self, rows: list[Row]) -> None:
        for row in rows:
            self.rows.append({**self.points.get(row[ID_COLUMN], {}), **row})


def sweep(
    scenarios: str | Path | Scenario | Mapping[str, Any] | Sequence[Scenario] | SweepSpec,
    points: Iterable[Mapping[str, Any]] | None = None,
    *,
    executor: Executor | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Simulate many scenarios; one row per scenario or point (all metrics, swept values, ``error``).

    - ``sweep([sc1, sc2, ...])``: a list of :class:`Scenario` objects.
    - ``sweep(base, [{"training.micro_batch": 4}, ...])``: a base (YAML path, dict or Scenario) and points
      of ``key.path -> value`` overrides (see :func:`expand_grid`); columns are named by the key paths.
    - ``sweep(load_sweep("sweep.yaml"))``: a validated sweep file.

    ``executor`` is any ``concurrent.futures.Executor`` (``ProcessPoolExecutor()``, or Dask's
    ``Client.get_executor()``); None runs in this process. Identical points (same overrides) run once.
    """
    if isinstance(scenarios, Sequence) and not isinstance(scenarios, (str, bytes)) and (
            not scenarios or isinstance(scenarios[0], Scenario)):
        scs = list(scenarios)
        if points is not None:
            raise TypeError("sweep(list_of_scenarios) takes no points")
        items = [(str(i), sc) for i, sc in enumerate(scs)]
        collector = _Collector({})
        run_items(None, items, collector, executor=executor, chunk_size=chunk_size, progress=progress)
        frame = pd.DataFrame(collector.rows)
        if frame.empty:
            return frame
        frame["_order"] = frame[ID_COLUMN].astype(int)
        return frame.sort_values("_order").drop(columns=["_order", ID_COLUMN]).reset_index(drop=True)
    if isinstance(scenarios, SweepSpec):
        if points is not None:
            raise TypeError("sweep(SweepSpec) takes no points: they are in the spec")
        spec = scenarios
    else:
        if points is None:
            raise TypeError("sweep(base, points): give the points (e.g. expand_grid({...}))")
        spec = sweep_spec(scenarios, points)  # type: ignore[arg-type]
    order = [point_id(spec.full_point(p)) for p in spec.points]
    by_id = {pid: p for pid, p in zip(order, spec.points)}
    point_items: list[tuple[str, list[str] | Scenario]] = [(pid, spec.overrides(by_id[pid])) for pid in by_id]
    collector = _Collector(by_id)
    run_items(spec.base, point_items, collector, executor=executor, chunk_size=chunk_size, progress=progress)
    frame = pd.DataFrame(collector.rows)
    if frame.empty:
        return frame
    rank = {pid: i for i, pid in enumerate(by_id)}
    frame = frame.sort_values(ID_COLUMN, key=lambda s: s.map(rank)).reset_index(drop=True)
    first = [ID_COLUMN, *spec.keys]
    return frame[first + [c for c in frame.columns if c not in first]]


# ---------------------------------------------------------------------------------- incremental output


# Parquet part files being written or re-sorted: a leading '_' hides them from pyarrow's dataset reader.
_PART_TMP = "_part.tmp"
_SORTED_TMP = "_sorted.tmp"
_SORTED_READY = "_sorted.ready"


def check_out_path(out: str | Path) -> Path:
    """The --out path: a .csv file or a .parquet folder that can be written (checked before any work)."""
    path = Path(out)
    if path.suffix not in (".csv", ".parquet"):
        raise SosimError(f"--out {path}: use a .csv or .parquet name")
    check_out_target(path, parquet=path.suffix == ".parquet")  # never a link, FIFO or device (sweep_resume.py)
    check_output_path(str(path), "--out", folder_ok=path.suffix == ".parquet")
    if path.suffix == ".parquet":
        if importlib.util.find_spec("pyarrow") is None:
            raise SosimError(f"--out {path}: Parquet output needs pyarrow: pip install pyarrow (or use a .csv name)")
        if path.exists() and not path.is_dir():
            raise SosimError(f"--out {path}: exists and is not a folder of Parquet part files")
    return path


class _Output:
    """Chunks appended to a CSV file or written as Parquet part files; both survive an interruption.

    Chunks arrive in completion order; :meth:`finish` rewrites the output in point order once every point
    is in, so the same sweep always gives the same file.
    """

    def __init__(self, path: Path, dtypes: Mapping[str, str], points: Mapping[str, Point], resume: bool) -> None:
        check_out_path(path)
        self.path = path
        self.dtypes = dict(dtypes)
        self.points = points
        self.parquet = path.suffix == ".parquet"
        if path.exists() and not resume:
            raise SosimError(f"--out {path} exists: pass --resume to continue that sweep, or remove it")
        if self.parquet and path.is_dir():
            self._recover_sorted()
        self.done: set[str] = self._read_done() if path.exists() else set()
        self.parts = len(list(path.glob("part-*.parquet"))) if self.parquet and path.is_dir() else 0
        self.rows_written = 0
        self.errors = 0
        self.infeasible = 0
        self.best: Row | None = None
        self.best_key: tuple[float, int] = (-math.inf, 0)
        self.rank = {pid: i for i, pid in enumerate(points)}  # point id -> its place in the sweep

    def _parts(self) -> list[Path]:
        return sorted(self.path.glob("part-*.parquet"))

    def _recover_sorted(self) -> None:
        """Finish a re-sort that was interrupted after its (complete) sorted file was written."""
        ready = self.path / _SORTED_READY
        if ready.exists():
            for part in self._parts():
                part.unlink()
            os.replace(ready, self.path / "part-00000.parquet")
        (self.path / _SORTED_TMP).unlink(missing_ok=True)
        (self.path / _PART_TMP).unlink(missing_ok=True)

    def _read_done(self) -> set[str]:
        if self.parquet:
            if not self.path.is_dir():
                raise SosimError(f"--out {self.path}: expected the folder of part files of an earlier sweep")
            if not self._parts():
                return set()
            check_parts(self.path)
            try:
                ids = pd.read_parquet(self.path, columns=[ID_COLUMN])[ID_COLUMN]
            except Exception as exc:  # pyarrow raises its own types for foreign or damaged files
                raise SosimError(f"--out {self.path}: cannot read its part files ({type(exc).__name__}: {exc}); "
                                 "use another --out") from None
            return set(ids.astype(str))
        # The whole file is read and validated before anything is written (sosim/answers/sweep_resume.py);
        # then a partial last line, which a crash in the middle of an append leaves, is cut: its point reruns.
        done, cut = read_done_csv(self.path, list(self.dtypes))
        if cut is not None:
            with self.path.open("rb+") as fh:
                fh.truncate(cut)
        return done

    def __call__(self, rows: list[Row]) -> None:
        try:
            self._write(rows)
        except OSError as exc:
            raise SosimError(f"--out {self.path}: cannot write: {exc.strerror or exc}; the chunks written so far "
                             "are kept (rerun with --resume once the problem is fixed)") from None

    def _write(self, rows: list[Row]) -> None:
        frame = rows_frame([{**self.points.get(r[ID_COLUMN], {}), **r} for r in rows], self.dtypes)
        if self.parquet:
            self.path.mkdir(parents=True, exist_ok=True)
            final = self.path / f"part-{self.parts:05d}.parquet"
            tmp = self.path / _PART_TMP
            frame.to_parquet(tmp, index=False)
            os.replace(tmp, final)  # atomic: a part file is complete or absent
            self.parts += 1
        else:
            header = not self.path.exists() or self.path.stat().st_size == 0
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(frame.to_csv(index=False, header=header))
        self._tally(frame)

    def _tally(self, frame: pd.DataFrame) -> None:
        self.rows_written += len(frame)
        self.errors += int(frame[ERROR_COLUMN].notna().sum())
        if "feasible" in frame:
            self.infeasible += int((frame["feasible"] == False).sum())  # noqa: E712 (nullable boolean)
            ok = frame[(frame["feasible"] == True) & frame[ERROR_COLUMN].isna()]  # noqa: E712
            if len(ok) and "tokens_per_s" in ok:
                # Ties go to the earlier point of the sweep, so the answer does not depend on which worker
                # finished first (chunks arrive in completion order).
                keys = [(float(t), -self.rank.get(str(pid), len(self.rank)))
                        for t, pid in zip(ok["tokens_per_s"], ok[ID_COLUMN])]
                i = max(range(len(keys)), key=keys.__getitem__)
                if self.best is None or keys[i] > self.best_key:
                    self.best_key = keys[i]
                    self.best = {str(k): v for k, v in ok.iloc[i].to_dict().items()}

    def finish(self, order: Sequence[str]) -> None:
        """Rewrite the rows in point order (rows of points no longer in the sweep last), atomically."""
        rank = {pid: i for i, pid in enumerate(order)}
        try:
            if self.parquet:
                self._finish_parquet(rank)
            elif self.path.exists():
                self._finish_csv(rank)
        except OSError as exc:
            raise SosimError(f"--out {self.path}: cannot rewrite it in point order: {exc.strerror or exc} (every "
                             "row is there, in completion order)") from None

    def _finish_csv(self, rank: Mapping[str, int]) -> None:
        # The csv module, not pandas: rows are copied as written (no float re-parsing) and quoted fields with
        # line breaks (multi-line error messages) stay one record.
        with self.path.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            records = list(reader)
        if header is None:
            return
        position = {pid: i for i, pid in enumerate(r[0] for r in records)}
        records.sort(key=lambda r: (rank.get(r[0], len(rank)), position[r[0]]))
        tmp = self.path.with_name(self.path.name + ".sorting")
        with tmp.open("w", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(header)
            writer.writerows(records)
        os.replace(tmp, self.path)

    def _finish_parquet(self, rank: Mapping[str, int]) -> None:
        parts = self._parts()
        if not parts:
            return
        frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
        order = frame[ID_COLUMN].astype(str).map(lambda pid: rank.get(pid, len(rank)))
        frame = frame.iloc[order.argsort(kind="stable")].reset_index(drop=True)
        tmp, ready = self.path / _SORTED_TMP, self.path / _SORTED_READY
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, ready)  # complete: from here on, _recover_sorted can finish the job
        self._recover_sorted()
        self.parts = 1


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    *,
    executor: Executor | None = None,
    chunk_size: int | None = None,
    resume: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run a sweep writing each finished chunk to ``out``; returns a summary (counts, best point)."""
    full = [spec.full_point(p) for p in spec.points]
    ids = [point_id(p) for p in full]
    by_id = dict(zip(ids, spec.points))
    probe = spec.metric_keys
    sample: dict[str, Any] = dict.fromkeys(probe, 0.0)
    sample.update({"feasible": True, "reason": ""})
    dtypes = _column_dtypes(spec.keys, spec.points, [k for k in probe if k not in (ID_COLUMN, ERROR_COLUMN)], sample)
    output = _Output(Path(out), dtypes, by_id, resume)
    items: list[tuple[str, list[str] | Scenario]] = [
        (pid, spec.overrides(p)) for pid, p in by_id.items() if pid not in output.done]
    try:
        run_items(spec.base, items, output, executor=executor, chunk_size=chunk_size, progress=progress)
    except ChunksFailed as exc:
        # A resume hint only when there is something to resume from.
        kept = output.rows_written or output.done
        raise SosimError(f"sweep: {exc}; " + (f"the finished chunks are in {out}: rerun with --resume to retry "
                                              "the rest" if kept else "nothing was written")) from None
    output.finish(list(by_id))
    return {
        "out": str(out), "points": len(by_id), "skipped": len(by_id) - len(items), "ran": output.rows_written,
        "errors": output.errors, "infeasible": output.infeasible,
        "best": {k: output.best[k] for k in [*spec.keys, "tokens_per_s", "step_time_s"] if k in output.best}
        if output.best else None,
    }


# ------------------------------------------------------------------------------------------------ CLI


def _check_scheduler(address: str) -> None:
    """A Dask address: SCHEME://... with a scheme Dask speaks, or HOST:PORT (Dask assumes tcp)."""
    scheme, sep, rest = address.partition("://")
    if sep:
        ok = scheme in ("tcp", "tls", "ws", "wss", "inproc", "ucx") and bool(rest.strip("/"))
    else:
        host, colon, port = address.rpartition(":")
        ok = bool(colon and host and port.isascii() and port.isdigit())
    if not ok:
        raise SosimError(f"--scheduler {address}: expected a Dask scheduler address like tcp://HOST:8786")


def _check_workers(workers: int | None) -> None:
    cores = os.cpu_count() or 1
    if workers is not None and workers < 1:
        raise SosimError(f"--workers {workers}: must be at least 1")
    if workers is not None and workers > MAX_WORKERS_PER_CORE * cores:
        raise SosimError(f"--workers {workers}: more than {MAX_WORKERS_PER_CORE} per core ({cores} cores here) "
                         "gains nothing: a simulation is CPU-bound")


def _make_executor(args: argparse.Namespace, n_points: int) -> tuple[Executor, Callable[[bool], None]]:
    """The executor and how to shut it down (``abort``: stop now, dropping queued work, killing local
    workers): a local process pool, or a Dask cluster's executor."""
    if args.scheduler:
        _check_scheduler(args.scheduler)
        try:
            from distributed import Client
        except ImportError:
            raise SosimError("--scheduler needs dask[distributed]: pip install 'sosim[dask]'") from None
        try:
            client = Client(args.scheduler, timeout="10s")
        except Exception as exc:  # OSError, TimeoutError, ValueError for a bad address, dask's own errors
            raise SosimError(f"--scheduler {args.scheduler}: cannot connect ({exc})") from None
        executor = client.get_executor()
        # Dask's executor does not report a size; size the in-flight window by the cluster's threads.
        executor._max_workers = max(1, sum(client.nthreads().values()))

        def close(abort: bool) -> None:
            with contextlib.suppress(Exception):
                executor.shutdown(wait=not abort)
            client.close()

        return executor, close
    from sosim.answers.workers import start_pool, stop_pool

    # No more processes than points: each would only start, import and wait.
    workers = max(1, min(args.workers or os.cpu_count() or 1, n_points))
    pool = start_pool(workers)  # workers ignore Ctrl-C and die with this process (sosim/answers/workers.py)

    def shutdown(abort: bool) -> None:
        # abort: stop the workers themselves (by PID): a plain shutdown would wait for their running chunks,
        # and an exiting parent would leave them running as orphans.
        stop_pool(pool, abort)

    return pool, shutdown


def _provenance_line(frame: pd.DataFrame) -> str:
    """``# system: ... | implementation: ... | profile: ... | calibration: ...`` over the rows (values that
    vary between rows are listed, and shown as columns too)."""
    parts = []
    for col in PROVENANCE_COLUMNS:
        values = sorted({str(v) for v in frame[col].dropna()}) if col in frame else []
        parts.append(f"{col}: {', '.join(values) if values else 'none'}")
    return "# " + " | ".join(parts)


def _print_summary(summary: dict[str, Any], fmt: str, frame: pd.DataFrame | None) -> None:
    if fmt == "json":
        obj = dict(summary)
        if frame is not None:
            # pandas' writer turns NaN/NA into null and numpy scalars into numbers.
            obj["rows"] = json.loads(frame.to_json(orient="records"))
        print_json(obj)
        return
    if frame is not None:
        print(frame.to_string(index=False, max_rows=60))
        return
    print(f"{summary['ran']} points run, {summary['skipped']} skipped (already in {summary['out']}), "
          f"{summary['errors']} errors, {summary['infeasible']} infeasible")
    if summary["best"]:
        print("fastest feasible point: " + ", ".join(f"{k}={v}" for k, v in summary["best"].items()))


def _written(out: str | None) -> bool:
    """Whether ``out`` holds any finished row (a resume hint only then)."""
    if not out:
        return False
    path = Path(out)
    if path.is_dir():
        return any(path.glob("part-*.parquet"))
    if path.is_symlink() or not path.is_file():  # a FIFO would block this read (sweep_resume.py refuses it)
        return False
    try:
        with path.open("rb") as fh:
            return fh.read(1 << 16).count(b"\n") > 1  # a header line and at least one row
    except OSError:
        return False


def cmd_sweep(args: argparse.Namespace) -> int:
    from sosim.answers.workers import interrupted_exit, signals_interrupt

    # Every input problem is reported here, before any pool starts.
    _check_workers(args.workers)
    if args.chunk_size is not None and args.chunk_size < 1:
        raise SosimError("--chunk-size must be at least 1")
    if args.out:
        check_out_path(args.out)
    spec = load_sweep(args.sweep)
    with signals_interrupt():  # SIGTERM stops the sweep (and its workers) as Ctrl-C does
        try:
            executor, close = _make_executor(args, len(spec.points))
        except KeyboardInterrupt as exc:
            code, what = interrupted_exit(exc)
            print(f"sosim sweep: {what}; nothing was written", file=sys.stderr)
            return code
        aborted = True
        try:
            _run_and_print(args, spec, executor)
            aborted = False
        except KeyboardInterrupt as exc:
            # Finished chunks are already in --out; say how to continue instead of printing a traceback.
            code, what = interrupted_exit(exc)
            hint = (f"; the finished chunks are in {args.out}: rerun the same command with --resume to continue"
                    if _written(args.out) else "; nothing was written"
                    + ("" if args.out else " (use --out to keep finished chunks)"))
            print(f"sosim sweep: {what}{hint}", file=sys.stderr)
            return code
        finally:
            # A second signal while the workers are being stopped must not leave them behind either.
            with contextlib.suppress(KeyboardInterrupt):
                close(aborted)
    return 0


def _run_and_print(args: argparse.Namespace, spec: SweepSpec, executor: Executor) -> None:
    if args.out:
        summary = run_sweep(spec, args.out, executor=executor, chunk_size=args.chunk_size,
                            resume=args.resume, progress=None)
        _print_summary(summary, args.format, None)
        return
    frame = sweep(spec, executor=executor, chunk_size=args.chunk_size, progress=sys.stderr.isatty())
    summary = {"out": None, "points": len(frame), "skipped": 0, "ran": len(frame),
               "errors": int(frame[ERROR_COLUMN].notna().sum()) if ERROR_COLUMN in frame else 0,
               "infeasible": int((frame["feasible"] == False).sum()) if "feasible" in frame else 0}  # noqa: E712
    shown = frame
    if args.format == "table":
        print(_provenance_line(frame))
        # Provenance columns only where they vary (a swept hardware or implementation).
        varying = [c for c in PROVENANCE_COLUMNS if c in frame and frame[c].nunique() > 1]
        cols = [*spec.keys, *varying, "tokens_per_s", "step_time_s", "mfu", "feasible", ERROR_COLUMN]
        shown = frame[[c for c in dict.fromkeys(cols) if c in frame]]
    _print_summary(summary, args.format, shown)


def register_cli(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("sweep", help="run a grid/list of overrides over a base scenario")
    p.add_argument("sweep", metavar="SWEEP.yaml",
                   help="sweep file (base, grid and/or points, set), or a shipped one: sweeps/NAME")
    p.add_argument("--out", metavar="RESULTS.csv|.parquet",
                   help="write rows incrementally (CSV file, or a folder of Parquet parts); else print them")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run on this Dask distributed scheduler")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: all cores)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--chunk-size", type=int, default=None, help=f"points per task (default: up to {MAX_CHUNK})")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_sweep)
