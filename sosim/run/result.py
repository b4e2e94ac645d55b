"""Result of one simulation: metrics, spans, memory, provenance; and the metric arithmetic.

The steady-state step is the window between the start of the second-to-last and the last iteration's
first forward op. Inside it, every instant is attributed to exactly one bucket, so the breakdown sums to
the step time: GPU busy (compute or other GPU work), else the first busy kind of work in the order
CPU optimizer > ZeRO-3 hooks > other CPU work (casts, bookkeeping) > D2H > H2D > collectives, else idle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd

from sosim.engine.plan import Category, Plan, ResourceKind
from sosim.hardware import model as tm
from sosim.hardware.memory import Feasibility, MemoryUsage
from sosim.hardware.model import global_tokens_per_step
from sosim.inputs.config import Scenario
from sosim.inputs.units import GIB, TFLOP

# GPU-idle time goes to the first of these whose resource is busy (the CPU side first: it is what the
# GPU waits on in offload schedules). Matched on resource kinds, so every instance of a kind counts.
# CPU work is attributed by category (a cast may run on the optimizer worker's cores when they are shared);
# a CPU op of another category (framework bookkeeping, host syncs) counts as CPU cast/main-thread work.
_CPU = frozenset({ResourceKind.CPU_OPT, ResourceKind.CPU_MAIN})
EXPOSED_ORDER: tuple[tuple[str, frozenset[ResourceKind], frozenset[Category] | None], ...] = (
    ("exposed_cpu_optimizer_s", _CPU, frozenset({Category.OPTIMIZER})),
    # DeepSpeed ZeRO-3's module hooks: the host thread's Python around each layer (issue 16: was counted as
    # exposed_cpu_cast_s, which hid that a stage-3 step can be host-bound without casting anything).
    ("exposed_stage3_hooks_s", _CPU, frozenset({Category.HOOK})),
    ("exposed_cpu_cast_s", _CPU, None),
    ("exposed_d2h_s", frozenset({ResourceKind.D2H}), None),
    ("exposed_h2d_s", frozenset({ResourceKind.H2D}), None),
    ("exposed_comm_s", frozenset({ResourceKind.NET}), None),
    ("exposed_nvme_s", frozenset({ResourceKind.NVME_READ, ResourceKind.NVME_WRITE}), None),
)
# Resource kinds whose time counts as the GPU being busy (compute stream and side streams).
GPU_KINDS: frozenset[ResourceKind] = frozenset({ResourceKind.GPU, ResourceKind.GPU_CAST})
BREAKDOWN_KEYS: tuple[str, ...] = (
    "gpu_compute_s",
    "gpu_other_s",
    *(k for k, _, _ in EXPOSED_ORDER),
    "idle_s",
)

SPAN_COLUMNS = ["resource", "op", "layer", "iteration", "category", "phase", "start_s", "end_s"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric of :attr:`Result.metrics`: its name, unit, Python type and meaning."""

    name: str
    unit: str
    dtype: type
    description: str


_BREAKDOWN_DOC = {
    "gpu_compute_s": "GPU stream busy with forward/backward",
    "gpu_other_s": "GPU stream busy with other work (optimizer, casts, syncs)",
    "exposed_cpu_optimizer_s": "GPU idle while CPU optimizer work runs",
    "exposed_stage3_hooks_s": "GPU idle while DeepSpeed ZeRO-3's module hooks run on the host thread",
    "exposed_cpu_cast_s": "GPU idle while other CPU work runs (casts, copies, bookkeeping)",
    "exposed_d2h_s": "GPU idle while a device-to-host copy runs",
    "exposed_h2d_s": "GPU idle while a host-to-device copy runs",
    "exposed_comm_s": "GPU idle while a collective runs",
    "exposed_nvme_s": "GPU idle while NVMe reads or writes run",
    "idle_s": "GPU idle with nothing else busy",
}

