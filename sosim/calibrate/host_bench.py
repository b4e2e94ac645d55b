"""Local disk with O_DIRECT (and DeepSpeed's aio op when it builds), and ZeRO++-style quantization on the GPU.

Sections ``disk`` and ``quantize``.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from .records import Table
from .timing import gpu_times_s

MIB = 1 << 20


def disk_plan(quick: bool) -> list[tuple[int, int]]:
    """(block bytes, queue depth = threads issuing blocks at once)."""
    plan = [(MIB, 1), (MIB, 4), (MIB, 16), (128 * 1024, 16), (8 * MIB, 4)]
    return plan[:3] if quick else plan


def disk_dir() -> Path:
    """Where the test file goes: SOSIM_DISK_DIR, else /var/tmp (on the root disk, unlike a tmpfs /tmp)."""
    return Path(os.environ.get("SOSIM_DISK_DIR", "/var/tmp"))


def split_blocks(total_blocks: int, workers: int) -> list[list[int]]:
    """Block indices per worker, round-robin, so each worker walks the file in order with a stride."""
    return [list(range(worker, total_blocks, workers)) for worker in range(workers)]


def _direct_pass(path: Path, block_bytes: int, depth: int, total_bytes: int, write: bool) -> float:
    """One O_DIRECT pass over the file with ``depth`` threads; returns seconds per block (amortized)."""
    flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_DIRECT
    blocks = total_bytes // block_bytes
    plan = split_blocks(blocks, depth)
    errors: list[BaseException] = []

    def worker(indices: list[int]) -> None:
        # Why an anonymous mmap: O_DIRECT needs a page-aligned buffer, and mmap memory is page-aligned.
        buffer = mmap.mmap(-1, block_bytes)
        if write:
            buffer.write(os.urandom(min(block_bytes, MIB)) * max(1, block_bytes // MIB))
        fd = os.open(path, flags)
        try:
            for index in indices:
                if write:
                    os.pwritev(fd, [buffer], index * block_bytes)
                else:
                    os.preadv(fd, [buffer], index * block_bytes)
        except BaseException as error:  # surfaced after join
            errors.append(error)
        finally:
            os.close(fd)
            buffer.close()

    threads = [threading.Thread(target=worker, args=(indices,)) for indices in plan]
    start_s = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed_s = time.perf_counter() - start_s
    if errors:
        raise errors[0]
    return elapsed_s / blocks


def bench_disk(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    del torch  # host only
    directory = disk_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sosim_disk_test.bin"
    total_bytes = (512 if quick else 1024) * MIB
    passes = 3
    try:
        # Lay the file out once (buffered), then flush it so O_DIRECT reads hit the disk, not the cache.
        with path.open("wb") as handle:
            chunk = os.urandom(MIB)
            for _ in range(total_bytes // MIB):
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        for block_bytes, depth in disk_plan(quick):
            for write in (False, True):
                times_s = [_direct_pass(path, block_bytes, depth, total_bytes, write) for _ in range(passes)]
                variant = "write_direct" if write else "read_direct"
                table.add("disk", variant, "bytes", times_s, bytes=block_bytes, threads=depth)
                print(
                    f"[calibrate] disk {variant} {block_bytes // 1024} KiB qd{depth}: "
                    f"{block_bytes / sorted(times_s)[len(times_s) // 2] / 1e9:.2f} GB/s",
                    file=log,
                    flush=True,
                )
        _bench_deepspeed_aio(table, path, total_bytes, quick, log)
    finally:
        path.unlink(missing_ok=True)


def _bench_deepspeed_aio(table: Table, path: Path, total_bytes: int, quick: bool, log: TextIO) -> None:
    """DeepSpeed's async_io op (libaio), as ZeRO-Infinity's swapper uses it, when it is compatible here."""
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder

        builder = AsyncIOBuilder()
        if not builder.is_compatible(verbose=False):
            print("[calibrate] disk: DeepSpeed async_io not compatible here (libaio missing); skipped", file=log)
            return
        aio = builder.load(verbose=False)
    except Exception as error:  # not built here: the O_DIRECT rows stand alone
        print(f"[calibrate] disk: DeepSpeed async_io unavailable: {type(error).__name__}: {error}", file=log)
        return
    import torch

    for block_bytes, depth in [(MIB, 8), (MIB, 32)][: 1 if quick else 2]:
        handle = aio.aio_handle(block_bytes, depth, False, False, 1)
        buffer = handle.new_cpu_locked_tensor(total_bytes, torch.empty(0, dtype=torch.uint8))
        for variant in ("aio_read", "aio_write"):
            times_s = []
            for _ in range(3):
                start_s = time.perf_counter()
                if variant == "aio_read":
                    handle.sync_pread(buffer, str(path))
                else:
                    handle.sync_pwrite(buffer, str(path))
                times_s.append((time.perf_counter() - start_s) / (total_bytes // block_bytes))
            table.add("disk", variant, "bytes", times_s, bytes=block_bytes, threads=depth)
        handle.free_cpu_locked_tensor(buffer)


# ---------------------------------------------------------------------------------------------- quantize

QUANT_GROUP = 4096  # elements per scale; DeepSpeed's CUDAQuantizer aims at 4k-8k (target_group_size 8000)


def quantize_int(torch: Any, x: Any, bits: int) -> tuple[Any, Any]:
    """Symmetric per-group quantization of a flat bf16 tensor to int8, or to int4 packed two per byte."""
    groups = x.view(-1, QUANT_GROUP).float()
    top = float(2 ** (bits - 1) - 1)
    scale = groups.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / top
    q = (groups / scale).round_().clamp_(-top, top).to(torch.int8)
    if bits == 4:
        q = ((q[:, 0::2] & 0x0F) | (q[:, 1::2] << 4)).to(torch.uint8)
    return q, scale


def dequantize_int(torch: Any, q: Any, scale: Any, bits: int) -> Any:
    if bits == 4:
        low = (q.to(torch.int16) << 12 >> 12).to(torch.int8)  # sign-extend the low nibble
        high = (q.to(torch.int16) << 8 >> 12).to(torch.int8)
        q = torch.stack((low, high), dim=-1).view(q.shape[0], -1)
    return (q.float() * scale).to(torch.bfloat16).view(-1)


def bench_quantize(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    """int8 weights (ZeRO++ qwZ) and int4 gradients (qgZ), quantize and dequantize, torch implementation.

    Why torch and not DeepSpeed's quantizer op: the op is a CUDA JIT build (several .cu files) that would run
    while the CPU-sensitive sections do; the dtype column says 'bf16-torchimpl' so no reader mistakes it.
    """
    del log
    sizes = (10**6, 10**7, 10**8) if not quick else (10**7, 10**8)
    for elements in sizes:
        elements -= elements % (2 * QUANT_GROUP)
        x = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
        for bits, variant in ((8, "int8_weights"), (4, "int4_grads")):
            q, scale = quantize_int(torch, x, bits)
            back = dequantize_int(torch, q, scale, bits)
            error = float((back.float() - x.float()).norm() / x.float().norm())
            if not error < (0.02 if bits == 8 else 0.3):
                raise RuntimeError(f"quantize {variant}: relative error {error:.3g} too large; not timed")
            quant_s = gpu_times_s(torch, functools.partial(quantize_int, torch, x, bits), 3, 15)
            dequant_s = gpu_times_s(torch, functools.partial(dequantize_int, torch, q, scale, bits), 3, 15)
            shape = {"elements": elements, "bytes": elements * 2}
            table.add("quantize", variant, "bf16-torchimpl", quant_s, **shape)
            table.add("quantize", f"{variant}_dequant", "bf16-torchimpl", dequant_s, **shape)
