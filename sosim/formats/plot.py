"""matplotlib figures of results: a Gantt timeline of the steady-state step, the step-time breakdown, and a
comparison bar chart.

matplotlib is imported inside the functions (``import sosim`` stays light) and figures are built with
``matplotlib.figure.Figure`` rather than pyplot, so no global pyplot state or interactive backend is
touched: saving goes through the Agg canvas. The ``draw_*`` functions take an Axes, so notebooks can
place them in their own pyplot figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sosim.formats.trace import resource_label, resource_order
from sosim.run.result import BREAKDOWN_KEYS, Result

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One colour per op category (Gantt) and per breakdown bucket; the exposed buckets reuse the colour of
# the resource category they blame so that the two panels read together.
CATEGORY_COLORS: dict[str, str] = {
    "compute": "#4c72b0",
    "optimizer": "#dd8452",
    "transfer": "#55a868",
    "cast": "#c44e52",
    "comm": "#8172b3",
    "sync": "#937860",
    "framework": "#da8bc3",
}
BREAKDOWN_COLORS: dict[str, str] = {
    "gpu_compute_s": "#4c72b0",
    "gpu_other_s": "#8fa8d6",
    "exposed_cpu_optimizer_s": "#dd8452",
    "exposed_stage3_hooks_s": "#da8bc3",
    "exposed_cpu_cast_s": "#c44e52",
    "exposed_d2h_s": "#55a868",
    "exposed_h2d_s": "#8cc79a",
    "exposed_comm_s": "#8172b3",
    "exposed_nvme_s": "#937860",
    "idle_s": "#bbbbbb",
}
FALLBACK_COLOR = "#999999"


def _label(key: str) -> str:
    return key.removesuffix("_s").replace("_", " ")


def time_unit(span_s: float) -> tuple[float, str]:
    """(factor from seconds, unit name) that keeps tick labels short: 1M-token steps last minutes, tiny
    test scenarios microseconds."""
    if span_s >= 10:
        return 1.0, "s"
    if span_s >= 10e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def draw_timeline(ax: Axes, result: Result, window_s: tuple[float, float] | None = None) -> None:
    """Gantt chart of ``window_s`` (default: the steady-state step), one row per resource."""
    t0, t1 = window_s if window_s is not None else result.steady_window_s
    scale, unit = time_unit(t1 - t0)
    spans = result.spans
    keep = (spans["end_s"] > t0) & (spans["start_s"] < t1) & (spans["end_s"] > spans["start_s"])
    spans = spans[keep]
    rows = resource_order(list(result.plan.resources))
    start = (np.clip(spans["start_s"].to_numpy(), t0, t1) - t0) * scale
    end = (np.clip(spans["end_s"].to_numpy(), t0, t1) - t0) * scale
    res = spans["resource"].to_numpy()
    cat = spans["category"].to_numpy()
    seen: set[str] = set()
    for y, resource in enumerate(rows):
        on_row = res == resource.label
        for category in sorted(set(cat[on_row])):
            sel = on_row & (cat == category)
            bars = list(zip(start[sel], end[sel] - start[sel]))
            # One broken_barh call per (row, category) instead of one bar per op: 80-layer steps stay fast.
            # The edge in the face colour keeps sub-pixel ops (a cast in a minutes-long step) visible as hairlines.
            color = CATEGORY_COLORS.get(category, FALLBACK_COLOR)
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolor=color, linewidth=0.5,
                           label=category if category not in seen else None)
            seen.add(category)
    ax.set_yticks(range(len(rows)), [resource_label(r) for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) * scale)
    ax.set_xlabel(f"time in the steady-state step ({unit})")
    if seen:
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small", title="op category")


def draw_breakdown(ax: Axes, results: Sequence[Result], labels: Sequence[str] | None = None) -> None:
    """Horizontal stacked bars: where each result's step time goes (seconds, buckets sum to the step)."""
    names = list(labels) if labels is not None else [r.scenario.name for r in results]
    left = np.zeros(len(results))
    for key in BREAKDOWN_KEYS:
        widths = np.array([float(r.metrics[key]) for r in results])
        if not widths.any():
            continue
        ax.barh(names, widths, left=left, color=BREAKDOWN_COLORS.get(key, FALLBACK_COLOR), label=_label(key))
        left += widths
    ax.invert_yaxis()
    ax.set_xlabel("step time (s)")
    # Outside the axes: the bars fill the plot, an inside legend would hide the buckets it names.
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small")


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


def result_figure(result: Result, band: Mapping[str, float] | None = None) -> Figure:
    """Timeline of the steady-state step above its breakdown; ``band`` (sosim.answers.bands metrics): the p10-p90 of
    the step shaded on the timeline and named in the title."""
    from matplotlib.figure import Figure

    rows = len(result.plan.resources)
    fig = Figure(figsize=(12, 2.2 + 0.45 * rows + 1.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[max(rows, 2), 1.3])
    draw_timeline(top, result)
    m = result.metrics
    sc = result.scenario
    scale, unit = time_unit(m["step_time_s"])
    top.set_title(f"{sc.name}: {sc.schedule.system} on {sc.hardware.name} — "
                  f"step {m['step_time_s'] * scale:.4g} {unit}, {m['tokens_per_s']:,.0f} tokens/s, MFU {m['mfu']:.1%}"
                  + (f" (band p10-p90 {band['step_time_s_p10'] * scale:.4g}-"
                     f"{band['step_time_s_p90'] * scale:.4g} {unit})" if band else "")
                  + ("" if m["feasible"] else "  [INFEASIBLE: out of memory]"))
    if band:
        lo, hi = band["step_time_s_p10"] * scale, band["step_time_s_p90"] * scale
        top.axvspan(lo, hi, color=FALLBACK_COLOR, alpha=0.2, label="step p10-p90")
        top.set_xlim(0, max(top.get_xlim()[1], hi))
    draw_breakdown(bottom, [result], ["breakdown"])
    return fig


def plot_result(result: Result, path: str | Path, band: Mapping[str, float] | None = None) -> Path:
    """Write the timeline + breakdown figure of ``result`` to ``path`` (format from the suffix)."""
    return _save(result_figure(result, band), path)


def compare_figure(results: Sequence[Result], labels: Sequence[str] | None = None) -> Figure:
    """Tokens/s per result (left) and each step-time breakdown (right)."""
    from matplotlib.figure import Figure

    names = list(labels) if labels is not None else [r.scenario.name for r in results]
    fig = Figure(figsize=(13, 1.2 + 0.55 * len(results)), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    tps = [float(r.metrics["tokens_per_s"]) for r in results]
    colors = [CATEGORY_COLORS["compute"] if r.metrics["feasible"] else FALLBACK_COLOR for r in results]
    left.barh(names, tps, color=colors)
    base = tps[0] if tps and tps[0] > 0 else None
    for y, v in enumerate(tps):
        text = f" {v:,.0f}" + (f" ({v / base:.2f}x)" if base else "")
        left.text(v, y, text, va="center", fontsize="small")
    left.invert_yaxis()
    left.set_xlabel("tokens/s (grey: infeasible)")
    left.margins(x=0.35)
    draw_breakdown(right, results, names)
    right.set_yticks(range(len(names)), [""] * len(names))
    return fig


def plot_compare(results: Sequence[Result], path: str | Path, labels: Sequence[str] | None = None) -> Path:
    """Write the comparison bar chart of ``results`` to ``path``."""
    return _save(compare_figure(results, labels), path)
