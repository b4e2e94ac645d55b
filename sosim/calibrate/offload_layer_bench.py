"""ZeRO-2 offload and ZeRO-Infinity as DeepSpeed 0.19.8 runs them around a decoder-layer stack (section
``layer_offload``), and ZeRO-2's per-parameter gradient flush alone (rows ``z2_flush``).

Why: the ZeRO-2 runs' backward and the ZeRO-Infinity runs' forward were longer than the plan's ops on the
2026-12-01 lease, and no table held a measurement of either mechanism. Each row imitates one DeepSpeed
function (docs/calibration.md, "ZeRO-2 hooks and ZeRO-Infinity's fetch"):

* ``layer`` rows (``ds_bench.layer_target``, the stage-3 hook section's harness) with new modes:
  ``z2_offload`` / ``z2_offload_no_overlap``: ``stage_1_and_2.py`` with ``offload_optimizer: cpu``,
  ``overlap_comm`` on / off (per-parameter ``grad_handling_hook`` -> ``reduce_independent_p_g_buckets_and_
  remove_grads``; ``reduce_ipg_grads`` -> ``copy_grads_in_partition`` at the boundary);
  ``z3_offload_sgd``: ZeRO-3 with ``offload_optimizer: cpu`` (the runs' stage-3 path);
  ``z3_offload_param``: the same plus ``offload_param: cpu`` (ZeRO-Infinity's CPU tier: one rank's
  ``NoGatherCoalescedHandle`` copies each parameter from the pinned flat buffer and synchronises the fetch
  stream, ``partitioned_param_coordinator.fetch_sub_module``).
  A client ``torch.optim.SGD`` replaces DeepSpeed's CPU Adam: the optimizer step is outside the timed
  region, and SGD needs no compiled extension (a fresh machine has no time to build CPUAdam).
* ``z2_flush`` rows: ``copy_grads_in_partition``'s cpu_offload path alone, per parameter of the runs' Llama:
  the fp32 norm (``set_norm_for_param_grad_in_gpu``), the overflow test truth-tested on the host
  (``update_offload_overflow_tracker_for_param_grad``: ``has_inf_or_nan`` then ``if``), the fp32 cast and the
  non-blocking copy into the pinned fp32 partition (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``), on a
  side stream; variant ``no_sync`` drops the truth test, ``cast_copy`` keeps only the cast and the copy.
  Two flush sizes with different tensor counts separate the per-tensor from the per-byte cost.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from .ds_bench import add_rows, layer_target
from .isolate import Emit, run_isolated
from .records import Table
from .so_grads_bench import flush_param_sizes

# (hidden, child groups of modes): the stack's hidden size of the runs' 0.5b model and a larger one.
LAYER_OFFLOAD_PLAN: tuple[tuple[int, tuple[tuple[str, ...], ...]], ...] = (
    (2048, (("hf", "z2_offload"), ("z2_offload_no_overlap",), ("z3_offload_sgd",), ("z3_offload_param",))),
    (4096, (("hf", "z2_offload"), ("z3_offload_param",))),
)
Z2_FLUSHES: tuple[tuple[str, int, bool], ...] = (("1layer", 1, False), ("0.5b", 8, True))
# --quick (added 2026-12-01, issue 23 item 2: a quick profile within minutes on a fresh lease): the two modes the
# simulator reads (sosim/costs/offload_mechanisms.py: ZeRO-2's flush around the hf stack, ZeRO-Infinity's fetch)
# at the runs' hidden 2048 only; the overlap_comm off and ZeRO-3 SGD diagnostics and hidden 4096 run without it.
LAYER_OFFLOAD_QUICK_PLAN: tuple[tuple[int, tuple[tuple[str, ...], ...]], ...] = (
    (2048, (("hf", "z2_offload"), ("z3_offload_param",))),
)


def layer_offload_plan(quick: bool) -> tuple[tuple[int, tuple[tuple[str, ...], ...]], ...]:
    return LAYER_OFFLOAD_QUICK_PLAN if quick else LAYER_OFFLOAD_PLAN


def bench_layer_offload(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    del torch
    problems = []
    rows, problem = run_isolated(z2_flush_target, {"quick": quick}, timeout_s=90, log=log)
    add_rows(table, rows)
    _print_rows(rows, log)
    if problem:
        problems.append(f"z2_flush: {problem}")
    for hidden, groups in layer_offload_plan(quick):
        for modes in groups:
            rows, problem = run_isolated(
                layer_target,
                {"hidden": hidden, "seq": 2048, "batches": (4,), "modes": modes, "quick": quick},
                timeout_s=120,
                log=log,
            )
            add_rows(table, rows)
            _print_rows(rows, log)
            if problem:
                problems.append(f"{'+'.join(modes)} h{hidden}: {problem}")
    if problems:
        raise RuntimeError("; ".join(problems))


def _print_rows(rows: list[Any], log: TextIO) -> None:
    """Each row on the log too: a call killed at its limit still returns what it measured."""
    for op, variant, _dtype, times_s, shape in rows:
        ordered = sorted(times_s)
        print(f"[calibrate] row {op} {variant} {shape} median_s {ordered[len(ordered) // 2]:.6f} "
              f"min_s {ordered[0]:.6f} n {len(ordered)}", file=log, flush=True)


def z2_flush_target(emit: Emit, quick: bool) -> None:
    import torch

    device = torch.device("cuda")
    side = torch.cuda.Stream()  # reduction_stream (overlap_comm)
    largest = max(sum(flush_param_sizes(layers, emb)) for _, layers, emb in Z2_FLUSHES)
    fp32_host = torch.zeros(largest, dtype=torch.float32).pin_memory()

    def flush(grads: list[Any], variant: str) -> None:
        offset = 0
        norms = []
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for grad in grads:
                n = grad.numel()
                if variant != "cast_copy":
                    norms.append(grad.to(torch.float32).norm(2))
                    bad = torch.isfinite(grad.amax()).logical_and(torch.isfinite(grad.amin())).logical_not()
                    if variant == "sync" and bad:
                        raise RuntimeError("overflow in a random gradient")
                fp32_host.narrow(0, offset, n).copy_(grad.to(torch.float32), non_blocking=True)
                grad.record_stream(side)
                torch.cuda.Event().record(side)  # _record_offload_copy
                offset += n
        side.synchronize()

    for name, layers, emb in Z2_FLUSHES:
        sizes = flush_param_sizes(layers, emb)
        grads = [torch.randn(n, device=device, dtype=torch.bfloat16) * 1e-3 for n in sizes]
        repeats = 4 if quick else 8
        for variant in ("sync", "no_sync", "cast_copy"):
            flush(grads, variant)  # warm-up: first touch of the pinned pages, allocator
            times_s = []
            for _ in range(repeats):
                torch.cuda.synchronize()
                start_s = time.perf_counter()
                flush(grads, variant)
                times_s.append(time.perf_counter() - start_s)
            emit(("z2_flush", variant, "bf16", times_s,
                  {"elements": sum(sizes), "bytes": 4 * sum(sizes), "layers": layers, "hidden": 2048,
                   "subgroups": len(sizes), "threads": len(os.sched_getaffinity(0))}))
        del name, grads
