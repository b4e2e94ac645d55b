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
from sosim.schedules import stage3


def strategy(sc: Scenario) -> stage3.Stage3Strategy:
    assert isinstance(sc.schedule, Zero3OffloadSchedule)
    return stage3.zero3_strategy("zero3_offload", sc.schedule, weight_flow=False)
