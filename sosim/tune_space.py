"""What ``sosim tune`` searches: one declarative table of knobs per system.

A knob is a scenario key path with a coarse grid of values. Adding a system or a knob is one entry here;
the tuner drops every entry whose key the scenario schema of this build does not have (so a table can name
knobs a later schema adds, e.g. the ZeRO++ switches, and they switch on by themselves when it does), and
every entry the chosen implementation cannot express (the paper's ``ideal`` techniques are not DeepSpeed
config keys: a tuner that writes a DeepSpeed config must not recommend them for a DeepSpeed run).

The grids are search ranges, not physical constants. Why each range:

* ``gpu_optimizer_fraction`` (1 - DeepSpeed ``offload_optimizer.ratio``): 0 (DeepSpeed's default ratio 1.0)
  to 1 (nothing offloaded); the SuperOffload artifact runs 0.01-0.1 (ratio 0.9-0.99) and NeMo-RL issue 3628
  measured 0-100%.
* ``sub_group_elements`` (``sub_group_size``): 1e8 to 2e9 around DeepSpeed's default 1e9 and the artifact's 6e8.
* ``cpu_adam_core_fraction`` (``cpuadam_cores_perc``): 0.5 to 1.0 around DeepSpeed's default 0.8.
* ``bucket_mb`` (``reduce_bucket_size`` x 2 B): 50 MB to DeepSpeed's default 1000 MB; the paper's 64 MB
  transfer buckets for the ideal SuperOffload schedule.
* ``prefetch_layers`` (``stage3_prefetch_bucket_size`` in layers): 0 to 4 layers ahead.

Numeric knobs marked ``refine`` are refined between the neighbours of the best coarse value (linear or
logarithmic midpoints) after the coarse search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

BOTH = frozenset({"ideal", "deepspeed"})
IDEAL_ONLY = frozenset({"ideal"})


def _fmt_float(v: Any) -> str:
    return f"{float(v):.3g}"


def _fmt_elements(v: Any) -> str:
    return f"{float(v):.2g}".replace("e+0", "e").replace("e+", "e")


def _fmt_ratio(v: Any) -> str:
    # Shown as DeepSpeed's ratio (share of sub-groups updated on the CPU), which is what users set.
    return f"{1.0 - float(v):.3g}"


def _fmt_onoff(v: Any) -> str:
    return "on" if v else "off"


@dataclass(frozen=True)
class Knob:
    """One searched scenario key.

    ``structural`` knobs change what lives where (memory on each side, the plan's shape): they are crossed
    in the first, exhaustive stage. The others are tuned by coordinate descent from the best structural
    points. ``memory`` marks knobs that change the memory footprint (on either side): a structural point that
    does not fit with the defaults is tried with other values of these knobs (fewest changes first) before it
    is given up; e.g. a larger SuperOffload GPU share frees host memory, a smaller one frees HBM.
    """

    key: str  # dotted scenario key, e.g. "schedule.gpu_optimizer_fraction"
    short: str  # column label, e.g. "ratio"
    label: str  # words, e.g. "SuperOffload ratio (share of sub-groups updated on the CPU)"
    values: tuple[Any, ...]
    implementations: frozenset[str] = BOTH
    structural: bool = False
    refine: Literal["linear", "log"] | None = None
    bounds: tuple[float, float] | None = None  # refine never leaves these
    integer: bool = False
    memory: bool = False
    min_dp: int = 1  # only searched with at least this many data-parallel ranks (ZeRO++ and the like)
    fmt: Callable[[Any], str] = field(default=str)
    # Values that depend on the data-parallel degree (replaces ``values`` when given).
    dp_values: Callable[[int], tuple[Any, ...]] | None = None
    # Among configurations that score the same, prefer this knob's earlier values (e.g. the lower ZeRO stage,
    # whose extra collectives the gpu_only schedule does not model).
    prefer_first: bool = False

    def text(self, value: Any) -> str:
        return f"{self.short} {self.fmt(value)}"

    def values_for(self, dp: int) -> tuple[Any, ...]:
        return self.dp_values(dp) if self.dp_values is not None else self.values

    def applies(self, dp: int) -> bool:
        return dp >= self.min_dp


_GPU_FRACTION = Knob(
    "schedule.gpu_optimizer_fraction", "ratio", "SuperOffload ratio (share of sub-groups updated on the CPU)",
    (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0), refine="linear", bounds=(0.0, 1.0), memory=True, fmt=_fmt_ratio)
_SUB_GROUP = Knob(
    "schedule.sub_group_elements", "sub_group", "optimizer sub-group size (sub_group_size, elements)",
    (1e8, 2e8, 4e8, 6e8, 1e9, 2e9), refine="log", bounds=(1e7, 4e9), integer=True, memory=True, fmt=_fmt_elements)
_CORES = Knob(
    "schedule.cpu_adam_core_fraction", "cores", "CPU Adam core fraction (cpuadam_cores_perc)",
    (0.5, 0.65, 0.8, 0.9, 1.0), refine="linear", bounds=(0.05, 1.0), fmt=_fmt_float)
_BUCKET = Knob(
    "schedule.bucket_mb", "bucket_MB", "gradient bucket (reduce_bucket_size x 2 B, MB)",
    (50.0, 200.0, 500.0, 1000.0), refine="log", bounds=(10.0, 4000.0), memory=True, fmt=_fmt_float)
_OVERLAP = Knob("schedule.overlap_comm", "overlap", "overlap_comm", (True, False), fmt=_fmt_onoff)
_PLACEMENT = Knob(
    "schedule.weight_placement", "weights", "weight placement (stationary in HBM, or flow from CPU memory)",
    ("stationary", "flow"), structural=True)
_CAST = Knob("schedule.cast", "cast", "where fp32<->bf16 casts run (paper: GPU)", ("gpu", "cpu"),
             implementations=IDEAL_ONLY)
_SO_BUCKET = Knob(
    "schedule.bucket_mb", "bucket_MB", "SuperOffload transfer bucket (MB)", (16.0, 64.0, 256.0, 1000.0),
    implementations=IDEAL_ONLY, refine="log", bounds=(4.0, 4000.0), memory=True, fmt=_fmt_float)
_DPU = Knob("schedule.dpu", "dpu", "delayed parameter update", (False, True), implementations=IDEAL_ONLY,
            fmt=_fmt_onoff)
_PREFETCH = Knob("schedule.prefetch_layers", "prefetch", "layers of parameters prefetched", (0, 1, 2, 4),
                 refine="linear", bounds=(0, 16), integer=True, memory=True)
# ZeRO++ (DeepSpeed zero_quantized_weights / zero_quantized_gradients / zero_hpz_partition_size): only with
# data parallelism; knobs of the `zero3` system (ZeRO-3 without offload, sosim/schedules/zero3.py).
_QW = Knob("schedule.zero_quantized_weights", "qwZ", "ZeRO++ quantized weights (qwZ)", (False, True), min_dp=2,
           fmt=_fmt_onoff)
_QG = Knob("schedule.zero_quantized_gradients", "qgZ", "ZeRO++ quantized gradients (qgZ)", (False, True), min_dp=2,
           fmt=_fmt_onoff)
_HPZ = Knob("schedule.zero_hpz_partition_size", "hpZ", "ZeRO++ secondary partition size (hpZ)", (1, 2, 4, 8),
            min_dp=2, integer=True, structural=True, memory=True)
_ZEROPP = (_QW, _QG, _HPZ)


def _zero_stage_state(dp: int) -> tuple[float, ...]:
    """Model state per parameter per GPU of ZeRO stages 0-3 without offload on ``dp`` ranks (bf16 params and
    grads + fp32 master, m, v = 16 B/param; stage 1 partitions the 12 B of optimizer state, stage 2 also the
    gradients, stage 3 everything; ZeRO paper, Rajbhandari et al. SC'20, Fig. 1). The same arithmetic as
    sosim.dsconfig's stage mapping."""
    seen: list[float] = []
    for v in (16.0, 4.0 + 12.0 / dp, 2.0 + 14.0 / dp, 16.0 / dp):
        if not any(abs(v - s) < 1e-9 for s in seen):
            seen.append(v)
    return tuple(seen)


_STATE = Knob("schedule.state_bytes_per_param", "state_B", "model state per parameter (ZeRO stage without offload)",
              (16.0,), structural=True, dp_values=_zero_stage_state, fmt=_fmt_float, prefer_first=True)


def zero_stage_of(state_bytes: float, dp: int) -> int | None:
    """The ZeRO stage (0-3, lowest first) whose model state per GPU is ``state_bytes`` on ``dp`` ranks."""
    for stage, v in enumerate((16.0, 4.0 + 12.0 / dp, 2.0 + 14.0 / dp, 16.0 / dp)):
        if abs(v - state_bytes) < 1e-9:
            return stage
    return None

# Searched for every system. Core binding is a launcher flag (deepspeed --bind_cores_to_rank), not a
# DeepSpeed config key: it matters only with several ranks on one host.
TRAINING_KNOBS: tuple[Knob, ...] = (
    Knob("training.activation_checkpointing", "ckpt", "activation checkpointing", (True, False), structural=True,
         memory=True, fmt=_fmt_onoff),
    Knob("cluster.bind_cores_to_rank", "bind", "deepspeed --bind_cores_to_rank (launcher flag)", (False, True),
         min_dp=2, fmt=_fmt_onoff),
)

# One entry per system; a system of the schema that is missing here is searched over the training knobs,
# the batch split and the parallel split only (its own knobs at their defaults).
SEARCH_SPACE: dict[str, tuple[Knob, ...]] = {
    "gpu_only": (_STATE,),
    "zero_offload": (_BUCKET, _OVERLAP, _DPU),
    "zero3_offload": (_SUB_GROUP, _OVERLAP),
    "zero_infinity": (_SUB_GROUP, _PREFETCH, _OVERLAP),
    "superoffload": (_PLACEMENT, _GPU_FRACTION, _SUB_GROUP, _CORES, _CAST, _SO_BUCKET, _OVERLAP),
    "zero3": _ZEROPP,
}

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
