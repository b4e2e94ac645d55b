"""SuperOffload (Lian et al., ASPLOS'26): DeepSpeed's implementation (default) and the paper's schedule.

``implementation: deepspeed`` at ``deepspeed_version`` 0.18.0-0.18.8 is the code as released (PR 7559):
sosim/schedules/superoffload_release.py. From 0.18.9 (PR 7906; read in 0.19.8,
``runtime/superoffload/superoffload_stage3.py`` and
``superoffload_utils.py``): a ZeRO-3 path (per-layer hooks; weights in HBM, or streamed from host memory
with ``weight_placement: flow`` = ``offload_param: cpu``) whose CPU Adam runs in a worker process on
``cpu_adam_core_fraction`` of the cores (``cpuadam_cores_perc``). Gradients flush per reduce bucket (bf16
to the host and back, GPU cast, fp32 to the host: 8 B/param); at the last micro-batch the host waits for
every flush and, with ``gradient_clipping: 0``, hands each completed sub-group to the worker at once, so
Adam overlaps the rest of backward. With clipping, every CPU sub-group is stepped synchronously by the
worker after backward. ``step()``: its fixed part, then per sub-group an unscale pass and a blocking
``copy_`` of the fp32 master into the bf16 GPU weights. ``gpu_optimizer_fraction`` is 1 - ``ratio``: the
first int((1 - ratio) * n) sub-groups keep their optimizer on the GPU.
``implementation: ideal`` (the paper): every technique is a knob: ``weight_placement`` stationary / flow /
auto, ``bucket_mb`` transfer buckets with the ``gpu_optimizer_fraction`` of parameters in the first buckets
updated on the GPU, ``cast`` gpu (fp32 over the link, GPU casts) or cpu, ``speculation`` (CPU Adam per bucket
during backward; expected rollback cost ``clip_rate x (2 Adam + refresh)``), ``cpu_adam`` on
``cpu_adam_core_fraction`` of the cores; parameters return per bucket as each update finishes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from sosim.engine.plan import Plan
from sosim.hardware import model as tm
from sosim.hardware.machine import Machine
from sosim.hardware.memory import MemoryUsage, check_fit
from sosim.inputs.config import AdamImpl, Fraction, OffloadKnobs, PosFloat, UnitInterval
from sosim.inputs.errors import SosimError
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules import superoffload_release
from sosim.schedules.blocks import cpu, ds_version, layout, stage3
from sosim.schedules.blocks.driver import ActivationsOnGpu, Recipe, plan_for
from sosim.schedules.blocks.gradients import HostGradients, Stage3Gradients
from sosim.schedules.blocks.steps import AfterBackward, BlockingCopy, CastAndCopy, HostCopyOnly, Speculative, Stage3Step
from sosim.schedules.blocks.weights import CheckpointsOnHost, HostStreamed, Partitioned

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario


class _Defaults(BaseModel):
    sub_group_elements: float
    bucket_mb: float
    overlap_comm: bool
    cpu_adam: AdamImpl
    gpu_optimizer_fraction: float
    cast: Literal["gpu", "cpu"]
    cpu_adam_core_fraction: float
    weight_placement: Literal["stationary", "flow", "auto"]


class SuperOffloadKnobs(OffloadKnobs):
    """SuperOffload's knobs; defaults follow ``implementation``."""

    system: Literal["superoffload"]
    sub_group_elements: PosFloat = Field(description=stage3.SUB_GROUP_DOC)
    bucket_mb: PosFloat = Field(description=stage3.BUCKET_DOC)
    overlap_comm: bool = Field(description=stage3.OVERLAP_DOC)
    weight_placement: Literal["stationary", "flow", "auto"] = Field(description=
        "Where the bf16 weights live: stationary (HBM), flow (host, streamed per layer), auto; deepspeed flow = "
        "offload_param: cpu")
    # Fraction of optimizer state kept in HBM and updated on the GPU = 1 - DeepSpeed ratio.
    gpu_optimizer_fraction: UnitInterval = Field(description=
        "Share of the optimizer state kept in HBM and updated on the GPU = 1 - DeepSpeed ratio. deepspeed: the first "
        "int((1 - ratio) n) sub-groups, by count; ideal: the first buckets within this share of the parameters")
    cast: Literal["gpu", "cpu"] = Field(description="Where the fp32/bf16 casts run (deepspeed: cpu only)")
    speculation: bool = Field(True, description=
        "Speculation-then-validation (STV): the step starts before the gradient norm is known; DeepSpeed speculates "
        "exactly when gradient_clipping is 0 (false is ideal only)")
    cpu_adam_core_fraction: Fraction = Field(description=
        "Share of the cores of the Adam worker (DeepSpeed cpuadam_cores_perc); the training process gets int((1 - f) "
        "cores) whole cores, all cores when that is 0")
    DEFAULTS: ClassVar = {
        # DeepSpeed: sub_group_size 1e9, reduce_bucket_size 5e8, ratio 1.0, cpuadam_cores_perc 0.8,
        # DeepSpeed CPU-Adam, refresh cast on the CPU, weights in HBM (runtime/zero/offload_config.py).
        "deepspeed": _Defaults(sub_group_elements=1e9, bucket_mb=1000.0, overlap_comm=True, cpu_adam="cpu_adam",
                               gpu_optimizer_fraction=0.0, cast="cpu", cpu_adam_core_fraction=0.8,
                               weight_placement="stationary"),
        # Paper artifact: sub_group_size 6e8, ratio 0.9, GraceAdam, 64 MB buckets, casts on the GPU.
        "ideal": _Defaults(sub_group_elements=6e8, bucket_mb=64.0, overlap_comm=True, cpu_adam="grace_adam",
                           gpu_optimizer_fraction=0.1, cast="gpu", cpu_adam_core_fraction=1.0,
                           weight_placement="auto"),
    }

    @model_validator(mode="after")
    def _deepspeed_choices(self) -> SuperOffloadKnobs:
        if self.implementation != "deepspeed":
            return self
        if self.cast != "cpu":
            raise ValueError("cast: DeepSpeed casts the refreshed parameters on the CPU (copy_ of the fp32 "
                             "master into the bf16 weights); cast: gpu needs implementation: ideal")
        if not self.speculation:
            raise ValueError("speculation: DeepSpeed decides it (Adam during backward: always in 0.18.0-0.18.8, "
                             "exactly when gradient_clipping is 0 from 0.18.9); speculation: false needs "
                             "implementation: ideal")
        return self


