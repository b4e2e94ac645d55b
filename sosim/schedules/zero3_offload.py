"""ZeRO stage 3 with the optimizer offloaded to the CPU (DeepSpeed ``stage: 3`` + ``offload_optimizer: cpu``).

``implementation: deepspeed`` (default; DeepSpeed 0.19.8, ``runtime/zero/stage3.py``): per-layer module
hooks on the host thread; gradients flush per reduce bucket on a side stream, non-blocking, bf16 to the
host, back, cast on the GPU, fp32 to the host (8 B/param), with one host sync at the end of backward;
``step()`` runs its fixed part, then per sub-group: CPU unscale, CPU Adam in the training process, and a
blocking ``copy_`` of the fp32 master into the bf16 GPU weights. Host memory 18 B/param.
``implementation: ideal`` (the schedule as designed): bf16 gradients per bucket to the host with a CPU
conversion, the global norm, CPU Adam per sub-group on ``cpu_adam_core_fraction`` of the cores, each
sub-group's parameters copied back (CPU cast, pinned bf16) as soon as it is updated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from sosim.engine.plan import Plan
from sosim.hardware.machine import Machine, zero_group
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.config import AdamImpl, Fraction, OffloadKnobs, PosFloat
from sosim.schedules.blocks import cpu, ds_version, layout, stage3
from sosim.schedules.blocks.driver import Recipe, plan_for
from sosim.schedules.blocks.gradients import HostGradients, Stage3Gradients
from sosim.schedules.blocks.steps import AfterBackward, BlockingCopy, CastAndCopy, Stage3Step
from sosim.schedules.blocks.weights import Partitioned

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario


class Stage3Defaults(BaseModel):
    sub_group_elements: float
    bucket_mb: float
    overlap_comm: bool
    cpu_adam: AdamImpl


# DeepSpeed: sub_group_size 1e9, reduce_bucket_size 5e8 elements (1000 MB of bf16), overlap_comm true for
# stage 3 (runtime/zero/config.py). Ideal: the SuperOffload artifact's sub_group_size 6e8.
STAGE3_DEFAULTS: dict[str, BaseModel] = {
    "deepspeed": Stage3Defaults(sub_group_elements=1e9, bucket_mb=1000.0, overlap_comm=True, cpu_adam="cpu_adam"),
    "ideal": Stage3Defaults(sub_group_elements=6e8, bucket_mb=1000.0, overlap_comm=True, cpu_adam="cpu_adam"),
}


class Stage3OffloadKnobs(OffloadKnobs):
    """Knobs of the ZeRO-3 offload systems; defaults follow ``implementation``."""

    # Optimizer sub-group size in elements (DeepSpeed sub_group_size).
    sub_group_elements: PosFloat = Field(description=stage3.SUB_GROUP_DOC)
    # Gradient reduce bucket in MB of bf16 gradients (DeepSpeed reduce_bucket_size x 2 B).
    bucket_mb: PosFloat = Field(description=stage3.BUCKET_DOC)
    overlap_comm: bool = Field(description=stage3.OVERLAP_DOC)
    # Paper schedule only: cores given to CPU Adam, the rest convert. DeepSpeed's ZeRO-3 runs CPU Adam in the
    # training process on every core (cpuadam_cores_perc exists only with super_offload).
    cpu_adam_core_fraction: Fraction = Field(1.0, description=
        "Share of the cores given to CPU Adam, the rest convert gradients (ideal only: DeepSpeed runs Adam in the "
        "training process on every core, so deepspeed requires 1.0)")
    DEFAULTS: ClassVar = STAGE3_DEFAULTS

    @model_validator(mode="after")
    def _deepspeed_has_no_core_split(self) -> Stage3OffloadKnobs:
        if self.implementation == "deepspeed" and self.cpu_adam_core_fraction != 1.0:
            raise ValueError("cpu_adam_core_fraction: DeepSpeed's ZeRO-3 runs CPU Adam in the training process on "
                             "all cores (cpuadam_cores_perc exists only for superoffload); use implementation: ideal")
        return self


class Zero3OffloadKnobs(Stage3OffloadKnobs):
    system: Literal["zero3_offload"]


def _knobs(sc: Scenario) -> Zero3OffloadKnobs:
    assert isinstance(sc.schedule, Zero3OffloadKnobs)
    return sc.schedule


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    return stage3.offload_footprint(sc, implementation=s.implementation, bucket_mb=s.bucket_mb, weight_flow=False)


def deepspeed(sc: Scenario, costs: Costs, s: Stage3OffloadKnobs, machine: Machine) -> Recipe:
    return Recipe(
        layout=stage3.deepspeed_layout(sc, costs, s.sub_group_elements, s.bucket_mb, ratio=1.0),
        cpu=cpu.one_process(machine.threads_per_rank, ds_version.adam_impl(sc, s.cpu_adam)),
        weights=Partitioned(),
        hooks=stage3.deepspeed_hooks(sc, costs),
        # Before PR 8207 (0.19.5) the fp32 gradient copy_ is blocking: the host waits for each flush.
        grads=Stage3Gradients(overlap_comm=s.overlap_comm, pinned=s.pin_memory, superoffload=False,
                              blocking_fp32_copy=ds_version.behaviour(sc).zero3_blocking_grad_copy),
        step=Stage3Step(BlockingCopy("zero3_offload"), system="zero3_offload", worker=False, handed_off=False),
    )


def ideal(sc: Scenario, costs: Costs, s: Stage3OffloadKnobs, machine: Machine) -> Recipe:
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    flushes = layout.make_flushes(tensors, layout.bucket_elements_from_mb(s.bucket_mb), "fill")
    groups = layout.subgroups(tensors, s.sub_group_elements * zero_group(sc))
    t = sc.training
    return Recipe(
        layout=layout.make_layout(units, tensors, flushes, groups),
        cpu=cpu.split_cores(machine.threads_per_rank, s.cpu_adam_core_fraction, True, s.cpu_adam),
        weights=Partitioned(),
        grads=HostGradients(fp32_on_gpu=False, overlap_comm=s.overlap_comm),
        step=AfterBackward(CastAndCopy(cast_on_gpu=False, pinned=s.pin_memory),
                           norm=t.gradient_clipping > 0 or t.precision == "fp16"),
    )


PRESETS = {"deepspeed": deepspeed, "ideal": ideal}


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    s = _knobs(sc)
    return plan_for(sc, costs, PRESETS[s.implementation](sc, costs, s, machine))
