"""Measured timings (``sosim calibrate``'s measurements.csv), looked up and interpolated for the cost model.

No torch here: pandas reads the file once, numpy does the lookups. Every lookup returns seconds, or None
when the query lies outside what was measured (or the op was never measured), so that the caller falls
back to its analytic model instead of trusting an extrapolation. Interpolation happens in the quantity
that varies smoothly (achieved FLOP/s, bandwidth, per-element time) over the log of the size, because the
measured sizes are spaced geometrically.

Why this module is over 500 lines: CalibrationTable alone is about 510 lines: one lookup per measured op family
(GEMMs, attention, layers, copies, CPU Adam and casts, collectives, disk, DeepSpeed's stage-3 costs), all over the
one prepared frame and its session spread; the reading and interpolation helpers below serve only it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import pandas as pd

# One schema for writer and reader: the harness's records module is torch-free and imports nothing else.
from sosim.calibrate.records import COLUMNS
from sosim.inputs.errors import ConfigError
from sosim.inputs.safe_read import MAX_TABLE_BYTES, read_bytes

Array = np.ndarray
_T = TypeVar("_T")

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
# Columns later harness versions append at the end (DeepSpeed stage-3 sections: optimizer sub-groups of a
# step, GPUs of a collective, layers of a timed stack); accepted and parsed whenever present, whether or
# not COLUMNS lists them yet.
OPTIONAL_NUMERIC_COLUMNS: tuple[str, ...] = ("gpus", "subgroups", "layers")
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS) + tuple(
    c for c in OPTIONAL_NUMERIC_COLUMNS if c not in COLUMNS
)
TIMING_COLUMNS: frozenset[str] = frozenset(("median_s", "p10_s", "p90_s"))

# A measured time past a day is not a measurement of one piece of a step (the longest shipped median is ~2 s;
# issue 26: a row of median_s 1e300 gave a "feasible" 1e300 s step). Sizes and counts: as bounds.MAX_INT (2^53).
MAX_MEASURED_S = 86_400.0
MAX_TABLE_NUMBER = float(2**53)

# Sizes closer than this relative gap count as the same measured point (CSV round-trips of 1e8 etc.).
_SAME_POINT_RTOL = 1e-9


PUBLISHED_MARKER = "# published"


def declares_published(table_path: Path) -> bool:
    """Whether the table's folder declares its rows published (``SOURCES.md`` starting with ``# published``)."""
    sources = Path(table_path).parent / "SOURCES.md"
    if not sources.exists():
        return False
    try:  # the one bounded reader: a FIFO or a device named SOURCES.md is not read (sosim/inputs/safe_read.py)
        text = read_bytes(sources, "SOURCES.md", 1 << 20).decode("utf-8", "replace")
    except ConfigError:
        return False
    return text.partition("\n")[0].strip().lower().startswith(PUBLISHED_MARKER)


class CalibrationError(ValueError):
    """A calibration file that is missing or malformed; the message names the file and the place."""


