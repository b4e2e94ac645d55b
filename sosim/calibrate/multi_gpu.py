"""Several GPUs of one host: NCCL collectives by message size (section ``nccl``) and what the GPUs' processes
take from each other on the shared host (section ``host_shared``: copies, DeepSpeed CPU Adam, CPU casts).

One spawned process per GPU, as DeepSpeed's launcher runs ranks. Rank 0's timings become rows; the ``gpus``
column says how many processes ran at once.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import queue
import random
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from .records import Table

KIB = 1 << 10
NCCL_OPS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def nccl_sizes_bytes(quick: bool) -> tuple[int, ...]:
    """1 KiB .. 1 GiB in powers of 4 (quick: powers of 16)."""
    step = 16 if quick else 4
    sizes = []
    size = KIB
    while size <= 1 << 30:
        sizes.append(size)
        size *= step
    return tuple(sizes)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: algorithm bandwidth x this = bytes each link carries per second."""
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    return (ranks - 1) / ranks


def run_ranks(
    target: Callable[..., None], ranks: int, kwargs: dict[str, Any], timeout_s: float, log: TextIO
) -> tuple[list[Any], str]:
    """Start ``ranks`` spawned processes ``target(rank, ranks, barrier, emit, **kwargs)``; rank 0's rows."""
    context = mp.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(ranks)
    port = random.randint(20000, 29999)
    children = [
        context.Process(target=_rank_main, args=(target, rank, ranks, port, barrier, results, kwargs))
        for rank in range(ranks)
    ]
    for child in children:
        child.start()
    rows: list[Any] = []
    done = 0
    problem = ""
    deadline_s = time.monotonic() + timeout_s
    while done < ranks:
        try:
            item = results.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline_s:
                problem = f"timed out after {timeout_s:.0f} s"
                break
            if not any(child.is_alive() for child in children):
                # A queue's feeder thread may still be flushing what the exited ranks put (Queue.empty() is
                # unreliable across processes): give it a grace period before declaring them lost.
                try:
                    item = results.get(timeout=5.0)
                except queue.Empty:
                    problem = problem or "ranks exited before finishing"
                    break
            else:
                continue
        kind, payload = item
        if kind == "done":
            done += 1
        elif kind == "error":
            problem = problem or str(payload).splitlines()[0]
            print(f"[calibrate] rank failed:\n{payload}", file=log, flush=True)
        elif kind == "log":
            print(f"[calibrate] {payload}", file=log, flush=True)
        else:
            rows.append(payload)
    for child in children:
        child.join(timeout=20)
        if child.is_alive():
            child.kill()
    return rows, problem


def _rank_main(
    target: Callable[..., None],
    rank: int,
    ranks: int,
    port: int,
    barrier: Any,
    results: Any,
    kwargs: dict[str, Any],
) -> None:
    import traceback

    from .isolate import die_with_parent

    die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks))
    try:
        target(
            rank,
            ranks,
            barrier,
            lambda row: results.put(("row", row)),
            lambda text: results.put(("log", text)),
            **kwargs,
        )
    except BaseException as error:  # report, then end the rank
        results.put(("error", f"rank {rank}: {type(error).__name__}: {error}\n{traceback.format_exc()}"))
        barrier.abort()
    finally:
        results.put(("done", rank))


# ---------------------------------------------------------------------------------------------- nccl


