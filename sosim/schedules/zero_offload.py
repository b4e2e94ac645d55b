"""ZeRO-Offload (Ren et al., USENIX ATC'21): ZeRO-2 with the optimizer on the CPU.

Per iteration (REFERENCE.md §2):

1. forward and backward on the GPU with bf16 parameters resident in HBM;
2. gradients leave the GPU in buckets as backward produces them (overlapped with backward when
   ``overlap_comm``), every micro-step; the CPU accumulates them into fp32;
3. after backward the CPU computes the global norm / overflow check (when clipping or fp16 needs it),
4. then runs Adam over its partition, bucket by bucket, and each updated bucket's bf16 parameters go back
   to the GPU (CPU-Adam writes the bf16 copy as it goes);
5. the next forward waits for every parameter — or, with ``dpu`` (delayed parameter update), for the
   parameters of the step before, so that Adam of step i overlaps the forward/backward of step i+1.

``implementation: deepspeed`` replays DeepSpeed 0.19.6's stage-1/2 offload path
(``runtime/zero/stage_1_and_2.py``): ``overlap_comm`` defaults to false, so gradient copies run on the
compute stream; each gradient is cast to fp32 on the GPU and copied (4 B/param) into the pinned fp32
partition, with a host synchronization per parameter for the overflow tracker; ``step()`` runs a CPU
unscale/clip pass over the fp32 gradients, CPU-Adam (which no longer writes a bf16 copy), then casts the
fp32 partition to bf16 on the CPU into a pinned staging buffer and sends it with one H2D (2 B/param).
Host memory is 18 B/param (fp32 master, grads, m, v, bf16 staging).
"""

from __future__ import annotations

from sosim import model as tm
from sosim.config import Scenario, ZeroOffloadSchedule
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import CAST, COMM, CPU_CAST, CPU_OPT, D2H, GPU, GPU_CAST, H2D, NET, OPTIMIZER, TRANSFER, Phase, Plan
from sosim.schedules.common import (
    build_units,
    cores_for_adam,
    duplex,
    forward_pass,
    gpu_pass_op,
    make_buckets,
    zero_group,
)
from sosim.units import BF16_BYTES, FP32_BYTES, MB

# DeepSpeed's overflow tracker truth-tests a CUDA scalar per parameter: the host waits for the stream once
# per parameter tensor. Estimate: ~20 us of GPU idle each (launch pipeline refill), ~10 tensors per layer.
SYNC_S_PER_TENSOR = 20e-6
TENSORS_PER_LAYER = 10


def _sched(sc: Scenario) -> ZeroOffloadSchedule:
    assert isinstance(sc.schedule, ZeroOffloadSchedule)
    return sc.schedule


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _sched(sc)
    p = tm.total_params(sc.model)
    part = p / zero_group(sc)  # ZeRO-2 partitions gradients and optimizer state across data-parallel ranks
    bucket = s.bucket_mb * MB
    gpu = {
        "bf16_params": BF16_BYTES * p,
        "grad_buckets": 2 * bucket,  # double-buffered bucket being filled / being copied out
        "activations": tm.activation_bytes_peak(sc.model, sc.training, sequence_parallel=sc.cluster.sequence_parallel),
    }
    cpu = {
        "fp32_master": FP32_BYTES * part,
        "adam_moments": 2 * FP32_BYTES * part,
        "fp32_grads": FP32_BYTES * part * (2 if s.dpu else 1),  # DPU double-buffers the gradients
    }
    if s.implementation == "deepspeed":
        cpu["bf16_staging"] = BF16_BYTES * part
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes=cpu)