class _Prepared:
    """One table's prepared curves and row selections, built on first use and kept (a table never changes).

    Why: sorting, de-duplicating and taking logs of a curve's measured points on every lookup was a quarter to
    two fifths of a ZeRO-Offload plan build (issue 17); prepared once, a lookup is one np.interp. Keys are
    (op, variant, what, query values that choose the rows): the same key always selects the same rows of
    this table, so a prepared value is exactly what the lookup would have computed. Each table object has
    its own (created in ``__post_init__``): a sampled or merged table, new columns, starts empty.
    """

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[Hashable, object] = {}

    def get(self, key: Hashable, build: Callable[[], _T]) -> _T:
        try:
            return self._values[key]  # type: ignore[return-value]
        except KeyError:
            value = self._values[key] = build()
            return value

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True)
class CalibrationTable:
    """Measured timings keyed by (op, variant); see docs/calibration.md for what each op means."""

    path: Path
    sha256: str
    # (op, variant) -> column name -> float array (NaN where the CSV cell was empty).
    columns_by_op: Mapping[tuple[str, str], Mapping[str, Array]] = field(repr=False, compare=False)
    # The files this table was merged from, in order: (path, sha256) each; empty for one file.
    parts: tuple[tuple[Path, str], ...] = ()
    # (op, variant) -> the file whose rows answer it (merged tables only).
    origin: Mapping[tuple[str, str], Path] = field(default_factory=dict, repr=False, compare=False)

    # Lease-to-lease spread (log-sd of one component's median between measuring sessions), by class:
    # "host" for work the host CPU and its memory do, "device" for the GPU and pinned DMA. Empty unless
    # the table was merged from sessions that measured the same points (see :meth:`merged`).
    session_log_sd: Mapping[str, float] = field(default_factory=dict, compare=False)
    # How many points measured by two or more sessions each class's spread rests on.
    session_points: Mapping[str, int] = field(default_factory=dict, compare=False)
    # The files whose folder declares their rows published values, not measured by sosim (read once, when the
    # file is loaded: sosim.costs.published says so in every result's provenance).
    published_paths: frozenset[Path] = field(default=frozenset(), compare=False)
    # Curves prepared on first use (see _Prepared); never shared between table objects.
    _prepared: _Prepared = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prepared", _Prepared())

    @classmethod
    def merged(cls, tables: Sequence[CalibrationTable]) -> CalibrationTable:
        """One table from several measuring sessions (leases of one machine kind, listed in order).

        The point estimate: a later table adds the (op, variant) measurements the earlier ones lack and
        replaces those it measured again; a measurement is one session's rows, never a mix of two sessions
        (its sizes and thread counts were measured together, minutes apart).
        The spread: where two or more sessions measured the same points, how much their medians differ is the
        lease-to-lease spread of that class of component (:attr:`session_log_sd`), which error bands draw.
        Why not pool the sessions into their mean instead: on the H200 the repeated host-side sections of a
        third lease came out 10-30% faster than the first two leases' (docs/calibration.md "Lease to lease"),
        while that lease's own DeepSpeed steps were not faster; a re-measurement on another lease moves a
        component by as much as the spread itself, so it widens the band and leaves the point estimate with
        the session that was checked phase by phase against its own training steps. List a repeat session
        first to use it for the spread only. sha256 is that of the parts' digests in order."""
        if not tables:
            raise ValueError("merged() needs at least one table")
        if len(tables) == 1:
            return tables[0]
        columns: dict[tuple[str, str], Mapping[str, Array]] = {}
        origin: dict[tuple[str, str], Path] = {}
        pieces: dict[tuple[str, str], list[tuple[int, Mapping[str, Array]]]] = {}
        for index, t in enumerate(tables):
            for key, cols in t.columns_by_op.items():
                columns[key] = cols
                origin[key] = t.path
                pieces.setdefault(key, []).append((index, cols))
        log_sd, points = _session_spread({key: _concat_columns(parts) for key, parts in pieces.items()})
        digest = hashlib.sha256("".join(t.sha256 for t in tables).encode()).hexdigest()
        return cls(path=tables[0].path, sha256=digest, columns_by_op=columns,
                   parts=tuple((t.path, t.sha256) for t in tables), origin=origin,
                   session_log_sd=log_sd, session_points=points,
                   published_paths=frozenset().union(*(t.published_paths for t in tables)))

    @classmethod
    def from_csv(cls, path: str | Path) -> CalibrationTable:
        path = Path(path)
        if not path.exists():
            raise CalibrationError(f"{path}: calibration file not found")
        try:  # the one bounded reader (regular files only: a FIFO or /dev/zero is refused, not read)
            raw_bytes = read_bytes(path, "calibration file", MAX_TABLE_BYTES)
        except ConfigError as error:
            raise CalibrationError("; ".join(error.problems)) from None
        frame = _read_frame(path, raw_bytes)
        return cls(path=path, sha256=hashlib.sha256(raw_bytes).hexdigest(), columns_by_op=_group(frame),
                   published_paths=frozenset({path}) if declares_published(path) else frozenset())

    def thread_range(self, op: str, variant: str) -> tuple[float, float] | None:
        """Smallest and largest thread count measured for (op, variant); None if none was."""
        cols = self.columns_by_op.get((op, variant))
        if cols is None or "threads" not in cols:
            return None
        threads = cols["threads"][np.isfinite(cols["threads"])]
        return (float(threads.min()), float(threads.max())) if threads.size else None

    # ---- spread: the same table at another point of each measurement's run-to-run distribution ------------

    def at_quantile(self, q: float) -> CalibrationTable:
        """The table with every timing replaced by its quantile ``q`` (see :func:`quantile_times`)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        return self._with_times({key: q for key in self.columns_by_op})

    def sampled(
        self, rng: np.random.Generator, lease_log_sd: Mapping[str, float] | None = None
    ) -> tuple[CalibrationTable, dict[str, float]]:
        """One seeded draw: a uniform quantile per op (component kind), shared by all its variants and rows,
        then (where a lease spread is known) one lease factor per op.

        Why one draw per kind and not per row: the rows of one kind were measured minutes apart on the same
        machine state (clocks, NUMA placement, background load), so they move together; independent draws
        per row would average the spread away over the many lookups of one replay. The ops are drawn in
        sorted order, so a seed gives the same table whatever the file's row order.
        """
        ops = sorted({op for op, _ in self.columns_by_op})
        draws = {op: float(rng.uniform()) for op in ops}
        table = self._with_times({key: draws[key[0]] for key in self.columns_by_op})
        # The table's own (measured) lease spread wins; else the profile's stated one (``lease_log_sd``).
        spread = self.session_log_sd or lease_log_sd or {}
        if not any(spread.values()):
            return table, draws
        # The lease: one more draw per kind, a factor on its medians with the measured lease-to-lease spread of
        # its class (p10 / p90 at exp(-+1.2816 sd), flat outside, like every other draw). Drawn after the
        # quantiles, so a table without repeated sessions gives exactly the draws it gave before.
        leases = {op: float(rng.uniform()) for op in ops}
        columns = {}
        for key, cols in table.columns_by_op.items():
            sd = spread.get(component_class(*key), 0.0)
            u = min(max(leases[key[0]], 0.1), 0.9)
            factor = float(np.exp(sd * 1.2815515655446004 * (u - 0.5) / 0.4))
            columns[key] = {**cols, "median_s": cols["median_s"] * factor}
        draws |= {f"{op} lease": u for op, u in leases.items()}
        return dataclasses.replace(table, columns_by_op=columns), draws

    def _with_times(self, q_by_key: Mapping[tuple[str, str], float]) -> CalibrationTable:
        columns = {
            key: {**cols, "median_s": quantile_times(cols, q_by_key[key])} for key, cols in self.columns_by_op.items()
        }
        return dataclasses.replace(self, columns_by_op=columns)

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

        def curves() -> _RateCurves:
            measured_flops = 2.0 * cols["m"] * cols["n"] * cols["k"]
            rate = measured_flops / cols["median_s"]
            same_weight = _match(cols, n=n, k=k)
            near_weight = (np.abs(np.log2(cols["n"] / n)) <= 1.0) & (np.abs(np.log2(cols["k"] / k)) <= 1.0)
            return _rate_curves(measured_flops, rate, (same_weight, near_weight))

        return _time_from_curves(flops, self._prepared.get(("gemm", "fwd", "rate", n, k), curves))

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

        def curves() -> _RateCurves:
            measured_work = cols["batch"] * cols["heads"] * cols["seq"] ** 2 * cols["head_dim"]
            rate = measured_work / cols["median_s"]
            same_seq = same_dim & _match(cols, seq=seq)
            return _rate_curves(measured_work, rate, (same_seq & _match(cols, heads=heads), same_seq, same_dim))

        key = ("attention", "fwd_bwd" if backward else "fwd", "rate", seq, heads, head_dim)
        return _time_from_curves(work, self._prepared.get(key, curves))

    def layer_time_s(
        self,
        hidden: int,
        seq: int,
        batch: int,
        backward: bool,
        *,
        heads: int | None = None,
        kv_heads: int | None = None,
        ffn: int | None = None,
        engine: str = "",
    ) -> float | None:
        """One Llama decoder layer (no recompute), only at a measured layer shape and seq.

        The shape is (hidden, seq) plus, when given, heads, kv_heads and ffn: a multi-head layer must not
        be given a grouped-query layer's time. ``engine`` picks the variant family: "" for the harness's
        bare layer (``fwd`` / ``fwd_bwd``), "hf" for the Hugging Face layer bare, "z3" for the same layer
        inside a DeepSpeed ZeRO-3 engine (``hf_fwd``, ``z3_fwd_bwd``, ...).

        Why so strict: a layer mixes GEMMs, attention and memory-bound kernels whose shares change with
        shape; only the micro-batch is interpolated (linearly, inside the measured range), because layer
        time is close to affine in it.
        """
        _check_non_negative(hidden=hidden, seq=seq, batch=batch)
        if batch == 0:
            return 0.0
        variant = ("fwd_bwd" if backward else "fwd") if not engine else f"{engine}_{'fwd_bwd' if backward else 'fwd'}"
        cols = self.columns_by_op.get(("layer", variant))
        if cols is None:
            return None
        shape = {name: value for name, value in (("heads", heads), ("kv_heads", kv_heads), ("ffn", ffn))
                 if value is not None}

        def points() -> tuple[Array, Array] | None:
            rows = _match(cols, hidden=hidden, seq=seq, **shape)
            return _average_duplicates(cols["batch"][rows], cols["median_s"][rows]) if rows.any() else None

        prepared = self._prepared.get(("layer", variant, "batch", hidden, seq, heads, kv_heads, ffn), points)
        if prepared is None:
            return None
        batches, times_s = prepared
        if not batches[0] * (1 - _SAME_POINT_RTOL) <= batch <= batches[-1] * (1 + _SAME_POINT_RTOL):
            return None
        return float(np.interp(batch, batches, times_s))

    # ---- links and CPU -----------------------------------------------------------------------------

    def copy_time_s(
        self, bytes_: float, direction: Literal["h2d", "d2h"], pinned: bool, bidirectional: bool
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
        curves = self._prepared.get(("copy", variant, "rate"), lambda: _rate_curves(
            cols["bytes"], cols["bytes"] / cols["median_s"], (np.isfinite(cols["bytes"]),)))
        return _time_from_curves(float(bytes_), curves)

    def cpu_adam_time_s(self, elements: float, threads: float, impl: Literal["torch", "deepspeed"]) -> float | None:
        """One Adam step over ``elements`` fp32 parameters on the CPU with ``threads`` threads."""
        if impl not in ("torch", "deepspeed"):
            raise ValueError(f"impl must be 'torch' or 'deepspeed', not {impl!r}")
        _check_non_negative(elements=elements, threads=threads)
        if elements == 0:
            return 0.0
        key = self._in_step_or(("cpu_adam", impl))
        cols = self.columns_by_op.get(key)
        return None if cols is None else self._per_element_time_s(key, cols, elements, threads)

    def cpu_adam_variant_time_s(self, elements: float, threads: float, variant: str) -> float | None:
        """One Adam step of a named implementation variant: ``cpu_adam`` rows of that variant (torch's AdamW
        for-loop / foreach / fused on plain tensors or DTensors, ``torch_<impl>[_dtensor]``, timed by
        scripts/torch_cpu_adam_bench.py). None when the variant or the thread count was not measured."""
        _check_non_negative(elements=elements, threads=threads)
        if elements == 0:
            return 0.0
        cols = self.columns_by_op.get(("cpu_adam", variant))
        return None if cols is None else self._per_element_time_s(("cpu_adam", variant), cols, elements, threads)

    def cast_time_s(
        self, elements: float, where: Literal["cpu", "gpu"], to_dtype: Literal["bf16", "fp32"], threads: float | None
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
            return self._per_element_time_s(("cast", variant), cols, elements, None)
        if threads is None:
            measured = cols["threads"][np.isfinite(cols["threads"])]
            if measured.size == 0:
                return None
            threads = int(measured.max())
        return self._per_element_time_s(("cast", variant), cols, elements, threads)


    # ---- DeepSpeed stage-3 paths (docs/calibration.md) -----------------------------------------------

    def ds_refresh_time_s(self, elements: float, threads: float, variant: str) -> float | None:
        """DeepSpeed's refresh copy_ of one sub-group (fp32 host -> bf16 device, allocating cast + copy).

        Per-element time over log size at each measured thread count, linear in throughput between thread
        counts (as CPU Adam); None outside the measured thread counts or below the smallest size.
        """
        _check_non_negative(elements=elements, threads=threads)
        if elements == 0:
            return 0.0
        key = self._in_step_or(("ds_refresh", variant))
        cols = self.columns_by_op.get(key)
        return None if cols is None else self._per_element_time_s(key, cols, elements, threads)

    def _in_step_or(self, key: tuple[str, str]) -> tuple[str, str]:
        """``(op, variant + '@instep')`` when the table holds it, else ``key``. The in-step variant is the isolated
        curve rescaled to what the same call cost inside this machine's real steps (sosim/calibrate/
        instep_profile.py, written by `sosim calibrate --profile` beside the isolated rows)."""
        in_step = (key[0], f"{key[1]}@instep")
        return in_step if in_step in self.columns_by_op else key

    def stage3_hook_time_s(
        self, hidden: int, heads: int, kv_heads: int, ffn: int, tokens: int, backward: bool
    ) -> tuple[float, str] | None:
        """Host-side time of one decoder layer's pass under DeepSpeed's ZeRO-3 hooks, launches included.

        The harness times a stack of Hugging Face layers inside a ZeRO-3 engine (``z3_fwd``, ``z3_fwd_bwd``,
        per layer). Under the hooks a layer's pass takes ~10 ms whatever its GPU work (docs/calibration.md
        2026-11-30): the host thread (the hooks' parameter fetch/release per sub-module, then the kernel
        launches) is what the GPU waits for. The time is that host work: the z3 pass time itself (where the
        GPU work was longer, it is the GPU-bound time, and max(host, GPU) reproduces it). ``backward``: the
        backward pass alone, z3 fwd_bwd - z3 fwd at the same point. Returns the time and which measured shape
        answered: the exact layer shape when measured, else the nearest hidden size (the hooks run per
        sub-module, and a Llama layer has the same sub-modules at every size). Linear in tokens inside the
        measured range, flat outside it. None when the z3 rows are missing.
        """
        _check_non_negative(tokens=tokens)
        fwd = self._prepared.get(("layer", "z3_fwd", "hook_points"), lambda: self._hook_points(False))
        if fwd is None:
            return None
        both = None
        if backward:
            both = self._prepared.get(("layer", "z3_fwd_bwd", "hook_points"), lambda: self._hook_points(True))
        if backward and both is None:
            return None
        # Shapes measured for every pass needed.
        shapes = set(fwd) if both is None else set(fwd) & set(both)
        if not shapes:
            return None
        wanted = (float(hidden), float(heads), float(kv_heads), float(ffn))
        shape = wanted if wanted in shapes else min(shapes, key=lambda sh: (abs(math.log(sh[0] / hidden)), sh))
        label = "exact shape" if shape == wanted else f"nearest measured shape hidden={int(shape[0])}"
        t_fwd = _clamped_interp(float(tokens), *fwd[shape])
        if both is None:
            return max(0.0, t_fwd), label
        return max(0.0, _clamped_interp(float(tokens), *both[shape]) - t_fwd), label

    def _hook_points(self, backward: bool) -> dict[tuple[float, ...], tuple[Array, Array]] | None:
        """Layer shape -> (tokens, z3 per-layer seconds) at the measured points."""
        z3 = self.columns_by_op.get(("layer", f"z3_{'fwd_bwd' if backward else 'fwd'}"))
        if z3 is None:
            return None
        keys = ("hidden", "heads", "kv_heads", "ffn", "seq", "batch")
        per_shape: dict[tuple[float, ...], list[tuple[float, float]]] = {}
        for i in range(len(z3["median_s"])):
            point = tuple(float(z3[k][i]) for k in keys)
            if all(math.isfinite(v) for v in point):
                per_shape.setdefault(point[:4], []).append((point[4] * point[5], float(z3["median_s"][i])))
        if not per_shape:
            return None
        out: dict[tuple[float, ...], tuple[Array, Array]] = {}
        for shape, pts in per_shape.items():
            xs, ys = _average_duplicates(np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
            out[shape] = (xs, ys)
        return out

    def ds_step_piece(self, variant: str, piece: str) -> tuple[float, float, float] | None:
        """One timed piece of DeepSpeed's ``step()`` (op ``ds_step_fixed``, variant ``<variant>_<piece>``: the
        piece summed over the step's sub-groups): (seconds, model elements, sub-groups) of its first row."""
        cols = self.columns_by_op.get(("ds_step_fixed", f"{variant}_{piece}"))
        if cols is None or "subgroups" not in cols or not len(cols["median_s"]):
            return None
        return float(cols["median_s"][0]), float(cols["elements"][0]), float(cols["subgroups"][0])

    def ds_step_fixed_time_s(self, elements: float, subgroups: int, variant: str) -> float | None:
        """engine.step() with a no-op optimizer: its fixed part, for ``elements`` parameters in ``subgroups``.

        An exact measured point -> its median; otherwise the least-squares affine fit
        t = a + b * subgroups + c * elements over the variant's rows (each regressor only if it varies in
        the data): partitioning and the norm stream over the elements, the bookkeeping repeats per
        sub-group, the host sync is fixed. None without enough rows for the fit.
        """
        _check_non_negative(elements=elements, subgroups=subgroups)
        cols = self.columns_by_op.get(("ds_step_fixed", variant))
        if cols is None or "subgroups" not in cols:
            return None
        exact = _match(cols, elements=elements, subgroups=subgroups)
        if exact.any():
            return float(np.mean(cols["median_s"][exact]))
        return _affine_fit(cols, {"subgroups": float(subgroups), "elements": float(elements)})

    def so_worker_time_s(self, elements: float, variant: str) -> float | None:
        """SuperOffload's round trip of one sub-group to its Adam worker and back (excluding the Adam).

        Affine in elements (a fixed hand-off plus per-element copies through shared buffers): piecewise
        linear between measured sizes, extended by the end segments' slopes, never below zero.
        """
        return self._affine_in_elements("so_worker", variant, elements)

    def so_flush_time_s(self, elements: float, variant: str = "shared") -> float | None:
        """SuperOffload's gradient flush of ``elements`` parameters as ``partition_grads`` runs it (op
        ``so_flush``: per parameter the bf16 round trip through the host buffer, the norm, the GPU cast and the
        pageable fp32 copy into the worker's shared memory; one sync). Affine in elements like the worker's
        round trip (a per-parameter overhead and per-element copies), extended by the end segments' slopes."""
        return self._affine_in_elements("so_flush", variant, elements)

    def _affine_in_elements(self, op: str, variant: str, elements: float) -> float | None:
        """Piecewise linear in elements between the measured sizes, extended by the end segments' slopes,
        never below zero; None without rows."""
        _check_non_negative(elements=elements)
        cols = self.columns_by_op.get((op, variant))
        if cols is None:
            return None

        def points() -> tuple[Array, Array] | None:
            keep = np.isfinite(cols["elements"])
            return _average_duplicates(cols["elements"][keep], cols["median_s"][keep]) if keep.any() else None

        prepared = self._prepared.get((op, variant, "elements"), points)
        return None if prepared is None else max(0.0, _linear_extrapolated(float(elements), *prepared))

    def collective_time_s(self, kind: str, n_bytes: float, gpus: int) -> float | None:
        """NCCL collective ``kind`` over a buffer of ``n_bytes`` on ``gpus`` GPUs (op ``nccl``).

        Achieved bandwidth (bytes / time) interpolated over log size at that GPU count; flat above the
        largest size, None below the smallest or at an unmeasured GPU count.
        """
        _check_non_negative(n_bytes=n_bytes, gpus=gpus)
        if n_bytes == 0 or gpus <= 1:
            return 0.0
        cols = self.columns_by_op.get(("nccl", kind))
        if cols is None or "gpus" not in cols:
            return None

        def curves() -> _RateCurves | None:
            rows = _match(cols, gpus=gpus) & np.isfinite(cols["bytes"])
            return _rate_curves(cols["bytes"], cols["bytes"] / cols["median_s"], (rows,)) if rows.any() else None

        prepared = self._prepared.get(("nccl", kind, "rate", gpus), curves)
        return None if prepared is None else _time_from_curves(float(n_bytes), prepared)

    def disk_time_s(
        self, n_bytes: float, write: bool, block_bytes: float = 2**20, queue_depth: int | None = None
    ) -> float | None:
        """Direct I/O of ``n_bytes`` in ``block_bytes`` requests (op ``disk``: bytes = block size, threads =
        queue depth; each row's time is one block's share of a whole pass, i.e. amortised over the depth).

        Throughput = block / time, interpolated over log block size at the queue depth asked (None: the
        deepest measured); flat above the largest block, None below the smallest.
        """
        _check_non_negative(n_bytes=n_bytes, block_bytes=block_bytes)
        if n_bytes == 0:
            return 0.0
        cols = self.columns_by_op.get(("disk", "write_direct" if write else "read_direct"))
        if cols is None:
            return None
        depths = cols["threads"][np.isfinite(cols["threads"])]
        if depths.size == 0:
            return None
        depth = float(depths.max()) if queue_depth is None else float(queue_depth)

        def curves() -> _RateCurves | None:
            rows = _match(cols, threads=depth) & np.isfinite(cols["bytes"])
            return _rate_curves(cols["bytes"], cols["bytes"] / cols["median_s"], (rows,)) if rows.any() else None

        prepared = self._prepared.get(("disk", "write_direct" if write else "read_direct", "rate", depth), curves)
        if prepared is None:
            return None
        per_block = _time_from_curves(float(block_bytes), prepared)
        return None if per_block is None else n_bytes / block_bytes * per_block

    def _per_element_time_s(
        self, key: tuple[str, str], cols: Mapping[str, Array], elements: float, threads: float | None
    ) -> float | None:
        """:func:`_per_element_time_s` on this table's prepared curves (same float)."""

        def curve_at(selection: float | None) -> _LogCurve | None:
            def build() -> _LogCurve | None:
                rows = np.isfinite(cols["elements"]) if selection is None else _match(cols, threads=selection)
                return _log_curve(cols["elements"][rows], cols["median_s"][rows] / cols["elements"][rows])

            return self._prepared.get((*key, "per_element", selection), build)

        def measured_threads() -> Array:
            return np.unique(cols["threads"][np.isfinite(cols["threads"])])

        return _per_element_from(
            curve_at, self._prepared.get((*key, "threads"), measured_threads), elements, threads
        )


