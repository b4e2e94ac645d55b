"""Megatron-Core's optimizer CPU offload: the distributed optimizer with ``HybridDeviceOptimizer``
(``--optimizer-cpu-offload --optimizer-offload-fraction F [--overlap-cpu-optimizer-d2h-h2d]
--use-precision-aware-optimizer``; NeMo-RL, verl's Megatron recipes, ms-swift).

What Megatron-Core does (``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py`` and
``optimizer/__init__.py``, main branch as read 2026-12):

* weights stay in HBM (bf16); gradients accumulate in the DDP grad buffer on the GPU (fp32 main grads:
  ``--main-grads-dtype`` fp32, the precision-aware optimizer's default), reduce-scattered per bucket across
  data-parallel ranks during backward; ``clip_grad`` (default 1.0) runs on the GPU: the grad norm (one pass and
  a host sync for its value) and a scaling pass;
* ``HybridDeviceOptimizer`` puts the first parameters of the rank's shard, in parameter-group order, on the CPU
  until ``offload_fraction`` of its elements (``_get_sub_optimizer_param_groups``): fp32 copies, pinned, each
  updated by ``torch.optim.AdamW(fused=True)`` (``cpu_optimizer_cls``: "this flag is used to improve the
  performance of the cpu optimizer"); the rest by Transformer Engine's FusedAdam on the GPU;
* ``step()``: the gradients of the CPU part are copied to pinned fp32 buffers (D2H, 4 B/param) on a side
  stream with one event per parameter when ``overlap_cpu_optimizer_d2h_h2d`` (one optimizer per parameter,
  ``build_cpu_optimizer_list``), else on the compute stream with one event; the GPU optimizer steps; then,
  per CPU optimizer, the host waits for its copy, steps it, and its post-step hook copies each parameter back
  (``gpu_param.data.copy_(cpu_fp32, non_blocking=True)``) on the H2D stream after everything queued on the
  compute stream: the bf16 destination makes torch convert on the CPU into a fresh pageable temporary and copy
  that (aten/src/ATen/native/cuda/Copy.cu, cross-device copies with a dtype change): the same operation as
  DeepSpeed's stage-3 refresh, timed by the ``ds_refresh`` rows (2 B/param), blocking the host thread. So
  "overlap" overlaps the copies of later parameters with the Adam of earlier ones, not the Adam with the
  copies back.

``offload_fraction`` 0 keeps the whole optimizer on the GPU (Megatron's distributed optimizer alone).
``activation_offload``: Megatron's ``--fine-grained-activation-offloading``
(:mod:`sosim.schedules.blocks.activation_offload`).
Not modelled: Megatron's per-call Python overhead of one optimizer per parameter (tens of microseconds each),
tensor/pipeline parallelism, Transformer Engine's fused layers (the layer costs are the eager layers').
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from sosim.costs.torch_adam import TorchAdamImpl, torch_adam_s, torch_adam_source
from sosim.engine.plan import D2H, H2D, NET, Category, Phase, Plan
from sosim.hardware import model as tm
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.config import ScheduleKnobs, UnitInterval
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks import activation_offload, cpu, layout
from sosim.schedules.blocks.driver import ActivationsOnGpu, Ctx, DoneCallback, Recipe, plan_for
from sosim.schedules.blocks.layout import Group, Unit
from sosim.schedules.blocks.steps import gpu_adam
from sosim.schedules.blocks.tuning import OMP_THREADS, Knob, fmt_float, fmt_onoff
from sosim.schedules.blocks.weights import Replicated
from sosim.schedules.fsdp2_offload import Launcher, fsdp_layout, launcher_threads

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.hardware.machine import Machine
    from sosim.inputs.config import Scenario


class MegatronOffloadKnobs(ScheduleKnobs):
    """Megatron-LM's optimizer-offload arguments (defaults: megatron/training/arguments.py)."""

    system: Literal["megatron_offload"]
    # --optimizer-offload-fraction (default 1.0)
    offload_fraction: UnitInterval = Field(1.0, description=
        "--optimizer-offload-fraction: share of the rank's optimizer on the CPU (the first parameters in order)")
    # --overlap-cpu-optimizer-d2h-h2d (default off)
    overlap_d2h_h2d: bool = Field(False, description=
        "--overlap-cpu-optimizer-d2h-h2d: one CPU optimizer per parameter, its gradient copy on a side stream")
    # --no-pin-cpu-grads turns it off
    pin_cpu_grads: bool = Field(True, description="Pinned CPU gradient buffers (--no-pin-cpu-grads turns it off)")
    # required with --optimizer-cpu-offload
    use_precision_aware_optimizer: bool = Field(True, description=
        "--use-precision-aware-optimizer, required by Megatron with --optimizer-cpu-offload")
    # optimizer/__init__.py passes fused=True to torch's AdamW
    cpu_adam_impl: TorchAdamImpl = Field("fused", description=
        "torch AdamW implementation of the CPU part (megatron/core/optimizer/__init__.py passes fused=True)")
    # --fine-grained-activation-offloading
    activation_offload: bool = Field(False, description=
        "Activations to host memory after forward and back before backward instead of recomputation (needs "
        "training.activation_checkpointing: false) (--fine-grained-activation-offloading: side-stream copies)")
    # Megatron is launched by torchrun (pretrain_gpt.py) or Ray (NeMo-RL, verl), both of which set
    # OMP_NUM_THREADS=1 per process unless told otherwise: as fsdp2_offload's launcher knob.
    launcher: Launcher = Field("torchrun", description=
        "torchrun sets OMP_NUM_THREADS=1 with more than one process per node (CPU Adam on one thread per rank) unless "
        "cluster.cpu_threads_per_rank says otherwise; other: the launch's cores (torchrun or Ray, as fsdp2_offload's)")

    def rank_threads_default(self, per_node: int, launched: int) -> int:
        return launcher_threads(self.launcher, per_node, launched)

    @model_validator(mode="after")
    def _precision_aware(self) -> MegatronOffloadKnobs:
        if not self.use_precision_aware_optimizer and self.offload_fraction > 0:
            raise ValueError("use_precision_aware_optimizer: Megatron-LM asserts that --optimizer-cpu-offload is "
                             "used with --use-precision-aware-optimizer (megatron/training/arguments.py)")
        return self

    def check_scenario(self, sc: Scenario) -> str | None:
        return activation_offload.recompute_conflict(self.activation_offload, sc)


