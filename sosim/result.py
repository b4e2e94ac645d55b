"""Result of one simulation: metrics, spans, memory, provenance; and the metric arithmetic.

The steady-state step is the window between the start of the second-to-last and the last iteration's
first forward op. Inside it, every instant is attributed to exactly one bucket, so the breakdown sums to
the step time: GPU busy (compute or other GPU work), else the first busy kind of work in the order
CPU optimizer > CPU cast > D2H > H2D > collectives, else idle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from sosim import model as tm
from sosim.config import Scenario
from sosim.memory import Feasibility, MemoryUsage
from sosim.plan import CAST, COMPUTE, CPU_CAST, CPU_OPT, D2H, GPU, H2D, NET, OPTIMIZER, Plan
from sosim.schedules.common import global_tokens_per_step
from sosim.units import GIB, TFLOP

# GPU-idle time goes to the first of these whose resource is busy (the CPU side first: it is what the
# GPU waits on in offload schedules).
# CPU work is attributed by category (a cast may run on the optimizer worker's cores when they are shared).
_CPU = frozenset({CPU_OPT, CPU_CAST})
EXPOSED_ORDER: tuple[tuple[str, frozenset[str], str | None], ...] = (
    ("exposed_cpu_optimizer_s", _CPU, OPTIMIZER),
    ("exposed_cpu_cast_s", _CPU, CAST),
    ("exposed_d2h_s", frozenset({D2H}), None),
    ("exposed_h2d_s", frozenset({H2D}), None),
    ("exposed_comm_s", frozenset({NET}), None),
)
BREAKDOWN_KEYS: tuple[str, ...] = (
    "gpu_compute_s",
    "gpu_other_s",
    *(k for k, _, _ in EXPOSED_ORDER),
    "idle_s",
)

SPAN_COLUMNS = ["resource", "op", "layer", "iteration", "category", "start_s", "end_s"]


def _active(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Whether any [start, end) interval contains each point (intervals may overlap)."""
    if starts.size == 0:
        return np.zeros(points.shape, dtype=bool)
    s = np.sort(starts)
    e = np.sort(ends)
    return (np.searchsorted(s, points, "right") - np.searchsorted(e, points, "right")) > 0


def step_breakdown(plan: Plan, start: np.ndarray, end: np.ndarray, t0: float, t1: float) -> dict[str, float]:
    """Seconds of [t0, t1) in each breakdown bucket; the values sum to t1 - t0."""
    resources = np.array([op.resource for op in plan.ops])
    categories = np.array([op.category for op in plan.ops])
    keep = (end > t0) & (start < t1) & (end > start)
    s = np.clip(start[keep], t0, t1)
    e = np.clip(end[keep], t0, t1)
    res = resources[keep]
    cat = categories[keep]
    bounds = np.unique(np.concatenate([s, e, [t0, t1]]))
    widths = np.diff(bounds)
    mids = bounds[:-1] + widths / 2
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    if mids.size == 0:
        return out
    gpu = res == GPU
    gpu_compute = _active(s[gpu & (cat == COMPUTE)], e[gpu & (cat == COMPUTE)], mids)
    gpu_any = _active(s[gpu], e[gpu], mids)
    out["gpu_compute_s"] = float(widths[gpu_compute].sum())
    out["gpu_other_s"] = float(widths[gpu_any & ~gpu_compute].sum())
    free = ~gpu_any
    for key, resources, category in EXPOSED_ORDER:
        sel = np.isin(res, list(resources))
        if category is not None:
            sel &= cat == category
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
    metrics: dict[str, Any] = {
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "samples_per_s": tokens / sc.training.seq_len / step,
        # Per GPU, as papers report them.
        "model_tflops": model_flops / step / TFLOP / gpus,
        "hardware_tflops": hw_flops / step / TFLOP / gpus,
        "mfu": model_flops / step / peak,
        "gpu_busy_frac": (br["gpu_compute_s"] + br["gpu_other_s"]) / step,
        **br,
        "gpu_mem_peak_gib": usage.gpu_peak_bytes / GIB,
        "cpu_mem_peak_gib": usage.cpu_peak_bytes / GIB,
        "params_b": tm.total_params(sc.model) / 1e9,
        "link_gb_per_step": float(plan.notes.get("link_bytes_per_step", 0.0)) / 1e9,  # type: ignore[arg-type]
        "feasible": fit.feasible,
        "reason": fit.reason,
    }
    return metrics


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
                "resource": [o.resource for o in ops],
                "op": [o.name for o in ops],
                "layer": [o.layer for o in ops],
                "iteration": [o.iteration for o in ops],
                "category": [o.category for o in ops],
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
