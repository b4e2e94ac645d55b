"""PyTorch FSDP2 with ``CPUOffloadPolicy``: ``fully_shard(layer, offload_policy=CPUOffloadPolicy(pin_memory))``
on every decoder layer, then on the root (torchtitan's ``apply_fsdp``; ``[training] enable_cpu_offload``).

What torch does (torch/distributed/fsdp/_fully_shard, read at torch 2.13; the same path since 2.6):

* each rank's shard of every parameter lives on the CPU in its original dtype (fp32: the master weights),
  pinned when ``pin_memory`` (``FSDPParam._init_sharded_param``); gradients come back to the CPU in
  ``reduce_dtype`` (fp32 with torchtitan's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``);
* before a unit runs, its shard is copied to the GPU (``all_gather_inputs``: ``.to(device,
  non_blocking=True)``, 4 B/param), cast to bf16 and all-gathered; the pre-forward hooks run ahead of the GPU
  (implicit forward prefetch) and backward prefetches one unit (``_backward_prefetch``), with at most the
  unit in use and the next one unsharded: a unit's copy waits until the one two before it is computed. On
  one rank there is no all-gather: ``unshard`` returns early (``world_size == 1``) and ``wait_for_unshard``
  copies the shards in on the compute stream right before the unit runs, so the copies are serial with
  compute (the lent H200's steps show it: forward = copies + compute, calibration/nvidia-h200-2026-12-01-fsdp2);
* after forward a layer is resharded (``reshard_after_forward``; the root is not, torchtitan's choice) and
  gathered again in backward, where checkpointing recomputes inside the same unshard;
* after each unit's backward (``foreach_reduce``) its bf16 gradient is cast to fp32, reduce-scattered and
  copied to the CPU: ``non_blocking`` only with pinned memory, else a blocking copy on the host thread; the
  root's gradients (embedding, final norm, output head) leave last, in the root's final backward callback,
  which then waits for every copy (``FSDPParamGroup.finalize_backward``: ``grad_offload_event.synchronize()``);
* ``optimizer.step()`` runs torch's AdamW on the CPU DTensor shards in the training process on torch's
  intra-op threads (``adam_impl``: for-loop / foreach / fused, :mod:`sosim.costs.torch_adam`), after the
  optional ``clip_grad_norm_`` pass (CPU); the next forward's first copy waits for it.

Host cores each rank really gets: ``cluster.cpu_threads_per_rank`` when the run states it; else, launched by
torchrun (``launcher: torchrun``), ``OMP_NUM_THREADS=1`` for every process when there is more than one per
node (torch/distributed/run.py sets it unless the environment does): FSDP2's CPU Adam on one thread per rank,
the starvation users meet; one process per node keeps torch's default (the rank's cores).

``activation_offload``: activations offloaded instead of recomputed (:mod:`sosim.schedules.blocks.activation_offload`).
Not modelled: FSDP2's Python hooks on the host thread (tens of microseconds per unit), explicit prefetch
counts beyond one, HSDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from sosim.costs.torch_adam import TorchAdamImpl, torch_adam_s, torch_adam_source
from sosim.engine.plan import D2H, GPU, GPU_CAST, H2D, NET, Category, Phase, Plan
from sosim.hardware import model as tm
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.config import ScheduleKnobs
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks import activation_offload, cpu, layout
from sosim.schedules.blocks.driver import ActivationsOnGpu, Ctx, DoneCallback, Recipe, plan_for
from sosim.schedules.blocks.layout import Flush, Group, Unit
from sosim.schedules.blocks.tuning import OMP_THREADS, Knob, fmt_onoff

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.hardware.machine import Machine
    from sosim.inputs.config import Scenario

Launcher = Literal["torchrun", "other"]


class Fsdp2OffloadKnobs(ScheduleKnobs):
    """FSDP2 CPU offload knobs (torchtitan's TOML and ``fully_shard``'s arguments)."""

    system: Literal["fsdp2_offload"]
    # torch.optim.AdamW's implementation: torchtitan [optimizer] implementation (default "fused"); plain torch
    # on CPU tensors defaults to the for-loop.
    adam_impl: TorchAdamImpl = Field("fused", description=
        "torch.optim.AdamW's implementation on the CPU shards (torchtitan [optimizer] implementation, default fused; "
        "plain torch on CPU tensors defaults to the for-loop)")
    # CPUOffloadPolicy(pin_memory=True), torch's default
    pin_memory: bool = Field(True, description="CPUOffloadPolicy(pin_memory=...): pinned host shards, torch's default")
    # fully_shard's default for the layers (the root is never resharded)
    reshard_after_forward: bool = Field(True, description=
        "Layers freed after forward and copied in again for backward (fully_shard's default; the root never is)")
    launcher: Launcher = Field("torchrun", description=
        "torchrun sets OMP_NUM_THREADS=1 with more than one process per node (CPU Adam on one thread per rank) unless "
        "cluster.cpu_threads_per_rank says otherwise; other: the launch's cores")
    activation_offload: bool = Field(False, description=
        "Activations to host memory after forward and back before backward instead of recomputation (needs "
        "training.activation_checkpointing: false) (torch save_on_cpu or side streams: activation_offload_streams)")
    # How: False = torch.autograd.graph.save_on_cpu(pin_memory=True) (PyTorch's own, serial with compute);
    # True = copies on side streams with a one-layer reload prefetch (torchao/torchtune OffloadActivations).
    activation_offload_streams: bool = Field(False, description=
        "How activations are offloaded: false = torch.autograd.graph.save_on_cpu(pin_memory=True) (blocking copies, "
        "serial with compute, the head's logits too); true = side-stream copies with a one-layer reload prefetch "
        "(torchao/torchtune OffloadActivations)")

    def rank_threads_default(self, per_node: int, launched: int) -> int:
        return launcher_threads(self.launcher, per_node, launched)

    def check_scenario(self, sc: Scenario) -> str | None:
        """A contradiction between these knobs and the scenario (None: none)."""
        return activation_offload.recompute_conflict(self.activation_offload, sc)


def launcher_threads(launcher: Launcher, per_node: int, launched: int) -> int:
    """Threads of each rank when the run does not state them: torchrun's OMP_NUM_THREADS=1 for more than one
    process per node (torch/distributed/run.py), else what the launch gives (sosim.hardware.machine)."""
    return 1 if launcher == "torchrun" and per_node > 1 else launched


def _knobs(sc: Scenario) -> Fsdp2OffloadKnobs:
    assert isinstance(sc.schedule, Fsdp2OffloadKnobs)
    return sc.schedule


def _root_params(m: Scenario) -> int:
    return tm.embedding_params(m.model)


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    dp = sc.cluster.dp * sc.cluster.sequence_parallel
    p = tm.total_params(sc.model)
    layer_p = tm.layer_params(sc.model)
    root = _root_params(sc)
    # Unsharded bf16 layers at once: the one in use and the prefetched one; all of them when not resharded.
    live_layers = 2 if s.reshard_after_forward else sc.model.layers
    gpu = {
        "root_bf16_params": BF16_BYTES * root,  # unsharded from the first forward to the end of backward
        "layer_bf16_params": BF16_BYTES * layer_p * live_layers,
        "h2d_fp32_shards": FP32_BYTES * layer_p / dp * 2,  # the copied-in shards before the cast
        # a layer's bf16 gradient and its fp32 reduce-scatter buffer, two layers in flight (the D2H of one
        # while the next is reduced)
        "grad_buffers": (BF16_BYTES + FP32_BYTES) * layer_p * 2 + (BF16_BYTES + FP32_BYTES) * root,
        "activations": activation_offload.gpu_activation_bytes(sc) if s.activation_offload else
        tm.activation_bytes_peak(sc.model, sc.training, sequence_parallel=sc.cluster.sequence_parallel),
    }
    shard = p / dp
    host = {
        "fp32_params": FP32_BYTES * shard,  # pinned with pin_memory
        "fp32_grads": FP32_BYTES * shard,
        "adam_moments": 2 * FP32_BYTES * shard,  # exp_avg, exp_avg_sq: zeros_like of the CPU shards
    }
    if s.activation_offload:
        host["offloaded_activations"] = activation_offload.host_activation_bytes(
            sc, with_head=not s.activation_offload_streams)
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes=host)


def fsdp_layout(sc: Scenario, costs: Costs) -> layout.Layout:
    """One flush per layer (at its backward) and the root's (embedding + head) at the end of backward; one
    optimizer group: ``optimizer.step()`` updates every shard after backward."""
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    last = units[-1].index
    flushes: list[Flush] = []
    for u in reversed(units):
        if u.is_layer:
            ts = tuple(t.index for t in tensors if t.unit == u.index)
            flushes.append(Flush(len(flushes), u.index, ts, sum(tensors[i].elements for i in ts)))
    root = tuple(t.index for t in tensors if t.unit in (0, last))
    flushes.append(Flush(len(flushes), 0, root, sum(tensors[i].elements for i in root)))
    return layout.make_layout(units, tensors, flushes, layout.one_group(tensors))


@dataclass
class Fsdp2Weights:
    """Each unit's fp32 shard copied in (H2D), cast to bf16 and all-gathered before use; the root once."""

    pinned: bool
    reshard_after_forward: bool
    prefetch_layers: int = 1
    _root_ready: list[int] = field(default_factory=list)

    def _copy_in(self, ctx: Ctx, name: str, params: float, deps: list[int | None], phase: Phase,
                 layer: int) -> list[int]:
        shard = params / ctx.dp
        n = shard * FP32_BYTES
        # One rank: FSDPParamGroup.unshard returns before the all-gather (world_size == 1) and wait_for_unshard
        # copies each shard in (all_gather_inputs: .to(device) and the bf16 cast) on the current stream, right
        # before the unit runs: the copy is serial with compute, no prefetch (torch/distributed/fsdp/
        # _fully_shard/_fsdp_param_group.py, torch 2.13). Several ranks: the all-gather streams, prefetched.
        serial = ctx.dp <= 1
        if serial:
            deps = [*deps, *ctx.computed[-1:]]
        h2d = ctx.add(H2D, f"fsdp_h2d_{name}", ctx.costs.copy_s(n, "h2d", self.pinned), [*deps, ctx.host_issue],
                      Phase.FETCH, Category.TRANSFER, layer, n)
        if not self.pinned:
            # From pageable memory the copy is synchronous for the host thread (CUDA stages it): the host
            # issues nothing else until it is done.
            ctx.host_issue = h2d
        last = ctx.add(GPU if serial else GPU_CAST, f"fsdp_cast_bf16_{name}", ctx.costs.gpu_cast_s(shard), [h2d],
                       Phase.FETCH, Category.CAST, layer)
        if ctx.dp > 1:
            n_all = params * BF16_BYTES
            last = ctx.add(NET, f"fsdp_allgather_{name}", ctx.costs.collective_s("all_gather", n_all, ctx.dp),
                           [last], phase, Category.COMM, layer, (ctx.dp - 1) / ctx.dp * n_all)
        return [last]

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        forward = phase is Phase.FORWARD
        if not u.is_layer:
            if forward and u.index == 0:
                # The root unit (embedding, final norm, head) is unsharded once, before the embedding.
                self._root_ready = self._copy_in(ctx, "fwd:root", _root_params(ctx.sc), [], phase, 0)
            return list(self._root_ready)
        if not forward and not self.reshard_after_forward:
            return []
        p = self.prefetch_layers
        buffer_free = ctx.computed[-1 - p:-p or None][:1]
        tag = "fwd" if forward else "bwd"
        return self._copy_in(ctx, f"{tag}:{u.name}", u.params, list(buffer_free), phase, u.index)


