"""SuperOffload's gradient flush as DeepSpeed 0.19.8 runs it (section ``so_grads``).

``deepspeed/runtime/superoffload/superoffload_stage3.py`` ``partition_grads`` walks the flushed parameters one
by one: copy the bf16 gradient non-blocking into the host bf16 buffer (``grad_partitions_flat_buffer``,
pinned), copy that slice back to the GPU, take its norm (``_constant_buffered_norm2``), cast it to fp32 on
the GPU and ``copy_(..., non_blocking=True)`` it into the sub-group's fp32 host gradient. That fp32 gradient
has been handed to the Adam worker through a ``torch.multiprocessing`` queue, which moved its storage into
shared memory: not pinned, so each per-parameter copy is a pageable D2H that returns only when done, and the
host waits for the stream at the end of the flush (``current_stream().synchronize()``).

The harness's ``copy`` rows copy one large block into private pageable memory; this section times the flush
itself, parameter by parameter, with the parameter shapes of the measured runs' Llama, into:

* ``shared``: an fp32 buffer after ``share_memory_()`` (what SuperOffload really copies into);
* ``private``: an ordinary pageable fp32 buffer (the harness's ``copy`` rows' kind of memory);
* ``pinned``: a pinned fp32 buffer (ZeRO-3 offload's ``_offload_grad_partition_at_boundary`` target);
* ``shared_with_adam``: ``shared`` while a DeepSpeed CPU Adam process on the worker's cores updates 1e8
  parameters in a loop (SuperOffload's worker running Adam on earlier sub-groups during later flushes).

Rows carry the flush's elements, its fp32 bytes, the decoder layers it holds (the 8-layer flush also holds
the embedding, the head and the final norm: all of the runs' "0.5b" model) and the main process's cores.
Rows ``so_flush`` time the whole flush (all four steps per parameter, one synchronize); rows
``so_fp32_d2h`` time only the fp32 cast + copy step per parameter, so the model's per-step costs can be
checked against the whole. The main thread is pinned to SuperOffload's main-process cores, as
``SuperOffloadCPUOptimizer._set_cpu_affinity`` pins it (the OpenMP pool, created before, keeps every core).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from .ds_bench import add_rows, superoffload_split
from .isolate import Emit, run_isolated
from .records import Table

# Flushes made of the measured runs' Llama parameters (scripts/ds_train_step.py: hidden 2048, 16 heads,
# 4 KV heads, SwiGLU 5632, vocab 32000). (name, layers, with embedding and head).
FLUSHES: tuple[tuple[str, int, bool], ...] = (("1layer", 1, False), ("2layers", 2, False), ("0.5b", 8, True))
HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2048, 16, 4, 5632, 32000


def flush_param_sizes(layers: int, with_embeddings: bool) -> list[int]:
    """Element counts of the parameters of one flush, in backward order (head first, embedding last)."""
    head_dim = HIDDEN // HEADS
    kv = KV_HEADS * head_dim
    layer = [
        HIDDEN,
        HIDDEN * FFN,
        HIDDEN * FFN,
        FFN * HIDDEN,
        HIDDEN,
        HIDDEN * HIDDEN,
        HIDDEN * kv,
        HIDDEN * kv,
        HIDDEN * HIDDEN,
    ]
    sizes = [VOCAB * HIDDEN, HIDDEN] if with_embeddings else []
    sizes += layer * layers
    if with_embeddings:
        sizes.append(VOCAB * HIDDEN)
    return sizes


def bench_so_grads(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    del torch
    rows, problem = run_isolated(so_grads_target, {"quick": quick}, timeout_s=200, log=log)
    add_rows(table, rows)
    print(f"[calibrate] so_grads: {len(rows)} rows{'; ' + problem if problem else ''}", file=log, flush=True)
    if problem:
        raise RuntimeError(problem)


def _adam_load(cores: list[int], elements: int, ready: Any, stop: Any) -> None:
    """A DeepSpeed CPU Adam updating ``elements`` fp32 parameters in a loop on ``cores`` until ``stop``."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    param = torch.nn.Parameter(torch.randn(elements))
    param.grad = torch.randn(elements) * 1e-3
    optimizer = DeepSpeedCPUAdam([param], lr=1e-5)
    optimizer.step()
    ready.set()
    while not stop.is_set():
        optimizer.step()


def so_grads_target(emit: Emit, quick: bool) -> None:
    import multiprocessing as mp

    import torch

    cores = sorted(os.sched_getaffinity(0))
    main_cores, worker_cores = superoffload_split(cores)
    torch.set_num_threads(len(cores))
    torch.randn(10**6).sum()  # create the OpenMP pool on every core before the main thread is pinned
    os.sched_setaffinity(0, main_cores or cores)
    device = torch.device("cuda")
    flushes = FLUSHES[::2] if quick else FLUSHES
    largest = max(sum(flush_param_sizes(layers, emb)) for _, layers, emb in flushes)
    host_bf16 = torch.empty(largest, dtype=torch.bfloat16).pin_memory()
    buffers: dict[str, Any] = {
        "shared": torch.zeros(largest, dtype=torch.float32).share_memory_(),
        "private": torch.zeros(largest, dtype=torch.float32),
        "pinned": torch.zeros(largest, dtype=torch.float32).pin_memory(),
    }

    def flush(grads: list[Any], fp32: Any, whole: bool) -> None:
        offset = 0
        norms = []
        for grad in grads:
            n = grad.numel()
            if whole:
                host = host_bf16.narrow(0, offset, n)
                host.copy_(grad, non_blocking=True)
                back = host.to(device, non_blocking=True)
                norms.append(back.to(torch.float32).norm(2) ** 2.0)
            else:
                back = grad
            fp32.narrow(0, offset, n).copy_(back.to(torch.float32), non_blocking=True)
            offset += n
        torch.cuda.current_stream().synchronize()

    def measure(variant: str, buffer: str) -> None:
        for _name, layers, emb in flushes:
            sizes = flush_param_sizes(layers, emb)
            grads = [torch.randn(n, device=device, dtype=torch.bfloat16) * 1e-3 for n in sizes]
            elements = sum(sizes)
            repeats = 3 if elements > 3 * 10**8 else 6
            for op, whole in (("so_flush", True), ("so_fp32_d2h", False)):
                flush(grads, buffers[buffer], whole)  # warm-up (first touch of the host pages)
                times_s = []
                for _ in range(repeats):
                    torch.cuda.synchronize()
                    start_s = time.perf_counter()
                    flush(grads, buffers[buffer], whole)
                    times_s.append(time.perf_counter() - start_s)
                emit(
                    (
                        op,
                        variant,
                        "bf16",
                        times_s,
                        {
                            "elements": elements,
                            "bytes": 4 * elements,
                            "threads": len(main_cores),
                            "layers": layers,
                            "hidden": HIDDEN,
                        },
                    )
                )
            del grads

    for buffer in ("shared", "private", "pinned"):
        measure(buffer, buffer)
    if not worker_cores:
        return
    context = mp.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    adam = context.Process(target=_adam_load, args=(worker_cores, 10**8, ready, stop), daemon=True)
    adam.start()
    try:
        if ready.wait(timeout=90):
            measure("shared_with_adam", "shared")
    finally:
        stop.set()
        adam.join(timeout=30)
        if adam.is_alive():
            adam.terminate()