def bench_nccl(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    ranks = torch.cuda.device_count()
    if ranks < 2:
        raise RuntimeError(f"nccl needs at least 2 GPUs; {ranks} visible")
    rows, problem = run_ranks(nccl_rank, ranks, {"quick": quick}, timeout_s=240, log=log)
    for op, variant, dtype, times_s, shape in rows:
        table.add(op, variant, dtype, times_s, **shape)
    if problem:
        raise RuntimeError(problem)


def nccl_rank(rank: int, ranks: int, barrier: Any, emit: Any, say: Any, quick: bool) -> None:
    """torch.distributed collectives (the calls DeepSpeed's comm layer makes) on bf16 buffers, CUDA events
    per repeat after a barrier. ``bytes``: all_reduce / all_to_all the per-rank buffer; reduce_scatter its
    input and all_gather its output (the whole gathered tensor), as nccl-tests counts size."""
    import torch
    import torch.distributed as dist

    del barrier
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=ranks, device_id=torch.device("cuda", rank))
    for size_bytes in nccl_sizes_bytes(quick):
        elements = max(ranks, size_bytes // 2)
        elements -= elements % ranks
        full = torch.randn(elements, device="cuda").to(torch.bfloat16)
        part = torch.empty(elements // ranks, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(full)
        calls: dict[str, Callable[[], object]] = {
            "all_reduce": functools.partial(dist.all_reduce, full),
            "reduce_scatter": functools.partial(dist.reduce_scatter_tensor, part, full),
            "all_gather": functools.partial(dist.all_gather_into_tensor, out, part),
            "all_to_all": functools.partial(dist.all_to_all_single, out, full),
        }
        repeats = 20 if size_bytes <= 64 << 20 else 8
        for op in NCCL_OPS:
            call = calls[op]
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            times_s = []
            for _ in range(repeats):
                dist.barrier()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                times_s.append(start.elapsed_time(end) / 1e3)
            if rank == 0:
                emit(("nccl", op, "bf16", times_s, {"bytes": elements * 2, "gpus": ranks}))
                median_s = sorted(times_s)[len(times_s) // 2]
                if size_bytes >= 64 << 20:
                    say(
                        f"nccl {op} {elements * 2 / 2**20:.0f} MiB: bus "
                        f"{elements * 2 / median_s * bus_factor(op, ranks) / 1e9:.1f} GB/s"
                    )
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- host_shared

SHARED_COPY_BYTES: tuple[int, ...] = (64 << 20, 256 << 20)
SHARED_ADAM_ELEMENTS = 10**8


def bench_host_shared(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    ranks = min(2, torch.cuda.device_count())
    if ranks < 2:
        raise RuntimeError("host_shared needs 2 GPUs")
    cores = len(os.sched_getaffinity(0))
    problems = []
    for part in ("copy", "cpu"):
        rows, problem = run_ranks(
            host_shared_rank, ranks, {"quick": quick, "part": part, "cores": cores}, timeout_s=200, log=log
        )
        for op, variant, dtype, times_s, shape in rows:
            table.add(op, variant, dtype, times_s, **shape)
        if problem:
            problems.append(f"{part}: {problem}")
    if problems:
        raise RuntimeError("; ".join(problems))


def _lockstep(
    barrier: Any, active: bool, fn: Callable[[], object], repeats: int, sync: Callable[[], None]
) -> list[float]:
    """Every repeat starts on all ranks at once (barrier); inactive ranks only wait. Host wall clock."""
    times_s = []
    for index in range(repeats + 1):
        barrier.wait()
        start_s = time.perf_counter()
        if active:
            fn()
            sync()
        elapsed_s = time.perf_counter() - start_s
        if index > 0:  # the first round is warm-up
            times_s.append(elapsed_s)
    barrier.wait()
    return times_s


def host_shared_rank(
    rank: int, ranks: int, barrier: Any, emit: Any, say: Any, quick: bool, part: str, cores: int
) -> None:
    """``copy``: pinned and pageable H2D/D2H of 64 and 256 MiB, rank 0 alone (gpus=1) then every rank at once
    (gpus=2). ``cpu``: DeepSpeedCPUAdam.step() on 1e8 fp32 values and an fp32->bf16 host cast, one process at
    16 and at all cores (gpus=1), then every process at once with cores/ranks and with all cores each."""
    import torch

    torch.cuda.set_device(rank)
    sync = torch.cuda.synchronize
    if part == "copy":
        repeats = 6 if quick else 10
        for size_bytes in SHARED_COPY_BYTES:
            elements = size_bytes // 2
            gpu = torch.randn(elements, device="cuda").to(torch.bfloat16)
            for pinned in (True, False):
                host = torch.randn(elements).to(torch.bfloat16)
                if pinned:
                    host = host.pin_memory()
                kind = "pinned" if pinned else "pageable"
                for direction in ("h2d", "d2h"):

                    def copy(direction: str = direction, gpu: Any = gpu, host: Any = host) -> None:
                        if direction == "h2d":
                            gpu.copy_(host, non_blocking=True)
                        else:
                            host.copy_(gpu, non_blocking=True)

                    alone = _lockstep(barrier, rank == 0, copy, repeats, sync)
                    shared = _lockstep(barrier, True, copy, repeats, sync)
                    if rank == 0:
                        emit(("copy", f"{direction}_{kind}", "bf16", alone, {"bytes": size_bytes, "gpus": 1}))
                        emit(
                            ("copy", f"{direction}_{kind}_shared", "bf16", shared, {"bytes": size_bytes, "gpus": ranks})
                        )
                        say(
                            f"copy {direction}_{kind} {size_bytes >> 20} MiB: alone "
                            f"{size_bytes / sorted(alone)[len(alone) // 2] / 1e9:.1f} GB/s, {ranks} GPUs at once "
                            f"{size_bytes / sorted(shared)[len(shared) // 2] / 1e9:.1f} GB/s each"
                        )
        return
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from .cpu_bench import set_threads

    param = torch.nn.Parameter(torch.randn(SHARED_ADAM_ELEMENTS))
    param.grad = torch.randn(SHARED_ADAM_ELEMENTS) * 1e-3
    optimizer = DeepSpeedCPUAdam([param], lr=1e-4, adamw_mode=True)
    optimizer.step()
    fp32 = torch.randn(SHARED_ADAM_ELEMENTS)
    bf16 = torch.empty(SHARED_ADAM_ELEMENTS, dtype=torch.bfloat16)
    repeats = 4 if quick else 6
    no_sync: Callable[[], None] = lambda: None  # noqa: E731
    per_rank = max(1, cores // ranks)
    for threads in sorted({min(16, cores), cores}):
        set_threads(torch, threads)
        adam = _lockstep(barrier, rank == 0, optimizer.step, repeats, no_sync)
        cast = _lockstep(barrier, rank == 0, lambda: bf16.copy_(fp32), repeats, no_sync)
        if rank == 0:
            shape = {"elements": SHARED_ADAM_ELEMENTS, "threads": threads, "gpus": 1}
            emit(("cpu_adam", "deepspeed", "fp32", adam, shape))
            emit(("cast", "cpu_fp32_to_bf16", "fp32", cast, shape | {"bytes": SHARED_ADAM_ELEMENTS * 6}))
    for threads in sorted({per_rank, cores}):
        set_threads(torch, threads)
        adam = _lockstep(barrier, True, optimizer.step, repeats, no_sync)
        cast = _lockstep(barrier, True, lambda: bf16.copy_(fp32), repeats, no_sync)
        if rank == 0:
            shape = {"elements": SHARED_ADAM_ELEMENTS, "threads": threads, "gpus": ranks}
            emit(("cpu_adam", "deepspeed_shared", "fp32", adam, shape))
            emit(("cast", "cpu_fp32_to_bf16_shared", "fp32", cast, shape | {"bytes": SHARED_ADAM_ELEMENTS * 6}))
            say(
                f"cpu_adam 1e8: {ranks} processes x {threads} threads at once: "
                f"{sorted(adam)[len(adam) // 2]:.3f} s each"
            )
