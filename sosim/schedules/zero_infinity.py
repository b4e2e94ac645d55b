"""ZeRO-Infinity (CPU variant): ZeRO-3 with the optimizer *and* the bf16 parameters offloaded.

Parameters live in CPU memory and are streamed to the GPU one layer ahead of use (``prefetch_layers``),
in forward and again in backward; gradients go back per sub-group; Adam runs on the CPU after backward
and rewrites the CPU-resident bf16 copy (CPU-side cast). GPU memory holds only the working set, so the
model size is bounded by CPU memory; every step moves the weights over the link twice.
"""

from __future__ import annotations

from sosim.config import Scenario, ZeroInfinitySchedule
from sosim.schedules import stage3


def strategy(sc: Scenario) -> stage3.Stage3Strategy:
    assert isinstance(sc.schedule, ZeroInfinitySchedule)
    return stage3.zero3_strategy("zero_infinity", sc.schedule, weight_flow=True)