def _knobs(sc: Scenario) -> SuperOffloadKnobs:
    assert isinstance(sc.schedule, SuperOffloadKnobs)
    return sc.schedule


def _memory(sc: Scenario, s: SuperOffloadKnobs, flow: bool) -> MemoryUsage:
    if s.implementation == "deepspeed":
        usage = stage3.footprint(
            sc, weight_flow=flow, offload_checkpoints=False,
            gpu_fraction=stage3.deepspeed_gpu_fraction(sc, s.sub_group_elements, 1.0 - s.gpu_optimizer_fraction),
            cpu_state_bytes=stage3.DEEPSPEED_CPU_STATE_BYTES,
            gpu_buffer_bytes=(superoffload_release.release_gpu_buffers(sc, s.bucket_mb, s.sub_group_elements)
                              if ds_version.behaviour(sc).superoffload_release_path
                              else stage3.deepspeed_gpu_buffers(sc, s.bucket_mb)))
        # The worker's fp32 gradient scratch buffer, as large as the largest sub-group (superoffload_utils.py).
        usage.cpu_bytes["worker_grad_buffer"] = FP32_BYTES * min(s.sub_group_elements, tm.total_params(sc.model))
        return usage
    return stage3.footprint(sc, weight_flow=flow, offload_checkpoints=flow, gpu_fraction=s.gpu_optimizer_fraction,
                            cpu_state_bytes=stage3.OPT_STATE_BYTES,
                            gpu_buffer_bytes=stage3.ideal_gpu_buffers(s.bucket_mb))


def placement(sc: Scenario, s: SuperOffloadKnobs) -> tuple[bool, str]:
    """(weight_flow, reason)."""
    if s.weight_placement != "auto":
        return s.weight_placement == "flow", f"weight_placement: {s.weight_placement} (set by the scenario)"
    fit = check_fit(_memory(sc, s, flow=False), sc.hardware)
    if fit.feasible:
        return False, "auto -> stationary: bf16 weights, activations and GPU optimizer tail fit in HBM"
    return True, f"auto -> flow: weight-stationary does not fit ({fit.reason})"


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    return _memory(sc, s, placement(sc, s)[0])