# The declared schema: every key of ``Result.metrics``, in order. Sweeps build their columns from it.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("step_time_s", "s", float, "steady-state step time"),
    MetricSpec("tokens_per_s", "tokens/s", float, "global tokens per second"),
    MetricSpec("samples_per_s", "samples/s", float, "global sequences per second"),
    MetricSpec("model_tflops", "TFLOP/s", float, "model FLOPs per second per GPU (no recompute)"),
    MetricSpec("hardware_tflops", "TFLOP/s", float, "hardware FLOPs per second per GPU (recompute counted)"),
    MetricSpec("deepspeed_convention_tflops", "TFLOP/s", float,
               "TFLOP/s per GPU as DeepSpeed's examples and the ZeRO-Offload paper count them (all parameters, "
               "full attention, recompute counted): only for comparison with numbers published that way"),
    MetricSpec("mfu", "fraction", float, "model FLOPs / peak of all GPUs"),
    MetricSpec("gpu_busy_frac", "fraction", float, "fraction of the step the GPU stream is busy"),
    *(MetricSpec(k, "s", float, _BREAKDOWN_DOC[k]) for k in BREAKDOWN_KEYS),
    MetricSpec("gpu_mem_peak_gib", "GiB", float, "peak GPU memory per rank"),
    MetricSpec("cpu_mem_peak_gib", "GiB", float, "peak host memory per rank"),
    MetricSpec("params_b", "billion", float, "model parameters"),
    MetricSpec("link_gb_per_step", "GB", float, "host-link bytes of one steady iteration, both directions"),
    MetricSpec("link_h2d_gb_per_step", "GB", float, "host-to-device bytes of one steady iteration"),
    MetricSpec("link_d2h_gb_per_step", "GB", float, "device-to-host bytes of one steady iteration"),
    MetricSpec("feasible", "", bool, "model state and activations fit in both memories"),
    MetricSpec("reason", "", str, "why not feasible (empty when feasible)"),
)
METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)


def metric_schema() -> dict[str, type]:
    """Metric name -> Python type, in output order (what a sweep's columns are, without simulating)."""
    return {m.name: m.dtype for m in METRICS}


