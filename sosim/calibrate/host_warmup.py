"""Section ``host_warmup``: touch a large share of host memory once before any host-side timing.

Why: on a freshly started virtual machine (the lent H200 machines are Firecracker microVMs) the first touch of
a guest page is slower than touching a page the guest has used before: on the 2026-12-01 second lease, 2 GiB
took 0.26 s to allocate and fill the first time and 0.09 s after being freed (rows ``host_mem / first_touch``
and ``host_mem / retouch``; calibration/nvidia-h200-2026-12-01/lease-b-cold-warm). Running this first keeps
that start-up cost out of every later host section. What it did NOT explain: the first lease's slow
``ds_refresh`` rows (36-77% slower than earlier leases while its own DeepSpeed steps refreshed as fast as
before): on the second lease the refresh rows timed before and after this warm-up agree (median ratio ~1.0),
so that outlier's cause is not established (docs/calibrate-your-machine.md). The rows are a record; the
simulator reads no ``host_mem`` row.
"""

from __future__ import annotations

import time
from typing import Any

from .machine import host_memory_bytes
from .records import Table

GIB = 1 << 30
CHUNK_BYTES = 2 * GIB


def warmup_bytes(mem_total_bytes: int | None, cap_gib: int = 64) -> int:
    """How much to touch: 40% of the host's memory, at most ``cap_gib`` GiB, in whole chunks (>= one chunk)."""
    if not mem_total_bytes:
        return CHUNK_BYTES
    share = min(int(mem_total_bytes * 0.4), cap_gib * GIB)
    return max(CHUNK_BYTES, share // CHUNK_BYTES * CHUNK_BYTES)


def bench_host_warmup(torch: Any, table: Table, quick: bool) -> None:
    total = warmup_bytes(host_memory_bytes(), cap_gib=48 if quick else 64)
    chunks: list[Any] = []
    first_s: list[float] = []
    for _ in range(total // CHUNK_BYTES):
        start_s = time.perf_counter()
        chunk = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
        chunk.fill_(1)
        first_s.append(time.perf_counter() - start_s)
        chunks.append(chunk)
    table.add("host_mem", "first_touch", "uint8", first_s, bytes=CHUNK_BYTES)
    chunks.clear()
    again_s: list[float] = []
    for _ in range(min(4, total // CHUNK_BYTES)):
        start_s = time.perf_counter()
        chunk = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
        chunk.fill_(1)
        again_s.append(time.perf_counter() - start_s)
        del chunk
    table.add("host_mem", "retouch", "uint8", again_s, bytes=CHUNK_BYTES)