def _knobs(sc: Scenario) -> MegatronOffloadKnobs:
    assert isinstance(sc.schedule, MegatronOffloadKnobs)
    return sc.schedule


def cpu_elements(tensor_elements: list[int], fraction: float) -> list[bool]:
    """Which tensors go to the CPU: in order, while the elements placed so far are below ``fraction`` of all
    (``offload_params_numel < offload_threshold`` is tested before each parameter is added)."""
    threshold = fraction * sum(tensor_elements)
    placed, out = 0, []
    for n in tensor_elements:
        on_cpu = placed < threshold
        placed += n if on_cpu else 0
        out.append(on_cpu)
    return out


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    dp = sc.cluster.dp * sc.cluster.sequence_parallel
    p = tm.total_params(sc.model)
    tensors = layout.build_tensors(sc.model, layout.param_units(sc.model))
    on_cpu = cpu_elements([t.elements for t in tensors], s.offload_fraction)
    cpu_p = sum(t.elements for t, c in zip(tensors, on_cpu, strict=True) if c) / dp
    gpu_p = p / dp - cpu_p
    gpu = {
        "bf16_params": BF16_BYTES * p,
        "fp32_grad_buffer": FP32_BYTES * p,  # the DDP grad buffer in main_grads_dtype fp32
        # Transformer Engine FusedAdam with fp32 master weights and moments for the GPU part of the shard
        "gpu_optimizer_state": 3 * FP32_BYTES * gpu_p,
        "activations": activation_offload.gpu_activation_bytes(sc) if s.activation_offload else
        tm.activation_bytes_peak(sc.model, sc.training, sequence_parallel=sc.cluster.sequence_parallel),
    }
    host = {
        "fp32_master": FP32_BYTES * cpu_p,  # pinned (pin_cpu_params)
        "adam_moments": 2 * FP32_BYTES * cpu_p,
        "fp32_grads": FP32_BYTES * cpu_p,  # pinned with pin_cpu_grads
    }
    if s.activation_offload:
        host["offloaded_activations"] = activation_offload.host_activation_bytes(sc)
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes=host)


