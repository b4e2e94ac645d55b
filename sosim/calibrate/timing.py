"""Repeat-and-time helpers: CUDA events for GPU work, perf_counter for CPU work."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def gpu_times_s(torch: Any, fn: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Time ``fn`` on the current CUDA stream, one event pair per repeat.

    Why one pair per repeat rather than one around a loop: we want the spread (p10/p90), not only a mean.
    Why synchronize before the first event: queued warm-up work must not leak into the first timing.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends, strict=True)]


def cpu_times_s(fn: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Time a host-only function with the monotonic high-resolution clock."""
    for _ in range(warmup):
        fn()
    times_s: list[float] = []
    for _ in range(repeats):
        start_s = time.perf_counter()
        fn()
        times_s.append(time.perf_counter() - start_s)
    return times_s


def repeats_for(estimate_s: float, budget_s: float, lo: int, hi: int) -> int:
    """How many repeats fit a time budget, clamped to [lo, hi]; keeps big sizes from eating the run."""
    if estimate_s <= 0:
        return hi
    return max(lo, min(hi, int(budget_s / estimate_s)))


def wall_times_s(
    fn: Callable[[], object], warmup: int, repeats: int, sync: Callable[[], None] | None = None
) -> list[float]:
    """Host wall-clock time of ``fn`` with an optional device synchronisation before and after each repeat.

    Why wall clock and not CUDA events: the DeepSpeed patterns timed with this (blocking pageable copies,
    hooks that run on the host while the GPU waits) are host-bound; their cost is how long the training
    thread is held, including the device work it waits for.
    """
    for _ in range(warmup):
        fn()
    times_s: list[float] = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start_s = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times_s.append(time.perf_counter() - start_s)
    return times_s