# ---- reading -------------------------------------------------------------------------------------------


def _read_frame(path: Path, raw_bytes: bytes) -> pd.DataFrame:
    try:
        frame = pd.read_csv(io.BytesIO(raw_bytes), dtype=str, keep_default_na=False)
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
        if name in TIMING_COLUMNS and value > MAX_MEASURED_S:
            raise CalibrationError(f"{path}: line {line}: column {name}: {text} s is more than {MAX_MEASURED_S:g} s: "
                                   "no measured piece of a training step takes a day (docs/limits.md)")
        if value > MAX_TABLE_NUMBER:
            raise CalibrationError(f"{path}: line {line}: column {name}: {text} is beyond {MAX_TABLE_NUMBER:g} (2^53): "
                                   "no size or count sosim takes comes near it")
        values[position] = value
    return pd.Series(values, index=cells.index)


def _group(frame: pd.DataFrame) -> dict[tuple[str, str], dict[str, Array]]:
    numeric = [name for name in NUMERIC_COLUMNS if name in frame.columns]
    groups: dict[tuple[str, str], dict[str, Array]] = {}
    for (op, variant), part in frame.groupby(["op", "variant"], sort=True):
        groups[(str(op), str(variant))] = {name: part[name].to_numpy(dtype=float) for name in numeric}
    return groups


