"""Grace only (section ``c2c_access``): copies that NVLink-C2C's coherence makes possible on a GH200.

Run only where :func:`sosim.calibrate.platform_detect.plan_for` selects it (a Grace superchip): on a PCIe host
a GPU kernel that dereferences ordinary ``malloc`` memory faults, so this section is never run there.

Variants (bytes = one bf16 buffer; rows ``op=copy``, so the simulator's copy lookups read them like any copy):

* ``h2d_sysmem`` / ``d2h_sysmem``: ``copy_`` between a pageable (system-allocated) CPU tensor and the GPU.
  On a PCIe host this is the staged pageable copy; on Grace the driver can move it over C2C directly.
* ``gpu_read_sysmem`` / ``gpu_write_sysmem``: a GPU copy kernel whose source (destination) *is* the host
  buffer, reached through the coherent link with no staging (the system-allocated access that DeepSpeed's
  SuperOffload relies on for Grace: arXiv 2509.21271, "Superchip-aware casting"). The host buffer is handed
  to torch as a CUDA array (``__cuda_array_interface__`` with the host pointer), which only an
  address-translation-capable (ATS) system such as Grace Hopper accepts.
"""

from __future__ import annotations

import functools
from typing import Any

from .records import Table
from .timing import gpu_times_s, repeats_for

MIB = 1 << 20


class _HostAsCuda:
    """A host buffer presented to torch as CUDA memory (valid on ATS systems only)."""

    def __init__(self, host: Any) -> None:
        self.__cuda_array_interface__ = {
            "shape": (host.numel(),),
            "typestr": "<i2",  # bf16 has no typestr: the bytes are moved as int16
            "data": (host.data_ptr(), False),
            "version": 3,
        }


def bench_c2c_access(torch: Any, table: Table, quick: bool) -> None:
    sizes = (16 * MIB, 256 * MIB) if quick else (4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB)
    for size_bytes in sizes:
        _one_size(torch, table, size_bytes)


def _one_size(torch: Any, table: Table, size_bytes: int) -> None:
    """All four variants at one size (one function per size, so every timed callable binds its own buffers)."""
    gpu = torch.randn(size_bytes // 2, device="cuda").to(torch.bfloat16)
    host = gpu.cpu()  # pageable: system-allocated memory
    repeats = repeats_for(size_bytes / 100e9, budget_s=1.0, lo=5, hi=20)
    table.add("copy", "h2d_sysmem", "bf16", gpu_times_s(torch, functools.partial(gpu.copy_, host), 2, repeats),
              bytes=size_bytes)
    table.add("copy", "d2h_sysmem", "bf16", gpu_times_s(torch, functools.partial(host.copy_, gpu), 2, repeats),
              bytes=size_bytes)
    alias = torch.as_tensor(_HostAsCuda(host.view(torch.int16)), device="cuda")
    gpu_bits = gpu.view(torch.int16)
    table.add("copy", "gpu_read_sysmem", "bf16",
              gpu_times_s(torch, functools.partial(gpu_bits.copy_, alias), 2, repeats), bytes=size_bytes)
    table.add("copy", "gpu_write_sysmem", "bf16",
              gpu_times_s(torch, functools.partial(alias.copy_, gpu_bits), 2, repeats), bytes=size_bytes)