@dataclass(frozen=True)
class Fsdp2Grads:
    """Per unit after its backward: bf16 -> fp32 cast, reduce-scatter, fp32 shard to the CPU."""

    pinned: bool

    def start(self, ctx: Ctx) -> None:
        del ctx

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del ctx, done

    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None:
        for f in ctx.layout.flushes_at.get(u.index, ()):
            shard = f.elements / ctx.dp
            g, costs = Phase.GRADIENT, ctx.costs
            last = ctx.add(GPU_CAST, f"fsdp_grad_fp32:f{f.index}", costs.gpu_cast_s(f.elements), [op], g,
                           Category.CAST, f.unit, 0.0, 0.0, f.index)
            if ctx.dp > 1:
                n_all = f.elements * FP32_BYTES
                last = ctx.add(NET, f"fsdp_reduce_scatter:f{f.index}",
                               costs.collective_s("reduce_scatter", n_all, ctx.dp), [last], g, Category.COMM,
                               f.unit, (ctx.dp - 1) / ctx.dp * n_all, 0.0, f.index)
            n = shard * FP32_BYTES
            # Accumulating into an existing CPU gradient (grad accumulation) makes the copy blocking too.
            blocking = not self.pinned or ctx.micro > 0
            last = ctx.add(D2H, f"fsdp_grad_d2h:f{f.index}", costs.copy_s(n, "d2h", self.pinned),
                           [last, ctx.host_issue] if blocking else [last], g, Category.TRANSFER, f.unit, n, 0.0,
                           f.index)
            if blocking:
                ctx.host_issue = last
            if ctx.micro > 0:
                last = ctx.host_op(f"fsdp_grad_accumulate:f{f.index}", 3.0 * costs.cpu_norm_s(shard), [last], g,
                                   Category.OPTIMIZER, f.unit, f.index)
            if ctx.boundary:
                for group in ctx.layout.groups_done_by(f.index):
                    done(ctx, group, last)