def quantile_times(cols: Mapping[str, Array], q: float) -> Array:
    """Each row's time at quantile ``q`` of its measured repeats, from its p10 / median / p90.

    Piecewise linear through (0.1, p10), (0.5, median), (0.9, p90); flat outside [0.1, 0.9] (the table
    does not know the tails, and inventing them would widen bands with no measurement behind it). A row
    without p10 / p90 keeps its median.
    """
    median = cols["median_s"]
    p10 = cols.get("p10_s", np.full_like(median, np.nan))
    p90 = cols.get("p90_s", np.full_like(median, np.nan))
    low = np.where(np.isfinite(p10) & (p10 > 0), np.minimum(p10, median), median)
    high = np.where(np.isfinite(p90) & (p90 > 0), np.maximum(p90, median), median)
    q = min(max(q, 0.1), 0.9)
    if q <= 0.5:
        return low + (median - low) * (q - 0.1) / 0.4
    return median + (high - median) * (q - 0.5) / 0.4


# ---- sessions: pooling and the lease-to-lease spread -------------------------------------------------------

# Work done by the host CPU and its memory: the components whose medians move between leases of one machine
# kind (measured: docs/calibration.md "Lease to lease"). Everything else (GPU kernels, pinned DMA, NCCL) is
# "device".
_HOST_OPS = frozenset(("cpu_adam", "ds_refresh", "so_worker", "so_flush", "so_fp32_d2h", "ds_step_fixed", "disk"))
# Session spreads are read only from points that take at least this long: below ~1 ms a CPU timing is
# dominated by thread wake-up and launch jitter, which the within-session p10/p90 already carry.
_SESSION_MIN_S = 1e-3