def hybrid_layout(sc: Scenario, costs: Costs, fraction: float) -> layout.Layout:
    """FSDP's per-layer flushes (the grad buckets' reduce-scatter); groups: one per CPU parameter (each its own
    optimizer with the overlap, and the refresh is per parameter either way), one for the GPU part."""
    base = fsdp_layout(sc, costs)
    on_cpu = cpu_elements([t.elements for t in base.tensors], fraction)
    groups: list[Group] = []
    gpu_tensors = tuple(t.index for t, c in zip(base.tensors, on_cpu, strict=True) if not c)
    for t, c in zip(base.tensors, on_cpu, strict=True):
        if c:
            groups.append(Group(len(groups), (t.index,), t.elements))
    if gpu_tensors:
        groups.append(Group(len(groups), gpu_tensors, sum(base.tensors[i].elements for i in gpu_tensors), True))
    return layout.make_layout(base.units, base.tensors, base.flushes, groups)


@dataclass(frozen=True)
class BucketGrads:
    """Gradients stay in the GPU grad buffer; with data parallelism each bucket (a layer here) is
    reduce-scattered as its backward ends (overlap_grad_reduce)."""

    def start(self, ctx: Ctx) -> None:
        del ctx

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del ctx, done

    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None:
        for f in ctx.layout.flushes_at.get(u.index, ()):
            last = op
            if ctx.dp > 1:
                n_all = f.elements * FP32_BYTES
                last = ctx.add(NET, f"grad_reduce_scatter:f{f.index}",
                               ctx.costs.collective_s("reduce_scatter", n_all, ctx.dp), [op], Phase.GRADIENT,
                               Category.COMM, f.unit, (ctx.dp - 1) / ctx.dp * n_all, 0.0, f.index)
            if ctx.boundary:
                for group in ctx.layout.groups_done_by(f.index):
                    done(ctx, group, last)


@dataclass
class HybridStep:
    """``DistributedOptimizer.step()`` over ``HybridDeviceOptimizer`` (module docstring)."""

    overlap: bool
    pin_cpu_grads: bool
    impl: TorchAdamImpl

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx, group, arrival

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        costs, shard = ctx.costs, ctx.layout.p_total / ctx.dp
        opt = Phase.OPTIMIZER
        last = backward_end
        deps = [*arrivals.values(), backward_end]
        if ctx.sc.training.gradient_clipping > 0:
            norm = ctx.gpu_op("grad_norm", costs.gpu_cast_s(shard), deps, opt, Category.OPTIMIZER)
            ctx.host_op("grad_norm_item", 0.0, [norm], opt)  # total_norm.item(): the host waits for the norm
            last = ctx.gpu_op("clip_scale", costs.gpu_cast_s(shard), [norm], opt, Category.OPTIMIZER)
            deps = [last]
        cpu_groups = [g for g in ctx.layout.groups if not g.on_gpu]
        cpu_total = sum(g.elements for g in cpu_groups) / ctx.dp
        # Gradient copies of the CPU part: after everything on the compute stream (wait_stream).
        d2h: dict[int, int] = {}
        prev: int | None = None
        for g in cpu_groups:
            n = g.elements / ctx.dp * FP32_BYTES
            prev = ctx.add(D2H, f"hdo_grad_d2h:g{g.index}", costs.copy_s(n, "d2h", self.pin_cpu_grads),
                           [*deps, prev, ctx.host_issue], Phase.GRADIENT, Category.TRANSFER, -1, n, 0.0, g.index)
            if not self.pin_cpu_grads:
                ctx.host_issue = prev  # from/to pageable memory the copy blocks the host
            d2h[g.index] = prev
        if not self.overlap and prev is not None:
            ctx.compute_gate.append(prev)  # on the compute stream: the GPU optimizer queues behind the copies
        gpu_end = last
        for g in ctx.layout.groups:
            if g.on_gpu:
                gpu_end = gpu_adam(ctx, g, deps)
        threads = ctx.cpu.optimizer_cores
        ready: list[int] = []
        if self.overlap:
            for g in cpu_groups:
                ctx.host_op(f"hdo_wait_d2h:g{g.index}", 0.0, [d2h[g.index]], opt, group=g.index)
                ctx.host_op(f"torch_adamw_{self.impl}:g{g.index}",
                            torch_adam_s(costs, g.elements / ctx.dp, self.impl, False, threads, cpu_total),
                            [], opt, Category.OPTIMIZER, group=g.index)
                ready.append(self._copy_back(ctx, g, gpu_end))
        elif cpu_groups:
            ctx.host_op("hdo_wait_d2h", 0.0, list(d2h.values()), opt)
            ctx.host_op(f"torch_adamw_{self.impl}", torch_adam_s(costs, cpu_total, self.impl, False, threads,
                                                                 cpu_total), [], opt, Category.OPTIMIZER)
            ready = [self._copy_back(ctx, g, gpu_end) for g in cpu_groups]
        if ready:
            ctx.compute_gate.append(ready[-1])  # the h2d stream's event, waited on by the compute stream
        final = [*ready[-1:], gpu_end]
        if ctx.dp > 1:
            # The distributed optimizer all-gathers the updated bf16 parameters across data-parallel ranks.
            n_all = ctx.layout.p_total * BF16_BYTES
            gather = ctx.add(NET, "param_allgather", costs.collective_s("all_gather", n_all, ctx.dp), final,
                             Phase.REFRESH, Category.COMM, -1, (ctx.dp - 1) / ctx.dp * n_all)
            ctx.compute_gate.append(gather)
            final = [gather]
        return {g.index: final for g in ctx.layout.groups}

    def _copy_back(self, ctx: Ctx, g: Group, gpu_end: int) -> int:
        """The post-step hook's copy into the bf16 GPU parameter: a CPU cast into a pageable temporary and its
        copy, after the compute stream's work (the H2D stream waits for it; pageable copies wait for their
        stream), blocking the host."""
        shard = g.elements / ctx.dp
        dur = ctx.costs.ds_refresh_s(shard, ctx.cpu.bulk_cores, False, "zero3_offload")
        op = ctx.add(H2D, f"hdo_param_h2d:g{g.index}", dur, [gpu_end, ctx.host_issue], Phase.REFRESH,
                     Category.TRANSFER, -1, shard * BF16_BYTES, 0.0, g.index)
        ctx.host_issue = op
        return op


