"""ZeRO-Infinity (CPU variant): ZeRO-3 with the optimizer *and* the bf16 parameters offloaded.

Parameters live in CPU memory and are streamed to the GPU one layer ahead of use (``prefetch_layers``),
in forward and again in backward; gradients go back per sub-group; Adam runs on the CPU after backward
and rewrites the CPU-resident bf16 copy (CPU-side cast). GPU memory holds only the working set, so the
model size is bounded by CPU memory; every step moves the weights over the link twice.
"""

from __future__ import annotations

from sosim.config import Scenario, ZeroInfinitySchedule
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import Plan
from sosim.schedules import stage3


def strategy(sc: Scenario) -> stage3.Stage3Strategy:
    s = sc.schedule
    assert isinstance(s, ZeroInfinitySchedule)
    ds = s.implementation == "deepspeed"
    return stage3.Stage3Strategy(
        name="zero_infinity", weight_flow=True, offload_checkpoints=False,
        grad_path="deepspeed_stage3" if ds else "bf16_cpu_cast",
        param_cast="cpu", speculative=False, refresh="per_bucket", serial_subgroups=ds,
        gpu_optimizer_fraction=0.0, bucket_params=s.sub_group_elements, cpu_adam=s.cpu_adam,
        cpu_adam_core_fraction=s.cpu_adam_core_fraction, pin_memory=s.pin_memory, overlap_comm=s.overlap_comm,
        hook_s_per_layer=stage3.STAGE3_HOOK_S_PER_TENSOR * stage3.TENSORS_PER_LAYER if ds else 0.0,
        host_sync_per_subgroup=False, prefetch_layers=s.prefetch_layers, cpu_unscale_pass=ds,
        cpu_state_bytes=stage3.DEEPSPEED_CPU_STATE_BYTES if ds else stage3.OPT_STATE_BYTES,
    )


def build_plan(sc: Scenario, costs: CostModel) -> Plan:
    return stage3.build_plan(sc, costs, strategy(sc))


def memory_usage(sc: Scenario) -> MemoryUsage:
    return stage3.memory_usage(sc, strategy(sc))