def component_class(op: str, variant: str) -> str:
    """'host' or 'device': which lease-to-lease spread a component takes."""
    if op in _HOST_OPS:
        return "host"
    if op == "cast" and variant.startswith("cpu_"):
        return "host"
    if op == "copy" and "pageable" in variant:
        return "host"
    if op == "layer" and variant.startswith("z3"):
        return "host"  # ZeRO-3's hooks: host-side Python the GPU waits for
    return "device"


def _concat_columns(parts: Sequence[tuple[int, Mapping[str, Array]]]) -> Mapping[str, Array]:
    """The rows of one (op, variant) from several sessions as one set of columns, with a ``session`` column."""
    if len(parts) == 1 and "session" not in parts[0][1]:
        index, cols = parts[0]
        return {**cols, "session": np.full(len(cols["median_s"]), float(index))}
    names = sorted({name for _, cols in parts for name in cols} - {"session"})
    out: dict[str, Array] = {}
    for name in names:
        out[name] = np.concatenate([
            np.asarray(cols[name], dtype=float) if name in cols else np.full(len(cols["median_s"]), np.nan)
            for _, cols in parts
        ])
    out["session"] = np.concatenate([np.full(len(cols["median_s"]), float(i)) for i, cols in parts])
    return out


def _session_spread(columns: Mapping[tuple[str, str], Mapping[str, Array]]) -> tuple[dict[str, float], dict[str, int]]:
    """Per class, the pooled log-sd of a point's median between the sessions that measured it.

    A point is one (op, variant) at one shape (every shape column equal). With k sessions at a point, the
    deviations of their log medians from the point's mean log median carry k - 1 degrees of freedom; the
    estimate is sum(dev^2) / sum(k - 1) over every such point of the class (the usual pooled variance).
    """
    sums: dict[str, float] = {}
    dof: dict[str, int] = {}
    points: dict[str, int] = {}
    for (op, variant), cols in columns.items():
        session = cols.get("session")
        if session is None or len(np.unique(session)) < 2:
            continue
        shape_names = [n for n in cols if n not in TIMING_COLUMNS and n not in ("session", "n_samples")]
        median = cols["median_s"]
        keys = [tuple(np.round(cols[n][i], 6) if np.isfinite(cols[n][i]) else -1.0 for n in shape_names)
                for i in range(len(median))]
        by_point: dict[tuple[float, ...], dict[float, list[float]]] = {}
        for i, key in enumerate(keys):
            if np.isfinite(median[i]) and median[i] >= _SESSION_MIN_S:
                by_point.setdefault(key, {}).setdefault(float(session[i]), []).append(float(np.log(median[i])))
        cls = component_class(op, variant)
        for sessions in by_point.values():
            if len(sessions) < 2:
                continue
            logs = np.array([np.mean(v) for v in sessions.values()])
            sums[cls] = sums.get(cls, 0.0) + float(np.sum((logs - logs.mean()) ** 2))
            dof[cls] = dof.get(cls, 0) + len(logs) - 1
            points[cls] = points.get(cls, 0) + 1
    return {c: float(np.sqrt(sums[c] / dof[c])) for c in sums if dof[c] > 0}, points


