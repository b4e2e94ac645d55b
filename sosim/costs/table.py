"""Cost model backed by a measured calibration table: the analytic composition, measured components.

A profile names its table with ``calibration: <csv>``. :class:`TableCostModel` *is* an
:class:`~sosim.costs.analytic.AnalyticCostModel` (same layer composition, launch-bound floor included) that overrides
only the components the table measured: a whole layer at its exact shape, else its GEMMs and attention, the
GPU cast, host copies, CPU Adam and casts, collectives, disk, DeepSpeed's stage-3
costs. Anything the table does not cover falls back to the analytic formula.

**What-if on a calibrated machine.** The table was measured on the hardware numbers of the profile file
that names it (the *baseline*). When the scenario's hardware differs from it (``--set
hardware.link.h2d_GBps=1``, or another profile pointed at this table), every measured cost is rescaled by
the analytic model's own ratio for that cost, ``analytic(scenario hw) / analytic(baseline hw)``: a copy by
the bandwidth ratio (latency unchanged), a GEMM by the peak (and efficiency-curve) ratio, a whole layer by
its composition's ratio (the memory-bound part moves with HBM bandwidth, the launch-bound floor with
nothing), CPU Adam and casts by the core count the analytic model uses. With the baseline hardware every
ratio is exactly 1. The result's provenance lists, per cost kind, how many lookups were measured, rescaled
(by which factors, because of which changed numbers) or analytic.

**Spread.** :meth:`TableCostModel.at_quantile` and :meth:`TableCostModel.sample` give the same model on a
table whose timings are a measured quantile, or a seeded draw per component kind (see
:mod:`sosim.costs.calibration_table`).

Why this module is over 500 lines: TableCostModel (about 360 lines) overrides each AnalyticCostModel component with
its measured counterpart and the what-if rescaling of it; one class, one override per cost, kept beside the ledger
that records which was used.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sosim.costs import grace_host, published, training_stack
from sosim.costs.analytic import (
    ADAM_BYTES_PER_PARAM,
    AnalyticCostModel,
    CollectiveKind,
    Direction,
    model_parameter_tensors,
    stage3_variant,
)
from sosim.costs.calibration_table import CalibrationError, CalibrationTable
from sosim.hardware import model as tm
from sosim.hardware.machine import AIO_BLOCK_BYTES, AIO_QUEUE_DEPTH, AIO_THREADS
from sosim.inputs.config import AdamImpl, HardwareProfile
from sosim.inputs.errors import ConfigError
from sosim.inputs.safe_read import shown_path
from sosim.inputs.units import GB

# Parameter tensors of the model whose step() the ds_step_fixed section timed: the runs' Llama "0.5b" (8
# decoder layers of hidden 2048, 9 tensors each, + embedding, final norm, output head: 491,816,960
# parameters; docs/calibration.md 2026-11-30, scripts/ds_train_step.py --size 0.5b).
STEP_FIXED_MEASURED_TENSORS = 8 * 9 + 3
# sosim's CPU-Adam names -> the implementations the harness times.
_ADAM_IMPL: dict[str, str] = {"torch": "torch", "cpu_adam": "deepspeed"}
# Hardware sections whose numbers govern costs; names, descriptions and sources never rescale anything.
_HW_SECTIONS: tuple[str, ...] = ("gpu", "cpu", "link", "interconnect")
# Which sections each cost kind depends on in the analytic model (to say *why* a cost was rescaled).
_KIND_SECTIONS: dict[str, tuple[str, ...]] = {
    "gemm": ("gpu",), "attention": ("gpu",), "layer": ("gpu",), "gpu_cast": ("gpu",),
    "copy": ("link",), "cpu_adam": ("cpu",), "cpu_cast": ("cpu",),
    "nccl": ("interconnect",), "disk": (), "ds_refresh": ("cpu", "link"), "stage3_hook": (),
    "ds_step_fixed": ("cpu",), "ds_step_unscale_clip": ("cpu",), "so_worker": ("cpu",),
    "so_flush": ("gpu", "link"),
}


@functools.lru_cache(maxsize=16)
def _read_table(path: str, mtime_ns: int, size: int) -> CalibrationTable:
    """Parse a table once per file version (a pure memo: the key includes the file's mtime and size)."""
    del mtime_ns, size  # part of the cache key only
    return CalibrationTable.from_csv(path)


def load_tables(paths: list[str]) -> CalibrationTable:
    """The profile's tables as one (see :meth:`CalibrationTable.merged`: sessions pooled, their spread kept)."""
    return _merged(tuple(load_table(p) for p in paths))


@functools.lru_cache(maxsize=16)
def _merged(tables: tuple[CalibrationTable, ...]) -> CalibrationTable:
    """Merge once per set of parsed tables (the parsed tables are themselves memoised per file version, so
    the same objects come back and hash by identity)."""
    return CalibrationTable.merged(list(tables))


def load_table(path: str) -> CalibrationTable:
    try:
        st = os.stat(path)
    except ValueError:  # a NUL byte in the name: no file can have it
        raise ConfigError([f"{shown_path(path)}: calibration table cannot be read: the path contains a NUL "
                           "character"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: calibration table cannot be read: {exc.strerror or exc}"]) from None
    try:
        return _read_table(path, st.st_mtime_ns, st.st_size)
    except CalibrationError as exc:
        raise ConfigError([f"calibration table: {exc}"]) from None


# ---- the baseline: the hardware numbers the table was measured on ----------------------------------------


def hardware_changes(base: HardwareProfile, now: HardwareProfile) -> dict[str, tuple[Any, Any]]:
    """Dotted field path -> (baseline value, scenario value) for every cost-governing number that differs."""
    out: dict[str, tuple[Any, Any]] = {}
    for section in _HW_SECTIONS:
        a, b = getattr(base, section), getattr(now, section)
        if a is None or b is None:
            if a is not b:
                out[section] = (a is not None, b is not None)
            continue
        for name in type(a).model_fields:
            if name in ("sources", "name"):
                continue
            va, vb = getattr(a, name), getattr(b, name)
            if va != vb:
                out[f"{section}.{name}"] = (va, vb)
    return out


# ---- provenance ledger -------------------------------------------------------------------------------------


@dataclass
class _Ledger:
    """Per cost kind: lookups answered by measurements (as measured or rescaled) and by the analytic model."""

    measured: dict[str, int] = field(default_factory=dict)
    rescaled: dict[str, list[float]] = field(default_factory=dict)
    analytic: dict[str, int] = field(default_factory=dict)

    def add_measured(self, kind: str, factor: float) -> None:
        if factor == 1.0:
            self.measured[kind] = self.measured.get(kind, 0) + 1
        else:
            r = self.rescaled.setdefault(kind, [factor, factor, 0])
            r[0], r[1], r[2] = min(r[0], factor), max(r[1], factor), r[2] + 1

    def add_analytic(self, kind: str) -> None:
        self.analytic[kind] = self.analytic.get(kind, 0) + 1


def _family(kind: str) -> str:
    for prefix in sorted(_KIND_SECTIONS, key=len, reverse=True):
        if kind.startswith(prefix):
            return prefix
    return kind


@dataclass(frozen=True)
class TableCostModel(AnalyticCostModel):
    """The analytic composition over measured components, rescaled to the scenario's hardware."""

    table: CalibrationTable = field(default=None, repr=False)  # type: ignore[assignment]
    # The profile the table was measured on; None: the scenario's own hardware (nothing is rescaled).
    baseline: HardwareProfile | None = field(default=None, repr=False, compare=False)
    baseline_source: str = ""
    # How the timings were chosen: "median", "quantile 0.9", "sample seed 3" (provenance only).
    timings: str = "median"
    _ledger: _Ledger = field(default_factory=_Ledger, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.table, CalibrationTable):
            raise TypeError("TableCostModel needs a CalibrationTable (use TableCostModel.from_profile)")

    @classmethod
    def from_analytic(
        cls, analytic: AnalyticCostModel, table: CalibrationTable, baseline: HardwareProfile | None = None,
        baseline_source: str = "",
    ) -> TableCostModel:
        return cls(analytic.hw, analytic.model, analytic.training, analytic.tokens_per_gpu, table=table,
                   baseline=baseline, baseline_source=baseline_source)

    @classmethod
    def from_profile(cls, analytic: AnalyticCostModel) -> TableCostModel:
        """The profile's table, with the profile file that names it as the baseline (the loader found it:
        :attr:`~sosim.inputs.config.HardwareProfile.calibration_baseline`; this model never searches folders)."""
        paths = analytic.hw.calibration_paths
        if not paths:
            raise ValueError(f"profile '{analytic.hw.name}' names no calibration table")
        baseline, source = analytic.hw.calibration_baseline
        return cls.from_analytic(analytic, load_tables(paths), baseline, source)

    # --- spread (issue 11): the same model over other timings of the same table ------------------------------
    def at_quantile(self, q: float) -> TableCostModel:
        """Every measured lookup at quantile ``q`` of its measured run-to-run spread (0.1 = p10, 0.9 = p90)."""
        return dataclasses.replace(self, table=self.table.at_quantile(q), timings=f"quantile {q:g}",
                                   _ledger=_Ledger())

    def sample(self, rng: np.random.Generator, label: str = "sample") -> TableCostModel:
        """One replay's draw: each component kind (GEMMs, attention, layers, copies, CPU Adam, ...) takes one
        quantile drawn from ``rng``, shared by all its lookups, so related costs move together."""
        stated = self.hw.lease_spread.as_mapping() if self.hw.lease_spread is not None else None
        table, draws = self.table.sampled(rng, stated)
        desc = ", ".join(f"{op} {u:.2f}" for op, u in sorted(draws.items()))
        return dataclasses.replace(self, table=table, timings=f"{label} (quantiles: {desc})", _ledger=_Ledger())

    # --- the baseline and the rescaling rule -----------------------------------------------------------------
    @functools.cached_property
    def _now(self) -> AnalyticCostModel:
        """The plain analytic model on the scenario's hardware."""
        return AnalyticCostModel(self.hw, self.model, self.training, self.tokens_per_gpu)

    @functools.cached_property
    def _changes(self) -> dict[str, tuple[Any, Any]]:
        return {} if self.baseline is None else hardware_changes(self.baseline, self.hw)

    @functools.cached_property
    def _base(self) -> AnalyticCostModel:
        """The plain analytic model on the hardware the table was measured on."""
        hw = self.baseline if self.baseline is not None and self._changes else self.hw
        return AnalyticCostModel(hw, self.model, self.training, self.tokens_per_gpu)

    @functools.cached_property
    def _base_cpu(self) -> AnalyticCostModel:
        """The baseline for CPU costs looked up by thread count: the table's thread dimension already says
        what a core count does, so the baseline takes the scenario's ``cpu.cores`` (otherwise the analytic
        model's "cast_GBps on all cores" would count a core override a second time)."""
        base = self._base.hw
        if base.cpu.cores == self.hw.cpu.cores:
            return self._base
        hw = base.model_copy(update={"cpu": base.cpu.model_copy(update={"cores": self.hw.cpu.cores})})
        return AnalyticCostModel(hw, self.model, self.training, self.tokens_per_gpu)

    def _use(
        self,
        kind: str,
        measured: float | None,
        analytic: Callable[[AnalyticCostModel], float],
        measured_at: Callable[[AnalyticCostModel], float] | None = None,
        cpu: bool = False,
    ) -> float:
        """A measured cost times analytic(scenario hw) / analytic(baseline hw); else the analytic cost.

        ``measured_at``: the analytic cost at the arguments the measurement was taken at, when they differ
        from the scenario's (a thread count beyond the measured ones); ``cpu``: use the CPU baseline.
        """
        if measured is None:
            self._ledger.add_analytic(kind)
            return analytic(self._now)
        factor = 1.0
        if self._changes or measured_at is not None:
            base = (measured_at or analytic)(self._base_cpu if cpu else self._base)
            if base > 0:
                factor = analytic(self._now) / base
        self._ledger.add_measured(kind, factor)
        return measured * factor

    def _threads(self, op: str, variant: str, threads: float) -> tuple[int, bool]:
        """The thread count to look up: ``threads`` rounded, clamped into the measured range (and whether it
        was clamped, so that the analytic model scales from the nearest measured count)."""
        wanted = max(1, round(threads))
        span = self.table.thread_range(op, variant)
        if span is None:
            return wanted, False
        clamped = int(min(max(wanted, span[0]), span[1]))
        return clamped, clamped != wanted

    def _roofline(self, flops: float, seconds: float) -> float:
        """No rescaled GPU cost beats its FLOPs at the scenario's peak (a measured rate x an efficiency ratio
        could otherwise pass it): hardware FLOP/s never exceeds the peak."""
        return max(seconds, flops / self._peak_flops)

    # --- GPU -------------------------------------------------------------------------------------------------
    @functools.cached_property
    def _shape(self) -> tuple[int, int, int, int, int]:
        m, t = self.model, self.training
        batch = max(1, self.tokens_per_gpu // t.seq_len)
        return m.hidden, t.seq_len, batch, m.heads, m.attn_head_dim

    def gemm_shape_s(self, m: int, n: int, k: int) -> float:
        measured = self.table.gemm_time_s(m, n, k)
        return self._roofline(2.0 * m * n * k, self._use("gemm", measured, lambda a: a.gemm_shape_s(m, n, k)))

    def attention_fwd_s(self) -> float:
        _, seq, batch, heads, head_dim = self._shape
        measured = self.table.attention_time_s(batch, seq, heads, head_dim, backward=False)
        seconds = self._use("attention_fwd", measured, lambda a: a.attention_fwd_s())
        if measured is not None:  # a timed kernel over every token: the stack's share of it (training_stack.py)
            seconds *= training_stack.attention_work_fraction(self.training) * self._window_share
        return self._roofline(self._attention_flops_fwd, seconds)

    @functools.cached_property
    def _window_share(self) -> float:
        """A causal kernel's time scaled to the work of the model's sliding-window layers (1 without them)."""
        fraction = tm.causal_attention_fraction(self.model, self.training.seq_len)
        return 1.0 if fraction == tm.CAUSAL_ATTENTION_FRACTION else fraction / tm.CAUSAL_ATTENTION_FRACTION

    def attention_bwd_s(self) -> float:
        _, seq, batch, heads, head_dim = self._shape
        fwd = self.table.attention_time_s(batch, seq, heads, head_dim, backward=False)
        both = self.table.attention_time_s(batch, seq, heads, head_dim, backward=True)
        measured = None if fwd is None or both is None else max(both - fwd, 0.0)
        seconds = self._use("attention_bwd", measured, lambda a: a.attention_bwd_s())
        if measured is not None:
            seconds *= training_stack.attention_work_fraction(self.training) * self._window_share
        return self._roofline(2.0 * self._attention_flops_fwd, seconds)

    def _measured_layer(self, backward: bool) -> float | None:
        """A measured whole layer at this exact shape (hidden, heads, kv_heads, ffn, seq; batch interpolated)."""
        m = self.model
        if m.ffn_kind != "swiglu" or m.is_moe:  # the harness times Llama-style dense layers only
            return None
        if m.head_dim is not None and m.q_dim != m.hidden:  # attention wider or narrower than the layers timed
            return None
        if not training_stack.uses_timed_layers(self.training):  # another stack: composed from its components
            return None
        hidden, seq, batch, _, _ = self._shape
        return self.table.layer_time_s(hidden, seq, batch, backward=backward, heads=m.heads,
                                       kv_heads=m.n_kv_heads, ffn=m.ffn_dim)

    def layer_fwd_s(self) -> float:
        measured = self._measured_layer(backward=False)
        if measured is None:  # composed from the measured components, floor included
            return super().layer_fwd_s()
        return self._roofline(self._layer_flops_fwd, self._use("layer_fwd", measured, lambda a: a.layer_fwd_s()))

    def layer_bwd_only_s(self) -> float:
        fwd = self._measured_layer(backward=False)
        both = self._measured_layer(backward=True)
        if fwd is None or both is None:
            return super().layer_bwd_only_s()
        seconds = self._use("layer_bwd", max(both - fwd, 0.0), lambda a: a.layer_bwd_only_s())
        return self._roofline(2.0 * self._layer_flops_fwd, seconds)

    @functools.cached_property
    def _layer_flops_fwd(self) -> float:
        return tm.layer_flops_fwd(self.model, self.tokens_per_gpu, self.training.seq_len)

    def gpu_cast_s(self, elements: float) -> float:
        measured = self.table.cast_time_s(elements, "gpu", "bf16", None)
        return self._use("gpu_cast", measured, lambda a: a.gpu_cast_s(elements))

    # --- host link -------------------------------------------------------------------------------------------
    def copy_s(self, n_bytes: float, direction: Direction, pinned: bool) -> float:
        measured = self.table.copy_time_s(n_bytes, direction, pinned, False)
        kind = f"copy_{direction}_{'pinned' if pinned else 'pageable'}"
        return self._use(kind, measured, lambda a: a.copy_s(n_bytes, direction, pinned))


    # --- CPU -------------------------------------------------------------------------------------------------
    def cpu_adam_s(self, params: float, impl: AdamImpl, cores: float, total_params: float) -> float:
        name = _ADAM_IMPL.get(impl)
        if name is None:
            return self._use(f"cpu_adam_{impl}", None, lambda a: a.cpu_adam_s(params, impl, cores, total_params))
        threads, clamped = self._threads("cpu_adam", name, cores)
        whole = self.table.cpu_adam_time_s(total_params, threads, name)  # type: ignore[arg-type]
        measured = None if whole is None else whole * params / total_params
        if measured is not None and clamped and cores > threads:
            measured = beyond_measured_threads_s(measured, threads, cores, ADAM_BYTES_PER_PARAM * params,
                                                 self.hw.cpu.mem_GBps)
            return self._use(f"cpu_adam_{name}", measured,
                             lambda a: a.cpu_adam_s(params, impl, cores, total_params), cpu=True)
        return self._use(f"cpu_adam_{name}", measured, lambda a: a.cpu_adam_s(params, impl, cores, total_params),
                         (lambda a: a.cpu_adam_s(params, impl, threads, total_params)) if clamped else None, cpu=True)

    def cpu_cast_s(self, elements: float, cores: float) -> float:
        threads, clamped = self._threads("cast", "cpu_fp32_to_bf16", cores)
        measured = self.table.cast_time_s(elements, "cpu", "bf16", threads)
        if measured is not None and clamped and cores > threads:
            measured = beyond_measured_threads_s(measured, threads, cores, CPU_CAST_BYTES_PER_ELEMENT * elements,
                                                 self.hw.cpu.mem_GBps)
            return self._use("cpu_cast", measured, lambda a: a.cpu_cast_s(elements, cores), cpu=True)
        return self._use("cpu_cast", measured, lambda a: a.cpu_cast_s(elements, cores),
                         (lambda a: a.cpu_cast_s(elements, threads)) if clamped else None, cpu=True)

    # --- collectives and disk --------------------------------------------------------------------------------
    def collective_s(self, kind: CollectiveKind, n_bytes: float, ranks: int, per_node: int | None = None) -> float:
        del per_node  # the table's rows are per rank count; nodes are the cost object's (sosim/costs/model.py)
        measured = self.table.collective_time_s(kind, n_bytes, ranks)
        return self._use(f"nccl_{kind}", measured, lambda a: a.collective_s(kind, n_bytes, ranks))

    def disk_s(self, n_bytes: float, write: bool, block_bytes: float = AIO_BLOCK_BYTES,
               queue_depth: int = AIO_QUEUE_DEPTH, threads: int = AIO_THREADS) -> float:
        del block_bytes, queue_depth, threads  # one drive as measured; the node's volume is sosim/costs/model.py's
        measured = self.table.disk_time_s(n_bytes, write)
        return self._use(f"disk_{'write' if write else 'read'}", measured, lambda a: a.disk_s(n_bytes, write))

    # --- DeepSpeed stage-3 paths -----------------------------------------------------------------------------
    def ds_refresh_s(self, elements: float, threads: float, pinned: bool, system: str = "zero3_offload") -> float:
        # The table times DeepSpeed's allocating, pageable path only; a pinned staging path is analytic.
        variant = stage3_variant(system)
        looked_up, clamped = self._threads("ds_refresh", variant, threads)
        span = self.table.thread_range("ds_refresh", variant)
        if variant == "superoffload" and span is not None:
            # SuperOffload's rows are keyed by the main thread's affinity share (int(0.2 n) cores), the
            # configuration they were timed in; the cast itself ran on the OpenMP pool of all n cores, which
            # is what ``threads`` says here. So: the measured rows as they are (rescaled only if the
            # hardware differs from the baseline's).
            looked_up, clamped = int(span[1]), False
        measured = None if pinned else self.table.ds_refresh_time_s(elements, looked_up, variant)
        return self._use("ds_refresh", measured, lambda a: a.ds_refresh_s(elements, threads, pinned, system),
                         (lambda a: a.ds_refresh_s(elements, looked_up, pinned, system)) if clamped else None,
                         cpu=True)

    def stage3_hook_s(self, tokens: int, backward: bool) -> float:
        m = self.model
        found = None
        if m.ffn_kind == "swiglu" and not m.is_moe:  # the harness times Hugging Face Llama layers only
            found = self.table.stage3_hook_time_s(m.hidden, m.heads, m.n_kv_heads, m.ffn_dim, tokens, backward)
        measured = None if found is None else found[0]
        return self._use("stage3_hook", measured, lambda a: a.stage3_hook_s(tokens, backward))

    def ds_unscale_clip_s(self, elements: float, system: str) -> float:
        # Measured inside step() of the 0.49 B-parameter run (ds_step_fixed <variant>_unscale_clip, summed over
        # its sub-groups): a per-element CPU pass, so its rate times the sub-group's elements.
        piece = self.table.ds_step_piece(stage3_variant(system), "unscale_clip")
        measured = None if piece is None or piece[1] <= 0 else piece[0] / piece[1] * elements
        return self._use("ds_step_unscale_clip", measured, lambda a: a.ds_unscale_clip_s(elements, system))

    def ds_step_fixed_s(self, params: float, subgroups: int, system: str) -> float:
        measured = self._step_fixed_from_pieces(subgroups, stage3_variant(system))
        if measured is None:  # a table with whole-step rows only: their fit (it includes the unscale pass)
            measured = self.table.ds_step_fixed_time_s(params, subgroups, stage3_variant(system))
        return self._use("ds_step_fixed", measured, lambda a: a.ds_step_fixed_s(params, subgroups, system))

    def _step_fixed_from_pieces(self, subgroups: int, variant: str) -> float | None:
        """step()'s fixed part from its measured pieces, each scaled by what it loops over in DeepSpeed:

        * ``norm`` (``_get_norm_groups``: per sub-group, the norm of its gradients and a ``float()`` host
          sync): per sub-group;
        * ``partition_all`` (``_partition_all_parameters``: release/re-partition per parameter tensor): per
          parameter tensor of the model, from the measured model's count (:data:`STEP_FIXED_MEASURED_TENSORS`);
        * ``pre_step``, ``overflow_check``, ``post_step``: as measured (fixed per step).
        The unscale pass is not in it (:meth:`ds_unscale_clip_s`), nor the Adam, the refresh or the worker wait.
        """
        pieces = {name: self.table.ds_step_piece(variant, name)
                  for name in ("norm", "partition_all", "pre_step", "overflow_check", "post_step")}
        if any(p is None for p in pieces.values()):
            return None
        norm, part = pieces["norm"], pieces["partition_all"]
        assert norm is not None and part is not None
        total = norm[0] / max(norm[2], 1.0) * subgroups
        total += part[0] * model_parameter_tensors(self.model) / STEP_FIXED_MEASURED_TENSORS
        total += sum(p[0] for n, p in pieces.items() if p is not None and n in ("pre_step", "overflow_check",
                                                                                   "post_step"))
        return total

    def so_worker_roundtrip_s(self, elements: float, with_copies: bool = False) -> float:
        """The worker's round trip without its Adam: the measured round trip (``so_worker``: hand-off, the
        worker's gradient copy into its pinned buffer, DeepSpeedCPUAdam on its cores, result, the main
        process's parameter copy back) minus the CPU Adam of the same elements at the worker's measured core
        count (``cpu_adam`` rows; the plan adds the Adam itself). ``with_copies``: measured while the main
        process copies gradients and casts; the slowdown of the whole round trip is carried here."""
        variant = "with_copies" if with_copies else "alone"
        total = self.table.so_worker_time_s(elements, variant)
        measured = None
        if total is not None:
            span = self.table.thread_range("so_worker", variant)
            threads = span[1] if span is not None else float(self.hw.cpu.cores)
            adam = self.cpu_adam_s(elements, "cpu_adam", threads, max(elements, 1.0))
            measured = max(0.0, total - adam)
        return self._use("so_worker", measured, lambda a: a.so_worker_roundtrip_s(elements, with_copies))

    def so_flush_s(self, elements: float) -> float | None:
        """SuperOffload's whole gradient flush as measured (``so_grads`` section, variant ``shared``: the fp32
        gradients go to the worker's shared memory), rescaled like its parts on other hardware; None without
        the rows (the plan then times its four ops from the copy and cast costs)."""
        measured = self.table.so_flush_time_s(elements)
        if measured is None:
            return None
        return self._use("so_flush", measured, lambda a: so_flush_parts_s(a, elements))

    def measured_table(self) -> CalibrationTable:
        """The table these costs are measured in (a band replay's: the sampled one)."""
        return self.table

    # --- provenance ------------------------------------------------------------------------------------------
    @property
    def provenance(self) -> dict[str, str]:
        led = self._ledger
        out = {
            "cost_model": "table",
            "profile": self.hw.name,
            "calibration": table_names(self.table),
            "calibration_sha256": self.table.sha256,
            **({"calibration_parts": "; ".join(f"{_short(p)} sha256 {sha}" for p, sha in self.table.parts)}
               if self.table.parts else {}),
            "calibration_timings": self.timings,
            "calibration_baseline": self.baseline_source
            or "the scenario's own profile (no profile file names this table)",
            "hardware_vs_baseline": "; ".join(f"{k} {a} -> {b}" for k, (a, b) in self._changes.items()) or "same",
            "costs_measured": _counts(led.measured),
            "costs_rescaled": "; ".join(
                f"{kind} x{n} by {_factor(lo, hi)} ({self._why(kind)})" for kind, (lo, hi, n) in
                sorted((k, (v[0], v[1], int(v[2]))) for k, v in led.rescaled.items())
            ) or "none",
            "costs_analytic": _counts(led.analytic),
            "table_lookups_measured": str(sum(led.measured.values()) + sum(int(v[2]) for v in led.rescaled.values())),
            "table_lookups_fallback": str(sum(led.analytic.values())),
        }
        origin = published.table_origin(self.table)
        if origin:
            out["calibration_origin"] = origin
            if published.all_published(self.table):  # nothing in it was measured by sosim: say so by name
                out["costs_published"] = out["costs_measured"]
                out["costs_measured"] = "none (the table holds published values: costs_published)"
        moved = grace_host.transferred_note(self.hw.cpu)
        if moved:
            out["costs_transferred"] = moved
        return out

    def _why(self, kind: str) -> str:
        sections = _KIND_SECTIONS.get(_family(kind), _HW_SECTIONS)
        changed = [k for k in self._changes if k.split(".")[0] in sections]
        return "analytic ratio for " + (", ".join(changed) if changed else "the changed hardware")


def _short(path: Path) -> str:
    """A table by its folder and file name (every session's file is called measurements.csv)."""
    return f"{path.parent.name}/{path.name}"


def table_names(table: CalibrationTable) -> str:
    """How provenance names a table: its file name; a merged table lists each part by folder and file."""
    if table.parts:
        return ", ".join(_short(p) for p, _ in table.parts)
    return str(Path(table.path).name)




def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "none"


def _factor(lo: float, hi: float) -> str:
    return f"{lo:.4g}" if f"{lo:.4g}" == f"{hi:.4g}" else f"{lo:.4g}..{hi:.4g}"



# The fp32 -> bf16 cast reads 4 B and writes 2 B per element.
CPU_CAST_BYTES_PER_ELEMENT = 6.0


def beyond_measured_threads_s(measured_s: float, threads: int, cores: float, n_bytes: float,
                              mem_GBps: float) -> float:
    """A CPU pass (CPU Adam, a cast) on more cores than the table's largest measured thread count: one rule for
    both. The cores share the work (time x threads / cores), but no pass moves its bytes faster than the host's
    memory bandwidth (``cpu.mem_GBps``), nor gets slower than measured. On the H200 host (16 threads measured,
    105 GB/s) DeepSpeed's CPU Adam already moves its 28 B/param at the ceiling, so 64 cores leave it as is,
    while the fp32 -> bf16 cast (6 B/element at ~68 GB/s) gains at most 105 / 68 = 1.55x, not 4x."""
    floor_s = n_bytes / (mem_GBps * GB) if mem_GBps > 0 else 0.0
    return min(measured_s, max(measured_s * threads / cores, floor_s))


def so_flush_parts_s(costs: AnalyticCostModel, elements: float) -> float:
    """The four ops of one SuperOffload flush as the plan builds them: bf16 D2H and H2D (pinned host buffer),
    the GPU cast to fp32, the pageable fp32 D2H (``gradients.Stage3Gradients``)."""
    b16 = elements * 2.0
    return (costs.copy_s(b16, "d2h", True) + costs.copy_s(b16, "h2d", True) + costs.gpu_cast_s(elements)
            + costs.copy_s(elements * 4.0, "d2h", False))