@dataclass
class TorchCpuStep:
    """``optimizer.step()`` on the CPU shards after backward (and ``clip_grad_norm_`` before it), on the
    training process's host thread and its intra-op threads."""

    impl: TorchAdamImpl
    dtensor: bool

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx, group, arrival

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        shard = ctx.layout.p_total / ctx.dp
        deps = [*arrivals.values(), backward_end]
        if ctx.sc.training.gradient_clipping > 0:
            # clip_grad_norm_ on the CPU shards: a read for the norm, a read and write to scale (12 B/param).
            ctx.host_op("clip_grad_norm", 3.0 * ctx.costs.cpu_norm_s(shard), deps, Phase.OPTIMIZER,
                        Category.OPTIMIZER)
        adam_s = torch_adam_s(ctx.costs, shard, self.impl, self.dtensor, ctx.cpu.optimizer_cores, shard,
                              len(ctx.layout.tensors))
        op = ctx.host_op(f"torch_adamw_{self.impl}", adam_s, deps, Phase.OPTIMIZER, Category.OPTIMIZER)
        return {g.index: [op] for g in ctx.layout.groups}


def choices(sc: Scenario, machine: Machine) -> dict[str, str]:
    s = _knobs(sc)
    return {"cpu_threads_per_rank": str(machine.threads_per_rank), "adam": f"torch AdamW {s.adam_impl} on DTensors",
            "pin_memory": str(s.pin_memory)}


