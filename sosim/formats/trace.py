"""Chrome trace JSON (opens in https://ui.perfetto.dev and chrome://tracing) of one simulated run.

Layout: one process ("sosim: <scenario>"), one named thread track per serial resource in a fixed order
(GPU compute first), one complete ("X") event per op named by the op and carrying its layer, iteration and
category, a global instant event at each iteration start, and counter ("C") tracks for GPU and CPU memory.
Times are microseconds, as the format requires.

The memory counters are a model, not a measurement: static state (everything in ``Result.memory`` except
activations) plus an activation curve that rises linearly across the forward ops of an iteration and falls
linearly across its backward ops, reaching the schedule's reported activation peak.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sosim.engine.plan import TRACK_ORDER, Category, Phase, Resource, ResourceKind
from sosim.inputs.units import GIB
from sosim.run.result import Result

# Track labels per resource kind; a kind without a label shows its value.
RESOURCE_LABELS: dict[ResourceKind, str] = {
    ResourceKind.GPU: "GPU compute",
    ResourceKind.GPU_CAST: "GPU cast stream",
    ResourceKind.H2D: "H2D link",
    ResourceKind.D2H: "D2H link",
    ResourceKind.CPU_OPT: "CPU optimizer",
    ResourceKind.CPU_MAIN: "CPU main process",
    ResourceKind.NET: "Collectives (NCCL)",
    ResourceKind.NVME_READ: "NVMe reads",
    ResourceKind.NVME_WRITE: "NVMe writes",
}
PID = 1
US_PER_S = 1e6
ACTIVATIONS = "activations"


def resource_label(resource: Resource) -> str:
    """Human label of a track: the kind's label, with the instance id when it is not 0."""
    base = RESOURCE_LABELS.get(resource.kind, resource.kind.value)
    return base if resource.instance == 0 else f"{base} #{resource.instance}"


def resource_order(resources: list[Resource]) -> list[Resource]:
    """Resources in the canonical order of their kinds (GPU compute first), then by instance."""
    rank = {k: i for i, k in enumerate(TRACK_ORDER)}
    return sorted(set(resources), key=lambda r: (rank[r.kind], r.instance))


def _metadata(result: Result, tids: dict[Resource, int]) -> list[dict[str, Any]]:
    sc = result.scenario
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
         "args": {"name": f"sosim: {sc.name} ({sc.schedule.system} on {sc.hardware.name})"}},
    ]
    for resource, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid,
                       "args": {"name": resource_label(resource)}})
        # Perfetto sorts tracks by this index, so GPU compute stays on top.
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid,
                       "args": {"sort_index": tid}})
    return events


def _op_events(result: Result, tids: dict[Resource, int]) -> list[dict[str, Any]]:
    start_us = np.asarray(result.start_s, dtype=float) * US_PER_S
    dur_us = (np.asarray(result.end_s, dtype=float) - np.asarray(result.start_s, dtype=float)) * US_PER_S
    # tolist() turns numpy floats into Python floats once (json cannot encode numpy scalars, and a per-item
    # float() is the slow part for 80-layer traces).
    starts, durs = start_us.tolist(), dur_us.tolist()
    return [
        {"name": op.name, "cat": op.category.value, "ph": "X", "pid": PID, "tid": tids[op.resource],
         "ts": starts[op.id], "dur": durs[op.id],
         "args": {"layer": op.layer, "iteration": op.iteration, "category": op.category.value,
                  "phase": op.phase.value, "bytes": op.n_bytes, "flops": op.flops, "group": op.group}}
        for op in result.plan.ops
    ]


def _iteration_events(result: Result) -> list[dict[str, Any]]:
    events = []
    for i, op_id in enumerate(result.plan.iteration_starts):
        ts = float(result.start_s[op_id]) * US_PER_S
        events.append({"name": f"iteration {i}", "ph": "i", "s": "g", "pid": PID, "tid": 0, "ts": ts,
                       "args": {"iteration": i}})
    t0, t1 = result.steady_window_s
    events.append({"name": "steady-state step", "ph": "i", "s": "g", "pid": PID, "tid": 0,
                   "ts": t0 * US_PER_S, "args": {"step_time_s": t1 - t0}})
    return events


