"""GPU-only data parallel training (PyTorch DDP / ZeRO-0): everything stays in HBM.

Per iteration: forward, backward with bucketed gradient all-reduce overlapped on the NCCL stream (only at
the last micro-step of gradient accumulation), then the optimizer step on the GPU (memory bound).
"""

from __future__ import annotations

from sosim import model as tm
from sosim.config import GpuOnlySchedule, Scenario
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import COMM, GPU, NET, OPTIMIZER, Phase, Plan
from sosim.schedules.common import backward_pass, build_units, forward_pass, make_buckets
from sosim.units import BF16_BYTES

# PyTorch DDP's default bucket_cap_mb.
DDP_BUCKET_BYTES = 25e6


def memory_usage(sc: Scenario) -> MemoryUsage:
    sched = sc.schedule
    assert isinstance(sched, GpuOnlySchedule)
    p = tm.total_params(sc.model)
    gpu = {
        "model_state": sched.state_bytes_per_param * p,
        "activations": tm.activation_bytes_peak(sc.model, sc.training, sequence_parallel=sc.cluster.sequence_parallel),
    }
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes={})


def build_plan(sc: Scenario, costs: CostModel) -> Plan:
    plan = Plan()
    units = build_units(sc, costs)
    dp = sc.cluster.dp
    buckets = make_buckets(units, DDP_BUCKET_BYTES / BF16_BYTES)
    p_total = sum(u.params for u in units)
    for it in range(sc.training.iterations):
        last_reduce: list[int] = []
        for micro in range(sc.training.grad_accum):
            fwd = forward_pass(plan, units, it)
            if micro == 0:
                plan.mark_iteration_start(fwd[0])
            bwd = backward_pass(plan, units, it)
            if micro == sc.training.grad_accum - 1 and dp > 1:
                for b in buckets:
                    last_reduce.append(
                        plan.add(NET, f"allreduce:b{b.index}", costs.allreduce_s(b.params * BF16_BYTES, dp),
                                 (bwd[b.last_unit],), layer=b.last_unit, iteration=it, category=COMM,
                                 phase=Phase.GRADIENT, n_bytes=2.0 * (dp - 1) / dp * b.params * BF16_BYTES,
                                 group=b.index)
                    )
        plan.add(GPU, "adam:gpu", costs.gpu_adam_s(p_total), last_reduce, iteration=it, category=OPTIMIZER,
                 phase=Phase.OPTIMIZER)
    return plan