def adam_source(sc: Scenario, costs: Costs) -> str:
    return torch_adam_source(costs, _knobs(sc).adam_impl, True)


def torch2(sc: Scenario, costs: Costs, s: Fsdp2OffloadKnobs, machine: Machine) -> Recipe:
    return Recipe(
        layout=fsdp_layout(sc, costs),
        cpu=cpu.one_process(machine.threads_per_rank, "torch"),
        weights=Fsdp2Weights(s.pin_memory, s.reshard_after_forward),
        grads=Fsdp2Grads(s.pin_memory),
        step=TorchCpuStep(s.adam_impl, dtensor=True),
        activations=activation_offload.ActivationsOffloaded(streams=s.activation_offload_streams)
        if s.activation_offload else ActivationsOnGpu(),
    )




def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    return plan_for(sc, costs, torch2(sc, costs, _knobs(sc), machine))


# What ``sosim tune`` moves (sosim/schedules/blocks/tuning.py): the Adam implementation (torchtitan's one key for it),
# pinning, resharding (memory: all layers' bf16 weights stay when off), activation offload (structural: it
# replaces checkpointing, and moves activations to host memory).
TUNE_SPACE: tuple[Knob, ...] = (
    Knob("schedule.adam_impl", "adam", "torch AdamW implementation ([optimizer] implementation)",
         ("fused", "foreach", "forloop")),
    Knob("schedule.pin_memory", "pin", "CPUOffloadPolicy(pin_memory)", (True, False), fmt=fmt_onoff),
    Knob("schedule.reshard_after_forward", "reshard", "fsdp_reshard_after_forward", (True, False), memory=True,
         fmt=fmt_onoff),
    Knob("schedule.activation_offload", "act_offload", "activation offload instead of recomputation",
         (False, True), structural=True, memory=True, fmt=fmt_onoff),
    OMP_THREADS,
)
