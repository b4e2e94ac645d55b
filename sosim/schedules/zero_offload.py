"""ZeRO-Offload (Ren et al., USENIX ATC'21): ZeRO-2 with the optimizer and its fp32 state on the CPU.

Per iteration: forward and backward with bf16 weights resident in HBM; gradients leave the GPU flush by
flush during backward; the CPU updates the fp32 master with Adam; the bf16 parameters return; the next
forward waits for them (or, with ``dpu``, for those of the step before, so that Adam of step i overlaps
the forward/backward of step i+1).

``implementation: deepspeed`` (default; DeepSpeed 0.19.8, ``runtime/zero/stage_1_and_2.py``): reduce
buckets flushed on overflow (``reduce_bucket_size``); ``overlap_comm`` off by default, so each flush's
fp32 cast and copy (4 B/param into the pinned fp32 partition) run on the compute stream; a host sync per
parameter tensor for the overflow tracker; ``step()`` unscales on the CPU, runs DeepSpeed CPU-Adam over the
whole partition in the training process, then casts it to bf16 into a pinned staging buffer and sends it
(2 B/param). Host memory 18 B/param.
``implementation: ideal`` (the paper): bf16 gradients cross the link (2 B/param) and the CPU converts them,
Adam per bucket on ``cpu_adam_core_fraction`` of the cores, each bucket's parameters copied back as soon as
it is updated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from sosim.costs.offload_mechanisms import Z2_ESTIMATE_TENSORS_PER_LAYER, Z2_SYNC_ESTIMATE_S_PER_TENSOR, z2_flush_costs
from sosim.engine.plan import Plan
from sosim.hardware import model as tm
from sosim.hardware.machine import Machine
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.config import AdamImpl, Fraction, OffloadKnobs, PosFloat
from sosim.inputs.units import BF16_BYTES, FP32_BYTES, MB
from sosim.schedules.blocks import cpu, ds_version, layout
from sosim.schedules.blocks.driver import NoHooks, Recipe, plan_for
from sosim.schedules.blocks.gradients import HostGradients, Stage2Gradients
from sosim.schedules.blocks.steps import AfterBackward, CastAndCopy, CopyBf16, Stage2Step
from sosim.schedules.blocks.weights import HostSyncsInBackward, Replicated

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario



class _Defaults(BaseModel):
    overlap_comm: bool
    bucket_mb: float
    cpu_adam: AdamImpl


class ZeroOffloadKnobs(OffloadKnobs):
    """ZeRO-Offload knobs; defaults follow ``implementation``."""

    system: Literal["zero_offload"]
    # delayed parameter update: step i's CPU Adam overlaps step i+1's fwd/bwd
    dpu: bool = Field(False, description=
        "Delayed parameter update (ideal only): step i's CPU Adam overlaps step i+1's forward and backward (one-step "
        "staleness)")
    # Gradient bucket in MB of bf16 gradients (DeepSpeed reduce_bucket_size x 2 B; default 5e8 elements).
    bucket_mb: PosFloat = Field(description=
        "Gradient bucket, MB of bf16 gradients. deepspeed: reduce_bucket_size x 2 B, flushed when the next gradient "
        "would overflow it (a bucket smaller than a layer splits its gradients); ideal: the paper's transfer bucket, "
        "sent once full")
    overlap_comm: bool = Field(description=
        "Gradient copies on a side stream (DeepSpeed overlap_comm); false: on the compute stream (DeepSpeed's default "
        "for stages 1-2: false)")
    # Paper schedule: cores given to CPU Adam (the rest convert gradients); DeepSpeed runs Adam in-process.
    cpu_adam_core_fraction: Fraction = Field(1.0, description=
        "Share of the cores given to CPU Adam, the rest convert gradients (ideal only: DeepSpeed runs Adam in the "
        "training process on every core, so deepspeed requires 1.0)")
    DEFAULTS: ClassVar = {
        # DeepSpeed: overlap_comm defaults to false for stages 1-2 (runtime/zero/config.py overlap_comm_valid).
        "deepspeed": _Defaults(overlap_comm=False, bucket_mb=1000.0, cpu_adam="cpu_adam"),
        "ideal": _Defaults(overlap_comm=True, bucket_mb=1000.0, cpu_adam="cpu_adam"),
    }

    @model_validator(mode="after")
    def _paper_only_knobs(self) -> ZeroOffloadKnobs:
        if self.implementation != "deepspeed":
            return self
        if self.dpu:
            raise ValueError("dpu: DeepSpeed's ZeRO-1/2 offload has no delayed parameter update; "
                             "dpu needs implementation: ideal")
        if self.cpu_adam_core_fraction != 1.0:
            raise ValueError("cpu_adam_core_fraction: DeepSpeed's ZeRO-1/2 runs CPU Adam in the training process "
                             "on all cores; a split needs implementation: ideal")
        return self


def _knobs(sc: Scenario) -> ZeroOffloadKnobs:
    assert isinstance(sc.schedule, ZeroOffloadKnobs)
    return sc.schedule


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    p = tm.total_params(sc.model)
    part = p / sc.cluster.dp  # ZeRO-2 partitions gradients and optimizer state across data-parallel ranks
    gpu = {
        "bf16_params": BF16_BYTES * p,
        # DeepSpeed's setup_buckets: one reduce_bucket_size buffer, a second only with overlap_comm (the bucket
        # being filled while the other is reduced/copied out on the side stream).
        "grad_buckets": (2 if s.overlap_comm else 1) * s.bucket_mb * MB,
        "activations": tm.activation_bytes_peak(sc.model, sc.training, sequence_parallel=sc.cluster.sequence_parallel),
    }
    cpu_bytes = {
        "fp32_master": FP32_BYTES * part,
        "adam_moments": 2 * FP32_BYTES * part,
        "fp32_grads": FP32_BYTES * part * (2 if s.dpu else 1),  # DPU double-buffers the gradients
    }
    if s.implementation == "deepspeed":
        cpu_bytes["bf16_staging"] = BF16_BYTES * part
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes=cpu_bytes)


def deepspeed(sc: Scenario, costs: Costs, s: ZeroOffloadKnobs, machine: Machine) -> Recipe:
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    flushes = layout.make_flushes(tensors, layout.bucket_elements_from_mb(s.bucket_mb), "overflow")
    # step() updates each optimizer param group at once: one group for the whole partition.
    whole = layout.one_group(tensors)
    flush_costs = z2_flush_costs(costs)
    return Recipe(
        layout=layout.make_layout(units, tensors, flushes, whole),
        cpu=cpu.one_process(machine.threads_per_rank, ds_version.adam_impl(sc, s.cpu_adam)),
        weights=Replicated(),
        # Measured flush costs replace the earlier per-layer estimate of the same waits; a profile without
        # the z2_flush rows keeps the estimate.
        hooks=HostSyncsInBackward(Z2_SYNC_ESTIMATE_S_PER_TENSOR * Z2_ESTIMATE_TENSORS_PER_LAYER)
        if flush_costs is None else NoHooks(),
        grads=Stage2Gradients(overlap_comm=s.overlap_comm, pinned=s.pin_memory, host_waits_for_copies=True,
                              flush_costs=flush_costs),
        step=Stage2Step(CastAndCopy(cast_on_gpu=False, pinned=s.pin_memory, allgather=True),
                        unscale_always=ds_version.behaviour(sc).zero2_unscale_always),
        staleness=2 if s.dpu else 1,
        warmup_iterations=2 if s.dpu else 0,
    )


def ideal(sc: Scenario, costs: Costs, s: ZeroOffloadKnobs, machine: Machine) -> Recipe:
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    flushes = layout.make_flushes(tensors, layout.bucket_elements_from_mb(s.bucket_mb), "fill")
    t = sc.training
    return Recipe(
        layout=layout.make_layout(units, tensors, flushes, layout.groups_from_flushes(flushes)),
        cpu=cpu.split_cores(machine.threads_per_rank, s.cpu_adam_core_fraction, True, s.cpu_adam),
        weights=Replicated(),
        grads=HostGradients(fp32_on_gpu=False, overlap_comm=s.overlap_comm),
        step=AfterBackward(CopyBf16(pinned=s.pin_memory), norm=t.gradient_clipping > 0 or t.precision == "fp16",
                           wait_for_all=True),
        staleness=2 if s.dpu else 1,
        warmup_iterations=2 if s.dpu else 0,
    )


PRESETS = {"deepspeed": deepspeed, "ideal": ideal}


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    s = _knobs(sc)
    return plan_for(sc, costs, PRESETS[s.implementation](sc, costs, s, machine))
