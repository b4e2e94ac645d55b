"""Pieces the ZeRO-3 family (ZeRO-3 offload, ZeRO-Infinity, SuperOffload) shares: DeepSpeed's stage-3
layout and hooks, and the memory footprint. Each system's module assembles its recipe from these and from
the blocks in driver/weights/gradients/steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sosim.costs.analytic import hooked_modules_per_layer
from sosim.engine.plan import Category, Phase
from sosim.hardware import model as tm
from sosim.hardware.machine import zero_group
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks import layout

# The stage-3 systems' shared knob meanings (ZeRO-3 offload, ZeRO-Infinity, SuperOffload): one text for the
# knob classes' field descriptions and so for docs/knobs.md.
SUB_GROUP_DOC = "Optimizer sub-group, in elements (DeepSpeed sub_group_size)"
BUCKET_DOC = (
    "Gradient bucket, MB of bf16 gradients. deepspeed: reduce_bucket_size x 2 B, flushed when the next gradient "
    "would overflow it (a bucket smaller than a layer splits its gradients); ideal: the paper's transfer bucket, "
    "sent once full")
OVERLAP_DOC = "Gradient copies on a side stream (DeepSpeed overlap_comm); false: on the compute stream"

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario
    from sosim.schedules.blocks.driver import Ctx
    from sosim.schedules.blocks.layout import Unit

# fp32 master + Adam m, v + fp32 gradient: bytes of optimizer state per parameter wherever it lives.
OPT_STATE_BYTES = 16.0
# DeepSpeed stage 3's host buffers per parameter: fp32 master, m, v, the sub-group's fp32 gradient
# (initialize_optimizer_states) and the bf16 gradient buffer of every parameter
# (_setup_for_real_optimizer: grad_partitions_flat_buffer): 4 + 8 + 4 + 2 = 18 B.
DEEPSPEED_CPU_STATE_BYTES = 18.0


def deepspeed_layout(sc: Scenario, costs: Costs, sub_group_elements: float, bucket_mb: float,
                     ratio: float) -> layout.Layout:
    """Reduce buckets flushed on overflow, sub-groups of ``sub_group_size`` partition elements in registration
    order, the first int((1 - ratio) * n) sub-groups updated on the GPU."""
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    flushes = layout.make_flushes(tensors, layout.bucket_elements_from_mb(bucket_mb), "overflow")
    # Sub-groups are cut on each rank's partition sizes: sub_group_size partition elements = x dp elements.
    groups = layout.gpu_groups_by_ratio(layout.subgroups(tensors, sub_group_elements * zero_group(sc)), ratio)
    return layout.make_layout(units, tensors, flushes, groups)


@dataclass(frozen=True)
class InterleavedHooks:
    """DeepSpeed ZeRO-3's module hooks as they run: per submodule, between that submodule's kernel launches.

    ``DeepSpeedZeRoOffload._register_deepspeed_module`` (parameter_offload.py) hooks every submodule (q_proj,
    k_proj, ..., down_proj, the norms), so a decoder layer's host work is a sequence of (hook, kernels) pieces,
    one per parameter-holding submodule (its cost follows modules, not tensors: STAGE3_HOOK_S_PER_MODULE), and
    the GPU starts the layer as soon as the first piece is issued. Where the host
    thread has just waited for the stream (SuperOffload's per-flush sync in ``partition_grads``, ZeRO-3's
    ``param_reduce_events`` back-pressure), the GPU's queue is empty and it waits for that first piece only;
    the rest of the layer's hooks run while the GPU computes what was issued. The GPU still cannot finish the
    layer before the host has issued it: when the hooks are longer than the layer's GPU pass, the GPU waits for
    the difference. So each layer's hook time is split into a lead (the part the layer's compute waits for:
    one module's share, or the host's excess over the GPU pass if larger) and a remainder the host thread runs
    alongside the compute. (sosim.schedules.blocks.weights.Stage3Hooks, which this replaces for DeepSpeed's stage-3
    systems, made the layer's compute wait for all of its hooks: after a sync the whole block was GPU idle.)
    """

    fwd_s: float
    bwd_s: float
    fwd_gpu_s: float  # the layer's GPU pass the hooks interleave with (forward; backward incl. recompute)
    bwd_gpu_s: float
    modules: int  # pieces per layer: the layer's parameter-holding submodules (each hooked, fetched, released)

    def around(self, ctx: Ctx, u: Unit, phase: Phase) -> None:
        if not u.is_layer:
            return
        forward = phase is Phase.FORWARD
        hook_s, gpu_s = (self.fwd_s, self.fwd_gpu_s) if forward else (self.bwd_s, self.bwd_gpu_s)
        lead_s = max(hook_s / self.modules, hook_s - gpu_s)
        tag = "fwd" if forward else "bwd"
        lead = ctx.add(ctx.cpu.host, f"stage3_hooks_{tag}:{u.name}", lead_s, [ctx.host_issue], phase, Category.HOOK,
                       u.index, 0.0, 0.0, -1)
        if hook_s > lead_s:
            # Serial resources run their ops in creation order: later host ops still come after this one.
            ctx.add(ctx.cpu.host, f"stage3_hooks_{tag}_rest:{u.name}", hook_s - lead_s, [lead], phase, Category.HOOK,
                    u.index, 0.0, 0.0, -1)
        ctx.host_issue = lead


def deepspeed_hooks(sc: Scenario, costs: Costs) -> InterleavedHooks:
    """Per-layer host-side hook cost, forward and backward; a checkpointed layer's recompute in backward runs
    the forward hooks again."""
    tokens = tm.tokens_per_gpu(sc)
    fwd = costs.stage3_hook_s(tokens, False)
    bwd = costs.stage3_hook_s(tokens, True) + (fwd if sc.training.activation_checkpointing else 0.0)
    return InterleavedHooks(fwd, bwd, costs.layer_fwd_s(), costs.layer_bwd_s(),
                            hooked_modules_per_layer(sc.model))


def footprint(sc: Scenario, *, weight_flow: bool, offload_checkpoints: bool, gpu_fraction: float,
              cpu_state_bytes: float, gpu_buffer_bytes: float, prefetch_layers: int = 1) -> MemoryUsage:
    """Per-rank memory of a ZeRO-3 system: optimizer state on the host except the GPU-updated fraction,
    bf16 weights in HBM (partitioned, plus the gathered working set) or streamed from the host."""
    m, t = sc.model, sc.training
    p = tm.total_params(m)
    dp = zero_group(sc)
    layer_bytes = tm.layer_params(m) * BF16_BYTES
    tokens = t.micro_batch * t.seq_len // sc.cluster.sequence_parallel
    gpu: dict[str, float] = {"transfer_buffers": gpu_buffer_bytes}
    cpu: dict[str, float] = {"optimizer_state": cpu_state_bytes * p * (1 - gpu_fraction) / dp}
    if weight_flow:
        # Only the layers being computed or prefetched are resident; embedding and head stay.
        gpu["bf16_params_working_set"] = (1 + prefetch_layers) * layer_bytes + tm.embedding_params(m) * BF16_BYTES
        cpu["bf16_params"] = BF16_BYTES * p
        # Only checkpoints can be offloaded: without checkpointing every layer keeps its activations in HBM.
        offload_acts = offload_checkpoints and t.activation_checkpointing
        act = tm.activation_bytes_peak(m, t, layers_on_gpu=0 if offload_acts else None,
                                       sequence_parallel=sc.cluster.sequence_parallel)
        if offload_checkpoints and t.activation_checkpointing:
            cpu["activation_checkpoints"] = m.layers * m.hidden * BF16_BYTES * tokens
    else:
        gpu["bf16_params"] = BF16_BYTES * p / dp
        if dp > 1:  # gathered working set: the unit being computed and the one prefetched
            gpu["bf16_params_gathered"] = 2 * layer_bytes
        act = tm.activation_bytes_peak(m, t, sequence_parallel=sc.cluster.sequence_parallel)
    gpu["activations"] = act
    if gpu_fraction > 0:
        gpu["gpu_optimizer_state"] = OPT_STATE_BYTES * p * gpu_fraction / dp
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes=cpu)


def offload_footprint(sc: Scenario, *, implementation: str, bucket_mb: float, weight_flow: bool,
                      prefetch_layers: int = 1) -> MemoryUsage:
    """ZeRO-3 with the whole optimizer on the CPU (ZeRO-3 offload; ZeRO-Infinity with weights streamed):
    DeepSpeed's host buffers and gradient-path HBM, or the paper schedules' two transfer buckets."""
    ds = implementation == "deepspeed"
    return footprint(
        sc, weight_flow=weight_flow, offload_checkpoints=False, gpu_fraction=0.0,
        cpu_state_bytes=DEEPSPEED_CPU_STATE_BYTES if ds else OPT_STATE_BYTES,
        gpu_buffer_bytes=deepspeed_gpu_buffers(sc, bucket_mb) if ds else ideal_gpu_buffers(bucket_mb),
        prefetch_layers=prefetch_layers)


def deepspeed_gpu_buffers(sc: Scenario, bucket_mb: float) -> float:
    """HBM DeepSpeed stage 3 keeps for the gradient path: the contiguous reduce bucket (bf16,
    ``reduce_bucket_size`` elements) and, while a flush runs, a bf16 and an fp32 copy of its largest
    gradient (``partition_grads``)."""
    largest = max(*tm.layer_tensor_sizes(sc.model), sc.model.vocab * sc.model.hidden)
    return layout.bucket_elements_from_mb(bucket_mb) * BF16_BYTES + largest * (BF16_BYTES + FP32_BYTES)


def ideal_gpu_buffers(bucket_mb: float) -> float:
    """Two fp32 transfer buckets in HBM (one filling, one in flight)."""
    return 2.0 * layout.bucket_elements_from_mb(bucket_mb) * FP32_BYTES


def deepspeed_gpu_fraction(sc: Scenario, sub_group_elements: float, ratio: float) -> float:
    """Fraction of the parameters in the sub-groups DeepSpeed keeps on the GPU for ``ratio``."""
    if ratio >= 1.0:
        return 0.0
    tensors = layout.build_tensors(sc.model, layout.param_units(sc.model))
    groups = layout.gpu_groups_by_ratio(layout.subgroups(tensors, sub_group_elements * zero_group(sc)), ratio)
    return sum(g.elements for g in groups if g.on_gpu) / sum(g.elements for g in groups)
