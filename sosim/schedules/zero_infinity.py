"""ZeRO-Infinity (CPU tier): ZeRO-3 with the optimizer *and* the bf16 parameters offloaded to host memory.

Parameters live in host memory and are copied to the GPU one layer ahead of use (``prefetch_layers``), in
forward and again in backward; gradients and the optimizer step are those of ZeRO-3 offload (the same
presets), except that the refresh rewrites the host bf16 copy (a CPU cast; DeepSpeed's
``_reassign_or_swap_out_partitioned_parameters`` copies into the host partition) instead of crossing the
link. GPU memory holds only the working set; every step moves the weights over the link twice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from sosim.costs.offload_mechanisms import fetched_tensors_per_layer, zinf_fetch_s_per_tensor
from sosim.engine.plan import Plan
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.units import BF16_BYTES
from sosim.schedules.blocks import stage3
from sosim.schedules.blocks.driver import Recipe, plan_for
from sosim.schedules.blocks.steps import AfterBackward, HostCopyOnly, Stage3Step
from sosim.schedules.blocks.weights import CpuParamsFetched, HostStreamed
from sosim.schedules.zero3_offload import Stage3OffloadKnobs
from sosim.schedules.zero3_offload import deepspeed as zero3_deepspeed
from sosim.schedules.zero3_offload import ideal as zero3_ideal

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.hardware.machine import Machine
    from sosim.inputs.config import Scenario


class ZeroInfinityKnobs(Stage3OffloadKnobs):
    system: Literal["zero_infinity"]
    # Layers of parameters fetched ahead of use (DeepSpeed prefetch_bucket_size, expressed in layers).
    prefetch_layers: int = Field(1, ge=0, description=
        "Layers of parameters fetched ahead of use (DeepSpeed stage3_prefetch_bucket_size, in layers)")


def _knobs(sc: Scenario) -> ZeroInfinityKnobs:
    assert isinstance(sc.schedule, ZeroInfinityKnobs)
    return sc.schedule


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    return stage3.offload_footprint(sc, implementation=s.implementation, bucket_mb=s.bucket_mb, weight_flow=True,
                                    prefetch_layers=s.prefetch_layers)


def deepspeed(sc: Scenario, costs: Costs, s: ZeroInfinityKnobs, machine: Machine) -> Recipe:
    """ZeRO-3 offload's DeepSpeed recipe with host-resident weights: swap the weight source and the refresh."""
    base = zero3_deepspeed(sc, costs, s, machine)
    step = Stage3Step(HostCopyOnly(cast=True), system="zero3_offload", worker=False, handed_off=False)
    streamed = HostStreamed(s.prefetch_layers, BF16_BYTES)
    measured = zinf_fetch_s_per_tensor(costs)
    if measured is None:  # no layer_offload rows in the profile's tables: the fetch as a copy only
        return replace(base, weights=streamed, step=step)
    weights = CpuParamsFetched(streamed, measured[0], fetched_tensors_per_layer(sc.model), refetch_in_backward=False)
    return replace(base, weights=weights, step=step)


def ideal(sc: Scenario, costs: Costs, s: ZeroInfinityKnobs, machine: Machine) -> Recipe:
    base = zero3_ideal(sc, costs, s, machine)
    assert isinstance(base.step, AfterBackward)
    return replace(base, weights=HostStreamed(s.prefetch_layers, BF16_BYTES),
                   step=AfterBackward(HostCopyOnly(cast=True), norm=base.step.norm))


PRESETS = {"deepspeed": deepspeed, "ideal": ideal}


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    s = _knobs(sc)
    return plan_for(sc, costs, PRESETS[s.implementation](sc, costs, s, machine))