# ---- interpolation helpers -----------------------------------------------------------------------------


def _check_non_negative(**sizes: float) -> None:
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


@dataclass(frozen=True)
class _LogCurve:
    """A curve ready for :func:`_interp_curve`: sorted unique positive finite xs, their logs, the mean ys."""

    xs: Array
    log_xs: Array
    ys: Array


def _log_curve(xs: Array, ys: Array) -> _LogCurve | None:
    """The finite points with positive x, duplicates averaged; None if there are none."""
    keep = np.isfinite(xs) & np.isfinite(ys) & (xs > 0)
    if not keep.any():
        return None
    unique_xs, mean_ys = _average_duplicates(xs[keep], ys[keep])
    return _LogCurve(unique_xs, np.log(unique_xs), mean_ys)


def _interp_curve(x: float, curve: _LogCurve | None, flat_above: bool) -> float | None:
    """Piecewise-linear ys over log xs; flat above the largest x if allowed, None below the smallest."""
    if curve is None:
        return None
    if x < curve.xs[0] * (1 - _SAME_POINT_RTOL):
        return None
    if x > curve.xs[-1] * (1 + _SAME_POINT_RTOL):
        return float(curve.ys[-1]) if flat_above else None
    return float(np.interp(math.log(x), curve.log_xs, curve.ys))


