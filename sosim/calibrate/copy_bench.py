"""Host<->device copies: pinned and pageable, each direction alone, and both directions at once."""

from __future__ import annotations

from typing import Any

from .records import Table
from .timing import gpu_times_s, repeats_for

MIB = 1 << 20


def copy_sizes_bytes(quick: bool) -> tuple[int, ...]:
    """1 MiB .. 1 GiB in powers of 4 (quick drops nothing: copies are cheap next to CPU Adam)."""
    del quick
    return tuple(MIB * 4**i for i in range(6))


def bench_copies(torch: Any, table: Table, quick: bool) -> None:
    for size_bytes in copy_sizes_bytes(quick):
        elements = size_bytes // 2  # bf16, the dtype offload schedules move most
        gpu_src = torch.randn(elements, device="cuda").to(torch.bfloat16)
        gpu_dst = torch.empty_like(gpu_src)
        # Why repeats by size: 1 GiB pageable copies take ~0.1 s each; small ones need many repeats.
        repeats = repeats_for(size_bytes / 5e9, budget_s=1.5, lo=5, hi=20 if quick else 50)
        for pinned in (True, False):
            host_src = torch.empty(elements, dtype=torch.bfloat16, pin_memory=pinned)
            host_src.copy_(gpu_src.cpu())  # real data, and touches every page before timing
            host_dst = torch.empty(elements, dtype=torch.bfloat16, pin_memory=pinned)
            host_dst.fill_(1.0)
            kind = "pinned" if pinned else "pageable"
            h2d_s, d2h_s = _one_way_times_s(torch, host_src, host_dst, gpu_src, gpu_dst, repeats)
            table.add("copy", f"h2d_{kind}", "bf16", h2d_s, bytes=size_bytes)
            table.add("copy", f"d2h_{kind}", "bf16", d2h_s, bytes=size_bytes)
            if pinned:
                h2d_s, d2h_s = _bidirectional_times_s(torch, host_src, host_dst, gpu_src, gpu_dst, repeats)
                table.add("copy", "bidir_pinned_h2d", "bf16", h2d_s, bytes=size_bytes)
                table.add("copy", "bidir_pinned_d2h", "bf16", d2h_s, bytes=size_bytes)


def _one_way_times_s(
    torch: Any, host_src: Any, host_dst: Any, gpu_src: Any, gpu_dst: Any, repeats: int
) -> tuple[list[float], list[float]]:
    """H2D alone, then D2H alone; non_blocking only matters for pinned memory (pageable stays synchronous)."""
    h2d_s = gpu_times_s(torch, lambda: gpu_dst.copy_(host_src, non_blocking=True), 2, repeats)
    d2h_s = gpu_times_s(torch, lambda: host_dst.copy_(gpu_src, non_blocking=True), 2, repeats)
    return h2d_s, d2h_s


def _bidirectional_times_s(
    torch: Any, host_src: Any, host_dst: Any, gpu_src: Any, gpu_dst: Any, repeats: int
) -> tuple[list[float], list[float]]:
    """Each direction's duration while both run at once, on two streams started together.

    Why both start from one event on the default stream: each side stream waits on it, so the two copies
    are released at the same instant and each stream's own event pair measures its direction.
    """
    up_stream, down_stream = torch.cuda.Stream(), torch.cuda.Stream()
    h2d_times_s: list[float] = []
    d2h_times_s: list[float] = []
    for index in range(repeats + 2):
        torch.cuda.synchronize()
        go = torch.cuda.Event()
        go.record()
        pairs = []
        for stream, action in (
            (up_stream, lambda: gpu_dst.copy_(host_src, non_blocking=True)),
            (down_stream, lambda: host_dst.copy_(gpu_src, non_blocking=True)),
        ):
            stream.wait_event(go)
            with torch.cuda.stream(stream):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                action()
                end.record(stream)
            pairs.append((start, end))
        torch.cuda.synchronize()
        if index >= 2:  # the first two rounds are warm-up
            h2d_times_s.append(pairs[0][0].elapsed_time(pairs[0][1]) / 1e3)
            d2h_times_s.append(pairs[1][0].elapsed_time(pairs[1][1]) / 1e3)
    return h2d_times_s, d2h_times_s
