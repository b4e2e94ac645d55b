"""Measured timings (``sosim calibrate``'s measurements.csv), looked up and interpolated for the cost model.

No torch here: pandas reads the file once, numpy does the lookups. Every lookup returns seconds, or None
when the query lies outside what was measured (or the op was never measured), so that the caller falls
back to its analytic model instead of trusting an extrapolation. Interpolation happens in the quantity
that varies smoothly (achieved FLOP/s, bandwidth, per-element time) over the log of the size, because the
measured sizes are spaced geometrically.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

# One schema for writer and reader: the harness's records module is torch-free and imports nothing else.
from sosim.calibrate.records import COLUMNS

Array = np.ndarray

# Text columns of the schema: identification and context, never parsed as numbers.
TEXT_COLUMNS: frozenset[str] = frozenset(("op", "variant", "dtype", "device", "host_cpu", "torch_version", "date"))
# Columns the lookups read; a file without one of them cannot be used at all.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "op",
    "variant",
    "m",
    "n",
    "k",
    "batch",
    "seq",
    "heads",
    "head_dim",
    "hidden",
    "bytes",
    "elements",
    "threads",
    "median_s",
)
# Numeric columns checked when present (the harness's schema minus its text columns); empty cells mean
# "not applicable" except for median_s.
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS)
TIMING_COLUMNS: frozenset[str] = frozenset(("median_s", "p10_s", "p90_s"))

# Sizes closer than this relative gap count as the same measured point (CSV round-trips of 1e8 etc.).
_SAME_POINT_RTOL = 1e-9


class CalibrationError(ValueError):
    """A calibration file that is missing or malformed; the message names the file and the place."""


@dataclass(frozen=True)
class CalibrationTable:
    """Measured timings keyed by (op, variant); see docs/calibration.md for what each op means."""

    path: Path
    sha256: str
    # (op, variant) -> column name -> float array (NaN where the CSV cell was empty).
    columns_by_op: Mapping[tuple[str, str], Mapping[str, Array]] = field(repr=False, compare=False)

    @classmethod
    def from_csv(cls, path: str | Path) -> CalibrationTable:
        path = Path(path)
        try:
            raw_bytes = path.read_bytes()
        except FileNotFoundError:
            raise CalibrationError(f"{path}: calibration file not found") from None
        except OSError as error:
            raise CalibrationError(f"{path}: cannot read calibration file: {error.strerror}") from None
        frame = _read_frame(path)
        return cls(path=path, sha256=hashlib.sha256(raw_bytes).hexdigest(), columns_by_op=_group(frame))

    # ---- GPU compute -------------------------------------------------------------------------------

    def gemm_time_s(self, m: int, n: int, k: int) -> float | None:
        """bf16 GEMM (m x k) @ (k x n).

        Exact shape -> its median. Otherwise the achieved FLOP/s of the nearest measured shapes (same
        weight n x k first, else n and k each within 2x), interpolated over log FLOPs; flat above the
        largest measured FLOPs (big GEMMs saturate), None below the smallest (small ones lose efficiency
        in ways an interpolation would hide).
        """
        _check_non_negative(m=m, n=n, k=k)
        if 0 in (m, n, k):
            return 0.0
        cols = self.columns_by_op.get(("gemm", "fwd"))
        if cols is None:
            return None
        exact = _match(cols, m=m, n=n, k=k)
        if exact.any():
            return float(np.mean(cols["median_s"][exact]))
        if m < np.nanmin(cols["m"]) * (1 - _SAME_POINT_RTOL):
            # Thinner than any measured GEMM: efficiency falls off there in a shape-specific way.
            return None
        flops = 2.0 * m * n * k
        measured_flops = 2.0 * cols["m"] * cols["n"] * cols["k"]
        rate = measured_flops / cols["median_s"]
        same_weight = _match(cols, n=n, k=k)
        near_weight = (np.abs(np.log2(cols["n"] / n)) <= 1.0) & (np.abs(np.log2(cols["k"] / k)) <= 1.0)
        return _time_from_rate(flops, measured_flops, rate, (same_weight, near_weight))

    def attention_time_s(self, batch: int, seq: int, heads: int, head_dim: int, backward: bool) -> float | None:
        """Causal SDPA over (batch, heads, seq, head_dim), forward or forward+backward.

        Interpolates the rate of "attention work" batch*heads*seq^2*head_dim over its log, preferring
        rows with the same seq and heads, then the same seq, then any; head_dim must match exactly (it
        changes the kernel, not just the size).
        """
        _check_non_negative(batch=batch, seq=seq, heads=heads, head_dim=head_dim)
        if 0 in (batch, seq, heads):
            return 0.0
        cols = self.columns_by_op.get(("attention", "fwd_bwd" if backward else "fwd"))
        if cols is None:
            return None
        same_dim = _match(cols, head_dim=head_dim)
        exact = same_dim & _match(cols, batch=batch, seq=seq, heads=heads)
        if exact.any():
            return float(np.mean(cols["median_s"][exact]))
        work = float(batch) * heads * seq * seq * head_dim
        measured_work = cols["batch"] * cols["heads"] * cols["seq"] ** 2 * cols["head_dim"]
        rate = measured_work / cols["median_s"]
        same_seq = same_dim & _match(cols, seq=seq)
        candidates = (same_seq & _match(cols, heads=heads), same_seq, same_dim)
        return _time_from_rate(work, measured_work, rate, candidates)

    def layer_time_s(self, hidden: int, seq: int, batch: int, backward: bool) -> float | None:
        """One Llama decoder layer (no recompute), only at a measured (hidden, seq).

        Why so strict: a layer mixes GEMMs, attention and memory-bound kernels whose shares change with
        shape; only the micro-batch is interpolated (linearly, inside the measured range), because layer
        time is close to affine in it.
        """
        _check_non_negative(hidden=hidden, seq=seq, batch=batch)
        if batch == 0:
            return 0.0
        cols = self.columns_by_op.get(("layer", "fwd_bwd" if backward else "fwd"))
        if cols is None:
            return None
        rows = _match(cols, hidden=hidden, seq=seq)
        if not rows.any():
            return None
        batches, times_s = _average_duplicates(cols["batch"][rows], cols["median_s"][rows])
        if not batches[0] * (1 - _SAME_POINT_RTOL) <= batch <= batches[-1] * (1 + _SAME_POINT_RTOL):
            return None
        return float(np.interp(batch, batches, times_s))

    # ---- links and CPU -----------------------------------------------------------------------------

    def copy_time_s(
        self, bytes_: int, direction: Literal["h2d", "d2h"], pinned: bool, bidirectional: bool
    ) -> float | None:
        """Host<->device copy of ``bytes_`` (bidirectional: this direction's time while the other runs).

        Effective bandwidth interpolated over log size; flat beyond the largest size (the link is
        saturated there); None below the smallest (latency dominates) and for pageable bidirectional
        copies, which the harness does not measure.
        """
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be 'h2d' or 'd2h', not {direction!r}")
        _check_non_negative(bytes_=bytes_)
        if bytes_ == 0:
            return 0.0
        if bidirectional and not pinned:
            return None
        variant = f"bidir_pinned_{direction}" if bidirectional else f"{direction}_{'pinned' if pinned else 'pageable'}"
        cols = self.columns_by_op.get(("copy", variant))
        if cols is None:
            return None
        bandwidth_Bps = cols["bytes"] / cols["median_s"]
        return _time_from_rate(float(bytes_), cols["bytes"], bandwidth_Bps, (np.isfinite(cols["bytes"]),))

    def cpu_adam_time_s(self, elements: int, threads: int, impl: Literal["torch", "deepspeed"]) -> float | None:
        """One Adam step over ``elements`` fp32 parameters on the CPU with ``threads`` threads."""
        if impl not in ("torch", "deepspeed"):
            raise ValueError(f"impl must be 'torch' or 'deepspeed', not {impl!r}")
        _check_non_negative(elements=elements, threads=threads)
        if elements == 0:
            return 0.0
        cols = self.columns_by_op.get(("cpu_adam", impl))
        return None if cols is None else _per_element_time_s(cols, elements, threads)

    def cast_time_s(
        self, elements: int, where: Literal["cpu", "gpu"], to_dtype: Literal["bf16", "fp32"], threads: int | None
    ) -> float | None:
        """fp32<->bf16 cast of ``elements`` values into a preallocated buffer.

        ``threads`` is used on the CPU only; None there means the largest thread count measured.
        """
        if where not in ("cpu", "gpu"):
            raise ValueError(f"where must be 'cpu' or 'gpu', not {where!r}")
        if to_dtype not in ("bf16", "fp32"):
            raise ValueError(f"to_dtype must be 'bf16' or 'fp32', not {to_dtype!r}")
        _check_non_negative(elements=elements)
        if elements == 0:
            return 0.0
        variant = f"{where}_fp32_to_bf16" if to_dtype == "bf16" else f"{where}_bf16_to_fp32"
        cols = self.columns_by_op.get(("cast", variant))
        if cols is None:
            return None
        if where == "gpu":
            return _per_element_time_s(cols, elements, None)
        if threads is None:
            measured = cols["threads"][np.isfinite(cols["threads"])]
            if measured.size == 0:
                return None
            threads = int(measured.max())
        return _per_element_time_s(cols, elements, threads)


# ---- reading -------------------------------------------------------------------------------------------


def _read_frame(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise CalibrationError(f"{path}: calibration file is empty") from None
    except pd.errors.ParserError as error:
        raise CalibrationError(f"{path}: not a readable CSV: {error}") from None
    except UnicodeDecodeError:
        raise CalibrationError(f"{path}: not a text CSV file") from None
    # A header that repeats "n" (GEMM width and sample count) reads as "n" and "n.1": the second is the count.
    frame = frame.rename(columns={"n.1": "n_samples"})
    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise CalibrationError(f"{path}: missing column(s) {', '.join(missing)}")
    if frame.empty:
        raise CalibrationError(f"{path}: calibration file has a header but no rows")
    for name in NUMERIC_COLUMNS:
        if name in frame.columns:
            frame[name] = _parse_numeric(path, frame[name], name)
    return frame


def _parse_numeric(path: Path, cells: pd.Series, name: str) -> pd.Series:
    """Floats, NaN for empty cells; the first bad cell raises with its line (the header is line 1)."""
    values = np.full(len(cells), np.nan)
    for position, cell in enumerate(cells):
        text = str(cell).strip()
        line = position + 2
        if not text:
            if name == "median_s":
                raise CalibrationError(f"{path}: line {line}: column median_s is empty")
            continue
        try:
            value = float(text)
        except ValueError:
            raise CalibrationError(f"{path}: line {line}: column {name}: {text!r} is not a number") from None
        if not math.isfinite(value):
            raise CalibrationError(f"{path}: line {line}: column {name}: {text!r} is not finite")
        if value < 0 or (name == "median_s" and value == 0):
            rule = "must be positive" if name == "median_s" else "must not be negative"
            raise CalibrationError(f"{path}: line {line}: column {name}: {text} {rule}")
        values[position] = value
    return pd.Series(values, index=cells.index)


def _group(frame: pd.DataFrame) -> dict[tuple[str, str], dict[str, Array]]:
    numeric = [name for name in NUMERIC_COLUMNS if name in frame.columns]
    groups: dict[tuple[str, str], dict[str, Array]] = {}
    for (op, variant), part in frame.groupby(["op", "variant"], sort=True):
        groups[(str(op), str(variant))] = {name: part[name].to_numpy(dtype=float) for name in numeric}
    return groups


# ---- interpolation helpers -----------------------------------------------------------------------------


def _check_non_negative(**sizes: int) -> None:
    for name, value in sizes.items():
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")


def _match(cols: Mapping[str, Array], **wanted: float) -> Array:
    """Rows whose columns equal the wanted values (relative tolerance, so 1e8 == 100000000.0)."""
    mask = np.ones(len(cols["median_s"]), dtype=bool)
    for name, value in wanted.items():
        mask &= np.isclose(cols[name], value, rtol=_SAME_POINT_RTOL, atol=0.0)
    return mask


def _average_duplicates(xs: Array, ys: Array) -> tuple[Array, Array]:
    """Sorted unique xs with the mean y of each: repeated measurements of one point count once."""
    unique_xs, inverse = np.unique(xs, return_inverse=True)
    sums = np.zeros(len(unique_xs))
    np.add.at(sums, inverse, ys)
    counts = np.bincount(inverse, minlength=len(unique_xs))
    return unique_xs, sums / counts


def _interp_log(x: float, xs: Array, ys: Array, flat_above: bool) -> float | None:
    """Piecewise-linear ys over log xs; flat above the largest x if allowed, None below the smallest."""
    keep = np.isfinite(xs) & np.isfinite(ys) & (xs > 0)
    if not keep.any():
        return None
    unique_xs, mean_ys = _average_duplicates(xs[keep], ys[keep])
    if x < unique_xs[0] * (1 - _SAME_POINT_RTOL):
        return None
    if x > unique_xs[-1] * (1 + _SAME_POINT_RTOL):
        return float(mean_ys[-1]) if flat_above else None
    return float(np.interp(math.log(x), np.log(unique_xs), mean_ys))


def _time_from_rate(
    amount: float, measured_amount: Array, rate: Array, candidate_sets: tuple[Array, ...]
) -> float | None:
    """amount / rate, the rate interpolated over log amount within the first candidate set that covers it."""
    for rows in candidate_sets:
        if not rows.any():
            continue
        interpolated = _interp_log(amount, measured_amount[rows], rate[rows], flat_above=True)
        if interpolated is not None and interpolated > 0:
            return amount / interpolated
    return None


def _per_element_time_s(cols: Mapping[str, Array], elements: int, threads: int | None) -> float | None:
    """elements x per-element time, interpolated over log size (flat above the largest, None below the
    smallest) at each measured thread count, then linearly in threads on the throughput (elements/s),
    which is what adding a core adds to; None outside the measured thread counts."""

    def per_element_at(rows: Array) -> float | None:
        return _interp_log(
            float(elements), cols["elements"][rows], cols["median_s"][rows] / cols["elements"][rows], flat_above=True
        )

    if threads is None:
        return _scaled(elements, per_element_at(np.isfinite(cols["elements"])))
    measured_threads = np.unique(cols["threads"][np.isfinite(cols["threads"])])
    if measured_threads.size == 0:
        return None
    if np.isclose(measured_threads, threads, rtol=_SAME_POINT_RTOL).any():
        return _scaled(elements, per_element_at(_match(cols, threads=threads)))
    if not measured_threads[0] < threads < measured_threads[-1]:
        return None
    upper = int(np.searchsorted(measured_threads, threads))
    low_threads, high_threads = measured_threads[upper - 1], measured_threads[upper]
    low = per_element_at(_match(cols, threads=low_threads))
    high = per_element_at(_match(cols, threads=high_threads))
    if low is None or high is None:
        return None
    throughput = np.interp(threads, [low_threads, high_threads], [1.0 / low, 1.0 / high])
    return elements / float(throughput)


def _scaled(elements: int, per_element_s: float | None) -> float | None:
    return None if per_element_s is None else elements * per_element_s
