"""What ``sosim tune`` searches: each system's own knobs (its ``TUNE_SPACE``, carried by the system in
sosim/schedules/registry.py) plus the knobs every system has, and the keys the tuner decides itself.

The tuner drops every knob whose key the scenario schema of this build does not have (so a table can name
knobs a later schema adds, and they switch on by themselves when it does), and every knob the chosen
implementation cannot express (the paper's ``ideal`` techniques are not DeepSpeed config keys: a tuner that
writes a DeepSpeed config must not recommend them for a DeepSpeed run). This module names no system; the
grids and why each range was chosen are with the systems (sosim/schedules/<system>_ds.py, tuning.py).
"""

from __future__ import annotations

from typing import Any

from sosim.schedules import registry
from sosim.schedules.blocks.tuning import Knob, fmt_onoff


def search_space(system: str) -> tuple[Knob, ...]:
    """The knobs of ``system`` (its registry entry's tuning space; none for an unknown name)."""
    entry = registry.SYSTEMS.get(system)
    return entry.tune_space if entry is not None else ()


def all_system_knobs() -> tuple[Knob, ...]:
    """Every system's knobs, in registry order (for labels)."""
    return tuple(k for s in registry.SYSTEMS.values() for k in s.tune_space)


# Searched for every system. Core binding is a launcher flag (deepspeed --bind_cores_to_rank), not a
# DeepSpeed config key: it matters only with several ranks on one host.
TRAINING_KNOBS: tuple[Knob, ...] = (
    Knob("training.activation_checkpointing", "ckpt", "activation checkpointing", (True, False), structural=True,
         memory=True, fmt=fmt_onoff),
    Knob("cluster.bind_cores_to_rank", "bind", "deepspeed --bind_cores_to_rank (launcher flag)", (False, True),
         min_dp=2, fmt=fmt_onoff),
)

# Keys the tuner itself decides (the batch split and the parallel split); never knobs of the table.
BATCH_KEYS = ("training.micro_batch", "training.grad_accum")
PARALLEL_KEYS = ("cluster.data_parallel", "cluster.sequence_parallel")
LABELS = {
    "training.micro_batch": "mb",
    "training.grad_accum": "ga",
    "cluster.data_parallel": "dp",
    "cluster.sequence_parallel": "sp",
}


def refine_values(knob: Knob, grid: list[Any], best: Any) -> list[Any]:
    """New values to try for a numeric knob whose best value so far is ``best`` among the tried ``grid``:
    the midpoints between ``best`` and its neighbours (linear or geometric), or, when ``best`` is at an end
    of the grid, one step further out (the same spacing), always inside the knob's bounds."""
    if knob.refine is None or isinstance(best, bool) or not isinstance(best, (int, float)):
        return []
    ordered = sorted({float(v) for v in grid})
    b = float(best)
    if b not in ordered or len(ordered) < 2:
        return []
    i = ordered.index(b)
    lo, hi = knob.bounds if knob.bounds is not None else (-float("inf"), float("inf"))
    geometric = knob.refine == "log"
    targets: list[float] = []
    for j in (i - 1, i + 1):
        if 0 <= j < len(ordered):
            other = ordered[j]
            use_log = geometric and b > 0 and other > 0
            targets.append((b * other) ** 0.5 if use_log else (b + other) / 2)
    if i == 0 or i == len(ordered) - 1:
        # At an end: step outwards by the spacing to the neighbour.
        other = ordered[1] if i == 0 else ordered[-2]
        use_log = geometric and b > 0 and other > 0
        targets.append(b * b / other if use_log else 2 * b - other)
    out: list[Any] = []
    for t in targets:
        value: Any = min(max(t, lo), hi)
        value = round(value) if knob.integer else float(f"{value:.6g}")
        if float(value) not in ordered and value not in out:
            out.append(value)
    return out