def _interp_log(x: float, xs: Array, ys: Array, flat_above: bool) -> float | None:
    """:func:`_interp_curve` on raw points (prepared on the spot: the uncached reference)."""
    return _interp_curve(x, _log_curve(xs, ys), flat_above)


_UNBUILT = object()


class _RateCurves:
    """The rate curves of a lookup's candidate row sets, in preference order, each prepared when first needed
    (a lookup the first set answers never pays for the others, as before the curves were kept)."""

    __slots__ = ("_amount", "_curves", "_rate", "_rows")

    def __init__(self, measured_amount: Array, rate: Array, candidate_sets: tuple[Array, ...]) -> None:
        self._amount, self._rate, self._rows = measured_amount, rate, candidate_sets
        # Filled by index, never appended: two threads preparing one curve store the same value.
        self._curves: list[object] = [_UNBUILT] * len(candidate_sets)

    def __len__(self) -> int:
        return len(self._rows)

    def curve(self, index: int) -> _LogCurve | None:
        built = self._curves[index]
        if built is _UNBUILT:
            rows = self._rows[index]
            built = self._curves[index] = _log_curve(self._amount[rows], self._rate[rows]) if rows.any() else None
        return built  # type: ignore[return-value]


def _rate_curves(measured_amount: Array, rate: Array, candidate_sets: tuple[Array, ...]) -> _RateCurves:
    """The rate curve of each candidate row set, in order (None for a set without usable rows)."""
    return _RateCurves(measured_amount, rate, candidate_sets)


