"""Rows of the calibration table, their summary statistics and the CSV writer (no torch here)."""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, field
from pathlib import Path

# The exact column order of measurements.csv; sosim.costs.calibration_table reads these names.
# Why "n_samples" and not "n" for the repeat count: "n" is already the GEMM's output width, and a CSV
# with two columns named "n" loses one of them in csv.DictReader and becomes "n.1" in pandas.
COLUMNS: tuple[str, ...] = (
    "op",
    "variant",
    "dtype",
    "m",
    "n",
    "k",
    "batch",
    "seq",
    "heads",
    "kv_heads",
    "head_dim",
    "hidden",
    "ffn",
    "bytes",
    "elements",
    "threads",
    "median_s",
    "p10_s",
    "p90_s",
    "n_samples",
    "device",
    "host_cpu",
    "torch_version",
    "date",
    # Added 2026-11-30 (DeepSpeed-pattern and multi-GPU sections); empty for the older sections. Readers that
    # know only the columns above still read these files, and older files (without them) still load.
    "gpus",
    "subgroups",
    "layers",
)

# Shape columns a measurement may fill; the rest of a row comes from the timings and the context.
SHAPE_COLUMNS: frozenset[str] = frozenset(
    (
        "m",
        "n",
        "k",
        "batch",
        "seq",
        "heads",
        "kv_heads",
        "head_dim",
        "hidden",
        "ffn",
        "bytes",
        "elements",
        "threads",
        "gpus",
        "subgroups",
        "layers",
    )
)


@dataclass(frozen=True)
class Context:
    """What every row repeats, so that a row read alone still says where and when it was measured."""

    device: str
    host_cpu: str
    torch_version: str
    date: str


@dataclass(frozen=True)
class Summary:
    """Median and spread of repeated timings, in seconds."""

    median_s: float
    p10_s: float
    p90_s: float
    n: int


def summarize(times_s: list[float]) -> Summary:
    """Median, 10th and 90th percentile of repeated timings.

    Why percentiles by linear interpolation between order statistics (statistics.quantiles 'inclusive'):
    with only 5-20 repeats the exclusive method would extrapolate past the observed extremes.
    """
    if not times_s:
        raise ValueError("no timings to summarize")
    ordered = sorted(times_s)
    if len(ordered) == 1:
        only = ordered[0]
        return Summary(only, only, only, 1)
    deciles = statistics.quantiles(ordered, n=10, method="inclusive")
    return Summary(statistics.median(ordered), deciles[0], deciles[-1], len(ordered))


@dataclass
class Table:
    """Rows collected during one harness run, written out as tidy CSV."""

    context: Context
    rows: list[dict[str, str]] = field(default_factory=list)

    def add(self, op: str, variant: str, dtype: str, times_s: list[float], **shape: int | float) -> Summary:
        """Record one measurement; ``shape`` holds only SHAPE_COLUMNS keys, the rest stay empty."""
        unknown = set(shape) - SHAPE_COLUMNS
        if unknown:
            raise ValueError(f"unknown shape columns {sorted(unknown)}")
        stats = summarize(times_s)
        row = {name: "" for name in COLUMNS}
        row.update(op=op, variant=variant, dtype=dtype)
        for key, value in shape.items():
            row[key] = _format_number(value)
        row.update(
            median_s=f"{stats.median_s:.9g}",
            p10_s=f"{stats.p10_s:.9g}",
            p90_s=f"{stats.p90_s:.9g}",
            n_samples=str(stats.n),
            device=self.context.device,
            host_cpu=self.context.host_cpu,
            torch_version=self.context.torch_version,
            date=self.context.date,
        )
        self.rows.append(row)
        return stats

    def write_csv(self, path: Path) -> None:
        """Write all rows so far; called after each section so a crash later still leaves data behind."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(path)


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows of an existing measurements.csv, to append to; refuses a file with other columns.

    A file written before the trailing columns were added (its header a prefix of COLUMNS) is accepted and
    its rows get those columns empty.
    """
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = tuple(reader.fieldnames or ())
        if not header or header != COLUMNS[: len(header)] or len(header) < COLUMNS.index("date") + 1:
            raise ValueError(f"{path}: columns differ from this harness's; not appending to it")
        return [{name: row.get(name) or "" for name in COLUMNS} for row in reader]


def _format_number(value: int | float) -> str:
    """Integers stay integers in the CSV (1e8 elements -> '100000000'), so readers can match exactly."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
