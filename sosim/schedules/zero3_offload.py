"""ZeRO stage 3 with the optimizer offloaded to the CPU (DeepSpeed ``stage: 3`` + ``offload_optimizer``).

ideal: the schedule as designed — weights resident on one GPU (partitioned and all-gathered across
data-parallel ranks), bf16 gradients per sub-group to the CPU, Adam per sub-group after backward and the
global norm, each sub-group's parameters copied back as soon as it is updated.
deepspeed: DeepSpeed 0.19.6 (``runtime/zero/stage3.py``) adds the per-submodule fetch/release hooks of
stage 3 on every layer's forward and backward; ``partition_grads`` moves each gradient bf16 to a pinned
host buffer, back to the GPU, casts it to fp32 there and copies fp32 to the host (8 B/param); ``step()``
walks the sub-groups one after the other: CPU unscale/clip pass, CPU Adam, then a blocking
``fp16_partition.copy_(fp32_partition)`` from pageable memory (fp32->bf16 on the CPU, 2 B/param H2D)
before the next sub-group. Host memory is 18 B/param.
"""

from __future__ import annotations

from sosim.config import Scenario, Zero3OffloadSchedule
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import Plan
from sosim.schedules import stage3


def strategy(sc: Scenario) -> stage3.Stage3Strategy:
    s = sc.schedule
    assert isinstance(s, Zero3OffloadSchedule)
    ds = s.implementation == "deepspeed"
    return stage3.Stage3Strategy(
        name="zero3_offload", weight_flow=False, offload_checkpoints=False,
        grad_path="deepspeed_stage3" if ds else "bf16_cpu_cast",
        param_cast="cpu", speculative=False, refresh="per_bucket", serial_subgroups=ds,
        gpu_optimizer_fraction=0.0, bucket_params=s.sub_group_elements, cpu_adam=s.cpu_adam,
        cpu_adam_core_fraction=s.cpu_adam_core_fraction, pin_memory=s.pin_memory, overlap_comm=s.overlap_comm,
        hook_s_per_layer=stage3.STAGE3_HOOK_S_PER_TENSOR * stage3.TENSORS_PER_LAYER if ds else 0.0,
        host_sync_per_subgroup=False, refresh_pinned=not ds, cpu_unscale_pass=ds,
        cpu_state_bytes=stage3.DEEPSPEED_CPU_STATE_BYTES if ds else stage3.OPT_STATE_BYTES,
    )


def build_plan(sc: Scenario, costs: CostModel) -> Plan:
    return stage3.build_plan(sc, costs, strategy(sc))


def memory_usage(sc: Scenario) -> MemoryUsage:
    return stage3.memory_usage(sc, strategy(sc))