def _time_from_curves(amount: float, curves: _RateCurves) -> float | None:
    """amount / rate, the rate interpolated over log amount on the first curve that covers it."""
    for index in range(len(curves)):
        interpolated = _interp_curve(amount, curves.curve(index), flat_above=True)
        if interpolated is not None and interpolated > 0:
            return amount / interpolated
    return None


def _per_element_time_s(cols: Mapping[str, Array], elements: float, threads: float | None) -> float | None:
    """elements x per-element time, interpolated over log size (flat above the largest, None below the
    smallest) at each measured thread count, then linearly in threads on the throughput (elements/s),
    which is what adding a core adds to; None outside the measured thread counts."""

    def curve_at(selection: float | None) -> _LogCurve | None:
        rows = np.isfinite(cols["elements"]) if selection is None else _match(cols, threads=selection)
        return _log_curve(cols["elements"][rows], cols["median_s"][rows] / cols["elements"][rows])

    return _per_element_from(curve_at, np.unique(cols["threads"][np.isfinite(cols["threads"])]), elements, threads)


def _per_element_from(
    curve_at: Callable[[float | None], _LogCurve | None], measured_threads: Array, elements: float,
    threads: float | None,
) -> float | None:
    """:func:`_per_element_time_s` given the per-element curve at a thread count (None: every row) and the
    sorted measured thread counts."""

    def per_element_at(selection: float | None) -> float | None:
        return _interp_curve(float(elements), curve_at(selection), flat_above=True)

    if threads is None:
        return _scaled(elements, per_element_at(None))
    if measured_threads.size == 0:
        return None
    if np.isclose(measured_threads, threads, rtol=_SAME_POINT_RTOL).any():
        return _scaled(elements, per_element_at(threads))
    if not measured_threads[0] < threads < measured_threads[-1]:
        return None
    upper = int(np.searchsorted(measured_threads, threads))
    low_threads, high_threads = measured_threads[upper - 1], measured_threads[upper]
    low = per_element_at(float(low_threads))
    high = per_element_at(float(high_threads))
    if low is None or high is None:
        return None
    throughput = np.interp(threads, [low_threads, high_threads], [1.0 / low, 1.0 / high])
    return elements / float(throughput)


def _clamped_interp(x: float, xs: Array, ys: Array) -> float:
    """Linear interpolation, flat beyond the ends (np.interp's own rule), for sorted unique xs."""
    return float(np.interp(x, xs, ys))


def _linear_extrapolated(x: float, xs: Array, ys: Array) -> float:
    """Piecewise linear through sorted unique points, extended beyond the ends by the end segments."""
    if xs.size == 1:
        return float(ys[0])
    if x < xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(ys[0] + slope * (x - xs[0]))
    if x > xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _affine_fit(cols: Mapping[str, Array], query: Mapping[str, float]) -> float | None:
    """Least-squares t = a + sum(b_i * x_i) over the rows, x_i only where it varies; max(0, prediction)."""
    keep = np.isfinite(cols["median_s"])
    for name in query:
        keep &= np.isfinite(cols[name])
    if not keep.any():
        return None
    names = [n for n in query if np.unique(cols[n][keep]).size > 1]
    design = np.column_stack([np.ones(int(keep.sum()))] + [cols[n][keep] for n in names])
    if design.shape[0] < design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
        return None
    coef, *_ = np.linalg.lstsq(design, cols["median_s"][keep], rcond=None)
    x = np.array([1.0] + [query[n] for n in names])
    return max(0.0, float(x @ coef))


def _scaled(elements: float, per_element_s: float | None) -> float | None:
    return None if per_element_s is None else elements * per_element_s