def _active(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Whether any [start, end) interval contains each point (intervals may overlap)."""
    if starts.size == 0:
        return np.zeros(points.shape, dtype=bool)
    s = np.sort(starts)
    e = np.sort(ends)
    return (np.searchsorted(s, points, "right") - np.searchsorted(e, points, "right")) > 0


# Enum members are singletons that live as long as the interpreter: their id() is a stable key, and looking
# it up runs no Python code, unlike hashing an Enum member (Enum.__hash__ is a Python function). The metrics
# read one kind and one category per op in the window, so this lookup is on the hot path of a search.
_KIND_CODE = {id(k): i for i, k in enumerate(ResourceKind)}
_CATEGORY_CODE = {id(c): i for i, c in enumerate(Category)}
_op_kind = attrgetter("resource.kind")
_op_category = attrgetter("category")


def _member_table(codes: dict[int, int], members: frozenset[ResourceKind] | frozenset[Category] | None) -> np.ndarray:
    """A boolean table over codes: ``table[code_array]`` is the membership mask (np.isin costs ~20x more)."""
    table = np.zeros(len(codes), dtype=bool)
    if members is None:
        table[:] = True
    else:
        table[[codes[id(m)] for m in members]] = True
    return table


_EXPOSED_TABLES = tuple((key, _member_table(_KIND_CODE, kinds), _member_table(_CATEGORY_CODE, only))
                        for key, kinds, only in EXPOSED_ORDER)
_GPU_TABLE = _member_table(_KIND_CODE, GPU_KINDS)


# Which time classes an op of (kind code, category code) belongs to, one row per class: the GPU's compute, any
# GPU work, then each exposed bucket in EXPOSED_ORDER. ``_CLASS_TABLE[res, cat].T`` is the membership matrix.
_CLASS_TABLE = np.stack([
    np.outer(np.arange(len(_KIND_CODE)) == _KIND_CODE[id(ResourceKind.GPU)],
             np.arange(len(_CATEGORY_CODE)) == _CATEGORY_CODE[id(Category.COMPUTE)]),
    np.outer(_GPU_TABLE, np.ones(len(_CATEGORY_CODE), dtype=bool)),
    *(np.outer(kinds, only) for _key, kinds, only in _EXPOSED_TABLES),
], axis=-1)


def _window(plan: Plan, start: np.ndarray, end: np.ndarray, t0: float, t1: float) -> tuple[np.ndarray, ...]:
    """The ops overlapping [t0, t1): their resource-kind and category codes, start and end clipped to the
    window, and the window cut at every op boundary (piece widths and midpoints)."""
    idx = np.flatnonzero((end > t0) & (start < t1) & (end > start))
    window = plan.ops_like(idx.tolist())
    res = np.fromiter(map(_KIND_CODE.__getitem__, map(id, map(_op_kind, window))), np.int8, len(window))
    cat = np.fromiter(map(_CATEGORY_CODE.__getitem__, map(id, map(_op_category, window))), np.int8, len(window))
    s = np.clip(start[idx], t0, t1)
    e = np.clip(end[idx], t0, t1)
    bounds = np.unique(np.concatenate([s, e, [t0, t1]]))
    widths = np.diff(bounds)
    return res, cat, s, e, widths, bounds[:-1] + widths / 2


def step_breakdown(plan: Plan, start: np.ndarray, end: np.ndarray, t0: float, t1: float) -> dict[str, float]:
    """Seconds of [t0, t1) in each breakdown bucket; the values sum to t1 - t0.

    The window is cut at every op boundary; each piece goes to the first bucket active at its midpoint (GPU
    compute, other GPU work, then the exposed buckets in order, else idle). Whether a class of ops is active
    at each midpoint is counted for all classes at once: an op covers the midpoints from the first at or after
    its start to the last before its end, so (ops started at or before it) - (ops ended at or before it) > 0,
    the same integer test as :func:`_active`, which stays the readable oracle (tests/test_result_breakdown.py).
    """
    res, cat, s, e, widths, mids = _window(plan, start, end, t0, t1)
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    m = mids.size
    if m == 0:
        return out
    n_classes = _CLASS_TABLE.shape[-1]
    cls, op = np.nonzero(_CLASS_TABLE[res, cat].T)
    row = cls * (m + 1)
    starts = np.bincount(row + np.searchsorted(mids, s, "left")[op], minlength=n_classes * (m + 1))
    ends = np.bincount(row + np.searchsorted(mids, e, "left")[op], minlength=n_classes * (m + 1))
    active = np.cumsum((starts - ends).reshape(n_classes, m + 1), axis=1)[:, :m] > 0
    gpu_compute, gpu_any = active[0], active[1]
    out["gpu_compute_s"] = float(widths[gpu_compute].sum())
    out["gpu_other_s"] = float(widths[gpu_any & ~gpu_compute].sum())
    free = ~gpu_any
    for r, (key, _kinds, _only) in enumerate(_EXPOSED_TABLES):
        hit = free & active[2 + r]
        out[key] = float(widths[hit].sum())
        free &= ~hit
    out["idle_s"] = float(widths[free].sum())
    return out


def step_breakdown_reference(plan: Plan, start: np.ndarray, end: np.ndarray, t0: float,
                             t1: float) -> dict[str, float]:
    """:func:`step_breakdown` class by class with :func:`_active` (the oracle its tests compare with)."""
    res, cat, s, e, widths, mids = _window(plan, start, end, t0, t1)
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    if mids.size == 0:
        return out
    gpu = res == _KIND_CODE[id(ResourceKind.GPU)]
    compute = cat == _CATEGORY_CODE[id(Category.COMPUTE)]
    gpu_compute = _active(s[gpu & compute], e[gpu & compute], mids)
    # GPU work on a side stream (casts) keeps the GPU busy too: it is "other" GPU work, never idle time.
    on_gpu = _GPU_TABLE[res]
    gpu_any = _active(s[on_gpu], e[on_gpu], mids)
    out["gpu_compute_s"] = float(widths[gpu_compute].sum())
    out["gpu_other_s"] = float(widths[gpu_any & ~gpu_compute].sum())
    free = ~gpu_any
    for key, kinds, only in _EXPOSED_TABLES:
        sel = kinds[res] & only[cat]
        hit = free & _active(s[sel], e[sel], mids)
        out[key] = float(widths[hit].sum())
        free &= ~hit
    out["idle_s"] = float(widths[free].sum())
    return out


def compute_metrics(
    sc: Scenario, plan: Plan, start: np.ndarray, end: np.ndarray, usage: MemoryUsage, fit: Feasibility
) -> dict[str, Any]:
    its = plan.iteration_starts
    t0, t1 = float(start[its[-2]]), float(start[its[-1]])
    step = t1 - t0
    tokens = global_tokens_per_step(sc)
    gpus = sc.cluster.gpus
    model_flops = tm.model_flops_per_step(sc.model, sc.training, tokens)
    hw_flops = tm.hardware_flops_per_step(sc.model, sc.training, tokens)
    peak = sc.hardware.gpu.peak_bf16_tflops * TFLOP * gpus
    br = step_breakdown(plan, start, end, t0, t1)
    measured = plan.measured_iteration
    h2d, d2h = link_bytes_both(plan, measured)
    metrics: dict[str, Any] = {
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "samples_per_s": tokens / sc.training.seq_len / step,
        # Per GPU, as papers report them.
        "model_tflops": model_flops / step / TFLOP / gpus,
        "hardware_tflops": hw_flops / step / TFLOP / gpus,
        "deepspeed_convention_tflops": tm.deepspeed_convention_flops_per_step(sc.model, sc.training, tokens)
        / step / TFLOP / gpus,
        "mfu": model_flops / step / peak,
        "gpu_busy_frac": (br["gpu_compute_s"] + br["gpu_other_s"]) / step,
        **br,
        "gpu_mem_peak_gib": usage.gpu_peak_bytes / GIB,
        "cpu_mem_peak_gib": usage.cpu_peak_bytes / GIB,
        "params_b": tm.total_params(sc.model) / 1e9,
        "link_gb_per_step": (h2d + d2h) / 1e9,
        "link_h2d_gb_per_step": h2d / 1e9,
        "link_d2h_gb_per_step": d2h / 1e9,
        "feasible": fit.feasible,
        "reason": fit.reason,
    }
    return metrics


def link_bytes(plan: Plan, kind: ResourceKind, iteration: int) -> float:
    """Bytes the ops on resources of ``kind`` move in ``iteration`` (every instance of the kind)."""
    return sum(op.n_bytes for op in plan.ops if op.iteration == iteration and op.resource.kind is kind)


def link_bytes_both(plan: Plan, iteration: int) -> tuple[float, float]:
    """:func:`link_bytes` of H2D and of D2H in one pass over the plan (same sums, same order)."""
    h2d, d2h = ResourceKind.H2D, ResourceKind.D2H
    up: float = 0
    down: float = 0
    for op in plan.iteration_ops(iteration):
        kind = op.resource.kind
        if kind is h2d:
            up += op.n_bytes
        elif kind is d2h:
            down += op.n_bytes
    return up, down


@dataclass(frozen=True)
class Result:
    """Everything one simulation produced. Picklable; ``spans`` is built on first access."""

    scenario: Scenario
    metrics: dict[str, Any]
    plan: Plan
    start_s: np.ndarray
    end_s: np.ndarray
    memory: MemoryUsage
    provenance: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def spans(self) -> pd.DataFrame:
        ops = self.plan.ops
        return pd.DataFrame(
            {
                "resource": [o.resource.label for o in ops],
                "op": [o.name for o in ops],
                "layer": [o.layer for o in ops],
                "iteration": [o.iteration for o in ops],
                "category": [o.category.value for o in ops],
                "phase": [o.phase.value for o in ops],
                "start_s": self.start_s,
                "end_s": self.end_s,
            },
            columns=SPAN_COLUMNS,
        )

    @property
    def steady_window_s(self) -> tuple[float, float]:
        its = self.plan.iteration_starts
        return float(self.start_s[its[-2]]), float(self.start_s[its[-1]])

    def to_frame(self) -> pd.DataFrame:
        """One-row DataFrame of the metrics plus the scenario name and system."""
        row = {"scenario": self.scenario.name, "system": self.scenario.schedule.system, **self.metrics}
        return pd.DataFrame([row])

    def __repr__(self) -> str:
        m = self.metrics
        return (
            f"Result({self.scenario.name}: step {m['step_time_s']:.3f} s, {m['tokens_per_s']:.0f} tok/s, "
            f"MFU {m['mfu']:.1%}, feasible={m['feasible']})"
        )