def build_plan(sc: Scenario, costs: CostModel) -> Plan:
    s = _sched(sc)
    deepspeed = s.implementation == "deepspeed"
    plan = Plan(duplex_factors=duplex(costs))
    units = build_units(sc, costs)
    dp = zero_group(sc)
    p_total = sum(u.params for u in units)
    buckets = make_buckets(units, s.bucket_mb * MB / BF16_BYTES)
    cores = cores_for_adam(sc, s.cpu_adam_core_fraction)
    needs_norm = sc.training.gradient_clipping > 0 or sc.training.precision == "fp16"
    # ideal: bf16 gradients cross the link and the CPU converts; DeepSpeed casts on the GPU and moves fp32.
    grad_bytes = FP32_BYTES if deepspeed else BF16_BYTES
    sync_s = SYNC_S_PER_TENSOR * TENSORS_PER_LAYER if deepspeed else 0.0
    refresh: dict[int, list[int]] = {}  # iteration -> ops that complete its parameter refresh
    # DPU's one-step staleness needs two extra iterations before the timeline is periodic.
    iterations = sc.training.iterations + (2 if s.dpu else 0)
    for it in range(iterations):
        gate_it = it - 2 if s.dpu else it - 1
        gate = refresh.get(gate_it, [])
        arrived: list[int] = []
        for micro in range(sc.training.grad_accum):
            fwd = forward_pass(plan, units, it, {0: gate} if micro == 0 else None)
            if micro == 0:
                plan.mark_iteration_start(fwd[0])
            # Without overlap_comm the backward of the next unit waits for the bucket's copy.
            bwd_gates: dict[int, list[int]] = {}
            bwd: dict[int, int] = {}
            for u in reversed(units):
                bwd[u.index] = gpu_pass_op(plan, u, "bwd", u.bwd_s + sync_s, bwd_gates.get(u.index, ()), it)
                bucket = next((b for b in buckets if b.last_unit == u.index), None)
                if bucket is None:
                    continue
                shard = bucket.params / dp
                deps = [bwd[u.index]]
                if dp > 1:
                    deps = [plan.add(NET, f"reduce_scatter:b{bucket.index}",
                                     costs.reduce_scatter_s(bucket.params * BF16_BYTES, dp), deps,
                                     layer=u.index, iteration=it, category=COMM, phase=Phase.GRADIENT,
                                     group=bucket.index, n_bytes=(dp - 1) / dp * bucket.params * BF16_BYTES)]
                if deepspeed:
                    # The fp32 cast runs on the stream doing the copy: the compute stream without overlap_comm.
                    stream = GPU_CAST if s.overlap_comm else GPU
                    deps = [plan.add(stream, f"grad_cast_fp32:b{bucket.index}", costs.gpu_cast_s(shard), deps,
                                     layer=u.index, iteration=it, category=CAST,
                                     phase=Phase.GRADIENT, group=bucket.index)]
                d2h = plan.add(D2H, f"grad_d2h:b{bucket.index}",
                               costs.copy_s(shard * grad_bytes, "d2h", s.pin_memory),
                               deps, layer=u.index, iteration=it, category=TRANSFER,
                                     phase=Phase.GRADIENT, group=bucket.index,
                               n_bytes=shard * grad_bytes)
                if not deepspeed:
                    d2h = plan.add(CPU_CAST, f"grad_accum_fp32:b{bucket.index}", costs.cpu_cast_s(shard, cores),
                                   [d2h], layer=u.index, iteration=it, category=CAST,
                                     phase=Phase.GRADIENT, group=bucket.index)
                arrived.append(d2h)
                if not s.overlap_comm and u.index > 0:
                    bwd_gates[u.index - 1] = [d2h]
        step_deps = list(arrived)
        if needs_norm and not deepspeed:
            step_deps = [plan.add(CPU_OPT, "grad_norm", costs.cpu_norm_s(p_total / dp), arrived,
                                  iteration=it, category=OPTIMIZER, phase=Phase.OPTIMIZER)]
        if deepspeed:
            # The norm was accumulated on the GPU during backward; step() scales the fp32 grads on the CPU.
            step_deps = [plan.add(CPU_OPT, "unscale_clip", 2.0 * costs.cpu_norm_s(p_total / dp), arrived,
                                  iteration=it, category=OPTIMIZER, phase=Phase.OPTIMIZER)]
        done: list[int] = []
        adam_ops = []
        for b in buckets:
            shard = b.params / dp
            adam_ops.append(plan.add(CPU_OPT, f"cpu_adam:b{b.index}",
                                     costs.cpu_adam_s(shard, s.cpu_adam, cores, p_total / dp),
                                     step_deps, layer=b.last_unit, iteration=it, category=OPTIMIZER,
                                     phase=Phase.OPTIMIZER, group=b.index))
        for b, adam in zip(buckets, adam_ops):
            shard = b.params / dp
            # DeepSpeed copies after the whole step, converting on the CPU first; ideal CPU-Adam writes the
            # bf16 copy as it goes and streams each bucket out.
            deps = [adam]
            if deepspeed:
                deps = [plan.add(CPU_CAST, f"param_cast_bf16:b{b.index}", costs.cpu_cast_s(shard, cores),
                                 adam_ops[-1:], layer=b.last_unit, iteration=it, category=CAST,
                           phase=Phase.REFRESH, group=b.index)]
            h2d = plan.add(H2D, f"param_h2d:b{b.index}", costs.copy_s(shard * BF16_BYTES, "h2d", s.pin_memory),
                           deps, layer=b.last_unit, iteration=it, category=TRANSFER,
                           phase=Phase.REFRESH, group=b.index,
                           n_bytes=shard * BF16_BYTES)
            if dp > 1:
                h2d = plan.add(NET, f"allgather:b{b.index}", costs.reduce_scatter_s(b.params * BF16_BYTES, dp),
                               [h2d], layer=b.last_unit, iteration=it, category=COMM,
                           phase=Phase.REFRESH, group=b.index,
                               n_bytes=(dp - 1) / dp * b.params * BF16_BYTES)
            done.append(h2d)
        refresh[it] = done
    return plan