def activation_curve_bytes(result: Result) -> tuple[list[float], list[float]]:
    """(times in s, live activation bytes): up by peak/n_fwd at the end of each forward GPU op of an
    iteration, down by peak/n_bwd at the end of each backward op (GPU compute ops of those phases)."""
    peak = float(result.memory.gpu_bytes.get(ACTIVATIONS, 0.0))
    times: list[float] = [0.0]
    levels: list[float] = [0.0]
    if peak <= 0:
        return times, levels
    by_iteration: dict[int, tuple[list[float], list[float]]] = {}
    for op in result.plan.ops:
        if op.resource.kind is not ResourceKind.GPU or op.category is not Category.COMPUTE:
            continue
        fwd, bwd = by_iteration.setdefault(op.iteration, ([], []))
        if op.phase is Phase.FORWARD:
            fwd.append(float(result.end_s[op.id]))
        elif op.phase is Phase.BACKWARD:
            bwd.append(float(result.end_s[op.id]))
    for iteration in sorted(by_iteration):
        fwd, bwd = by_iteration[iteration]
        for k, t in enumerate(sorted(fwd), start=1):
            times.append(t)
            levels.append(peak * k / len(fwd))
        for k, t in enumerate(sorted(bwd), start=1):
            times.append(t)
            levels.append(peak * (1.0 - k / len(bwd)))
    return times, levels


def _memory_events(result: Result) -> list[dict[str, Any]]:
    mem = result.memory
    static_gpu = sum(v for k, v in mem.gpu_bytes.items() if k != ACTIVATIONS)
    times, levels = activation_curve_bytes(result)
    events = [
        {"name": "GPU memory (GiB)", "ph": "C", "pid": PID, "ts": t * US_PER_S,
         "args": {"static": static_gpu / GIB, "activations": a / GIB}}
        for t, a in zip(times, levels)
    ]
    end_us = float(np.max(result.end_s)) * US_PER_S if len(result.end_s) else 0.0
    cpu = {name: float(v) / GIB for name, v in mem.cpu_bytes.items()}
    # Host state is resident for the whole run: one sample at each end draws a flat stacked counter.
    for ts in (0.0, end_us):
        events.append({"name": "CPU memory (GiB)", "ph": "C", "pid": PID, "ts": ts, "args": cpu})
    return events


def _band_events(result: Result, band: Mapping[str, float]) -> list[dict[str, Any]]:
    """Global markers where the steady step would end at its band's p10 and p90 (sosim.answers.bands)."""
    t0, _ = result.steady_window_s
    return [{"name": f"step {q} (band)", "ph": "i", "s": "g", "pid": PID, "tid": 0,
             "ts": (t0 + band[f"step_time_s_{q}"]) * US_PER_S, "args": {f"step_time_s_{q}": band[f"step_time_s_{q}"]}}
            for q in ("p10", "p90")]


def chrome_trace(result: Result, band: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.

    ``band``: the error band's metrics (``step_time_s_p10`` ...): markers at p10/p90 and the values in otherData.
    """
    tids = {r: i + 1 for i, r in enumerate(resource_order(result.plan.resources))}
    events = [*_metadata(result, tids), *_op_events(result, tids), *_iteration_events(result),
              *_memory_events(result), *(_band_events(result, band) if band else [])]
    m = result.metrics
    other = {"scenario": result.scenario.name, "system": result.scenario.schedule.system,
             "hardware": result.scenario.hardware.name, "step_time_s": m["step_time_s"],
             "tokens_per_s": m["tokens_per_s"], "feasible": m["feasible"],
             "provenance": dict(result.provenance), **(dict(band) if band else {})}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(result: Result, path: str | Path, band: Mapping[str, float] | None = None) -> Path:
    """Write the Chrome trace of ``result`` to ``path`` (parent folders are created) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        # Compact separators: an 80-layer trace is a few MB and this keeps it small and fast to write.
        json.dump(chrome_trace(result, band), fh, separators=(",", ":"))
    return out