def choices(sc: Scenario, machine: Machine) -> dict[str, str]:
    s = _knobs(sc)
    return {"cpu_threads_per_rank": str(machine.threads_per_rank), "cpu_adam": f"torch AdamW {s.cpu_adam_impl}",
            "offload_fraction": f"{s.offload_fraction:g}"}


def adam_source(sc: Scenario, costs: Costs) -> str:
    return torch_adam_source(costs, _knobs(sc).cpu_adam_impl, False)


def mcore(sc: Scenario, costs: Costs, s: MegatronOffloadKnobs, machine: Machine) -> Recipe:
    return Recipe(
        layout=hybrid_layout(sc, costs, s.offload_fraction),
        cpu=cpu.one_process(machine.threads_per_rank, "torch"),
        weights=Replicated(),  # bf16 weights resident in HBM on every rank
        grads=BucketGrads(),
        step=HybridStep(s.overlap_d2h_h2d, s.pin_cpu_grads, s.cpu_adam_impl),
        activations=activation_offload.ActivationsOffloaded() if s.activation_offload else ActivationsOnGpu(),
    )


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    return plan_for(sc, costs, mcore(sc, costs, _knobs(sc), machine))


# What ``sosim tune`` moves: the offload fraction (memory: HBM for host), the D2H/H2D overlap, activation offload.
TUNE_SPACE: tuple[Knob, ...] = (
    Knob("schedule.offload_fraction", "F", "--optimizer-offload-fraction", (0.0, 0.25, 0.5, 0.75, 1.0),
         refine="linear", bounds=(0.0, 1.0), memory=True, fmt=fmt_float),
    Knob("schedule.overlap_d2h_h2d", "overlap", "--overlap-cpu-optimizer-d2h-h2d", (False, True), fmt=fmt_onoff),
    Knob("schedule.activation_offload", "act_offload", "--fine-grained-activation-offloading", (False, True),
         structural=True, memory=True, fmt=fmt_onoff),
    OMP_THREADS,
)
