"""What ``sosim tune`` may move, as data each system carries: :class:`Knob`, and the knobs systems share.

A knob is a scenario key path with a coarse grid of values. Each system lists its own knobs as its
``TUNE_SPACE`` (registered with the system in sosim/schedules/registry.py); sosim.answers.tune.space adds the knobs
every system has (checkpointing, core binding) and the batch and parallel splits the tuner decides itself.

The grids are search ranges, not physical constants. Why each shared range:

* ``sub_group_elements`` (``sub_group_size``): 1e8 to 2e9 around DeepSpeed's default 1e9 and the artifact's 6e8.
* ``bucket_mb`` (``reduce_bucket_size`` x 2 B): 50 MB to DeepSpeed's default 1000 MB.
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


def fmt_float(v: Any) -> str:
    return f"{float(v):.3g}"


def fmt_elements(v: Any) -> str:
    return f"{float(v):.2g}".replace("e+0", "e").replace("e+", "e")


def fmt_onoff(v: Any) -> str:
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
    # Words for a value that depend on the data-parallel degree (replaces "short fmt(value)" when given).
    text_dp: Callable[[Any, int], str] | None = None

    def text(self, value: Any, dp: int = 1) -> str:
        if self.text_dp is not None:
            return self.text_dp(value, dp)
        return f"{self.short} {self.fmt(value)}"

    def values_for(self, dp: int) -> tuple[Any, ...]:
        return self.dp_values(dp) if self.dp_values is not None else self.values

    def applies(self, dp: int) -> bool:
        return dp >= self.min_dp


SUB_GROUP = Knob(
    "schedule.sub_group_elements", "sub_group", "optimizer sub-group size (sub_group_size, elements)",
    (1e8, 2e8, 4e8, 6e8, 1e9, 2e9), refine="log", bounds=(1e7, 4e9), integer=True, memory=True, fmt=fmt_elements)
BUCKET = Knob(
    "schedule.bucket_mb", "bucket_MB", "gradient bucket (reduce_bucket_size x 2 B, MB)",
    (50.0, 200.0, 500.0, 1000.0), refine="log", bounds=(10.0, 4000.0), memory=True, fmt=fmt_float)
OVERLAP = Knob("schedule.overlap_comm", "overlap", "overlap_comm", (True, False), fmt=fmt_onoff)
PREFETCH = Knob("schedule.prefetch_layers", "prefetch", "layers of parameters prefetched", (0, 1, 2, 4),
                refine="linear", bounds=(0, 16), integer=True, memory=True)


def fmt_threads(v: Any) -> str:
    return "launcher default" if v is None else str(v)


# OMP_NUM_THREADS per rank for the systems whose CPU Adam runs on torch's intra-op threads (FSDP2, Megatron):
# torchrun's default with several processes per node is 1 (torch/distributed/run.py); prime-rl PR 3248 raises
# it to the rank's share of the cores. Searched only with several ranks (one rank keeps torch's default).
OMP_THREADS = Knob("cluster.cpu_threads_per_rank", "omp", "OMP_NUM_THREADS per rank", (None, 2, 4, 8, 16, 32),
                   min_dp=2, fmt=fmt_threads)