def choices(sc: Scenario, machine: Machine) -> dict[str, str]:
    s = _knobs(sc)
    flow, reason = placement(sc, s)
    clip = sc.training.gradient_clipping > 0
    release = s.implementation == "deepspeed" and ds_version.behaviour(sc).superoffload_release_path
    # 0.18.0-0.18.8 speculate whatever the clipping; from PR 7906 (0.18.9) only without it.
    spec = True if release else (not clip) if s.implementation == "deepspeed" else s.speculation
    return {"weight_placement": "flow" if flow else "stationary", "placement_reason": reason,
            "speculation_active": str(spec)}


def deepspeed(sc: Scenario, costs: Costs, s: SuperOffloadKnobs, machine: Machine) -> Recipe:
    adam = ds_version.adam_impl(sc, s.cpu_adam)
    if ds_version.behaviour(sc).superoffload_release_path:
        # DeepSpeed 0.18.0-0.18.8: the release-era code (sosim/schedules/superoffload_release.py).
        if placement(sc, s)[0]:
            raise SosimError(f"schedule.deepspeed_version {sc.schedule.deepspeed_version}: SuperOffload with "
                             "offload_param (weight_placement: flow) is modelled only from 0.18.9 on")
        return superoffload_release.recipe(
            sc, costs, machine, sub_group_elements=s.sub_group_elements, ratio=1.0 - s.gpu_optimizer_fraction,
            core_fraction=s.cpu_adam_core_fraction, overlap_comm=s.overlap_comm, pinned=s.pin_memory, adam=adam)
    # weight_placement flow = DeepSpeed's offload_param: cpu: weights streamed per layer by the stage-3 prefetcher,
    # the refresh rewrites the host bf16 partition (a CPU cast) instead of copying to the GPU.
    flow, _ = placement(sc, s)
    refresh = HostCopyOnly(cast=True) if flow else BlockingCopy("superoffload")
    return Recipe(
        layout=stage3.deepspeed_layout(sc, costs, s.sub_group_elements, s.bucket_mb, 1.0 - s.gpu_optimizer_fraction),
        cpu=cpu.split_cores(machine.threads_per_rank, s.cpu_adam_core_fraction, False, adam),
        weights=HostStreamed(1, BF16_BYTES) if flow else Partitioned(),
        hooks=stage3.deepspeed_hooks(sc, costs),
        grads=Stage3Gradients(overlap_comm=s.overlap_comm, pinned=s.pin_memory, superoffload=True),
        step=Stage3Step(refresh, system="superoffload", worker=True, handed_off=sc.training.gradient_clipping == 0),
    )


def ideal(sc: Scenario, costs: Costs, s: SuperOffloadKnobs, machine: Machine) -> Recipe:
    flow, _ = placement(sc, s)
    gpu_cast = s.cast == "gpu"
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    flushes = layout.make_flushes(tensors, layout.bucket_elements_from_mb(s.bucket_mb), "fill")
    groups = layout.gpu_groups_by_fraction(layout.groups_from_flushes(flushes), s.gpu_optimizer_fraction)
    refresh = HostCopyOnly(cast=not gpu_cast) if flow else CastAndCopy(cast_on_gpu=gpu_cast, pinned=s.pin_memory)
    refresh_bytes = FP32_BYTES if gpu_cast else BF16_BYTES
    t = sc.training
    # Without STV the paper's SuperOffload is DeepSpeed ZeRO-3's synchronous step (it is built on it): engine.step()
    # updates and refreshes every sub-group after backward and returns only then (stage3.py step), so the next
    # forward waits for all of it: the GPU idle time STV removes (paper section on STV; its ablation x1.45).
    step = (Speculative(refresh, refresh_bytes) if s.speculation
            else AfterBackward(refresh, norm=t.gradient_clipping > 0 or t.precision == "fp16", wait_for_all=True))
    return Recipe(
        layout=layout.make_layout(units, tensors, flushes, groups),
        cpu=cpu.split_cores(machine.threads_per_rank, s.cpu_adam_core_fraction, True, s.cpu_adam),
        weights=HostStreamed(1, refresh_bytes) if flow else Partitioned(),
        activations=CheckpointsOnHost() if flow else ActivationsOnGpu(),
        grads=HostGradients(fp32_on_gpu=gpu_cast, overlap_comm=s.overlap_comm),
        step=step,
    )


PRESETS = {"deepspeed": deepspeed, "ideal": ideal}


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    s = _knobs(sc)
    return plan_for(sc, costs, PRESETS[s.implementation](sc, costs, s, machine))
