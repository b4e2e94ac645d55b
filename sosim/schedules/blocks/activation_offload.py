"""Activation offload instead of recomputation: each layer's saved activations go to host memory after its
forward and come back before its backward, over the CPU-GPU link (a block the FSDP2 and Megatron systems take
with ``activation_offload: true``).

What the frameworks do: Megatron-Core's ``--fine-grained-activation-offloading`` (PR 1969,
``megatron/core/pipeline_parallel/fine_grained_activation_offload.py``) and Transformer Engine's CPU offload
(``transformer_engine/pytorch/cpu_offload.py``, used by Megatron-Core 0.15's ``--cpu-offloading``) copy a
layer's saved tensors to pinned host buffers on a side stream (D2H) while the next layer computes, and in
backward reload layer N on another stream while layer N+1's backward runs ("layer-staggered reload");
PyTorch's ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` does the same per saved tensor (without the
staggered prefetch). Checkpointing is off: backward does no recompute (backward = 2x forward FLOPs), and the
link carries every layer's full activations twice.

Modelled: the full saved activations of a layer (:func:`sosim.hardware.model.activation_bytes_per_token_layer`,
bf16, flash attention) per micro-batch, pinned copies; the reload of layer N may start once the backward of
layer N + 1 + ``prefetch_layers`` - 1 has finished (its buffer is free), i.e. one layer ahead by default. Not
modelled: a partial selection of modules (Megatron's ``--offload-modules``); the copies' contention with
FSDP2's own parameter copies is the link's (they share H2D/D2H). ``streams: false`` is PyTorch's
``save_on_cpu``, whose copies are serial with compute (:class:`ActivationsOffloaded`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sosim.engine.plan import D2H, H2D, Category, Phase
from sosim.hardware import model as tm
from sosim.inputs.config import ModelSpec, Scenario, TrainingSpec
from sosim.schedules.blocks.driver import Ctx
from sosim.schedules.blocks.layout import Unit

# Layers whose activations are on the GPU at once besides the one computing: the one being copied out (or
# reloaded ahead) and the one being computed (the frameworks' double buffering).
RESIDENT_LAYERS = 2


def layer_activation_bytes(m: ModelSpec, t: TrainingSpec, sequence_parallel: int = 1) -> float:
    """Bytes one layer saves for backward in one micro-batch without checkpointing (what is offloaded)."""
    tokens = t.micro_batch * t.seq_len // sequence_parallel
    return tm.activation_bytes_per_token_layer(m) * tokens


def gpu_activation_bytes(sc: Scenario) -> float:
    """Peak activations on the GPU with offload: a few layers' full activations and the logits."""
    t = sc.training
    no_ckpt = t.model_copy(update={"activation_checkpointing": False})
    return tm.activation_bytes_peak(sc.model, no_ckpt, layers_on_gpu=RESIDENT_LAYERS,
                                    sequence_parallel=sc.cluster.sequence_parallel)


def host_activation_bytes(sc: Scenario, with_head: bool = False) -> float:
    """Host memory the offloaded activations of every layer (and the head's) take (pinned, one micro-batch)."""
    layers = sc.model.layers * layer_activation_bytes(sc.model, sc.training, sc.cluster.sequence_parallel)
    return layers + (head_activation_bytes(sc) if with_head else 0.0)


def head_activation_bytes(sc: Scenario) -> float:
    """What the output head saves for backward: the logits and the fp32 softmax workspace, 6 B per token per
    vocabulary entry (the logits term of :func:`sosim.hardware.model.activation_bytes_peak`)."""
    t = sc.training
    tokens = t.micro_batch * t.seq_len // sc.cluster.sequence_parallel
    return 6.0 * tokens * sc.model.vocab


def recompute_conflict(offload: bool, sc: Scenario) -> str | None:
    """The contradiction of offloading activations while also recomputing them (None: none): offloading is the
    alternative to activation checkpointing in every framework that has it, never an addition to it."""
    if offload and sc.training.activation_checkpointing:
        return ("schedule.activation_offload: activations are offloaded instead of recomputed; set "
                "training.activation_checkpointing: false")
    return None


@dataclass
class ActivationsOffloaded:
    """Each layer's saved activations to host memory after its forward, back before its backward.

    ``streams`` (Megatron's fine-grained offload, TE, torchao/torchtune ``OffloadActivations``): the copies run on
    side streams, overlapped with the next layer's compute, and the reload runs one layer ahead. Without
    (``torch.autograd.graph.save_on_cpu(pin_memory=True)``, PyTorch's own): each saved tensor is copied into a
    pinned buffer with a blocking ``copy_`` (the host waits, the compute stream idles) and copied back on the
    compute stream when backward unpacks it; every saved tensor goes, the output head's logits too."""

    streams: bool = True
    prefetch_layers: int = 1
    _off: dict[int, int] = field(default_factory=dict)

    def _bytes(self, ctx: Ctx, u: Unit) -> float:
        if u.is_layer:
            return layer_activation_bytes(ctx.sc.model, ctx.sc.training, ctx.sc.cluster.sequence_parallel)
        head = u.index == len(ctx.layout.units) - 1
        return head_activation_bytes(ctx.sc) if head and not self.streams else 0.0

    def after_forward(self, ctx: Ctx, u: Unit, op: int) -> None:
        n = self._bytes(ctx, u)
        if n <= 0:
            return
        deps = [op] if self.streams else [op, ctx.host_issue]
        off = ctx.add(D2H, f"act_d2h:{u.name}", ctx.costs.copy_s(n, "d2h", True), deps, Phase.CHECKPOINT,
                      Category.TRANSFER, u.index, n)
        if not self.streams:
            ctx.host_issue = off  # a blocking copy_: nothing more is issued until it is done
        self._off[u.index] = off

    def before_backward(self, ctx: Ctx, u: Unit) -> list[int]:
        off = self._off.pop(u.index, None)
        if off is None:
            return []
        n = self._bytes(ctx, u)
        if self.streams:
            # The reload buffer of this layer is free once the backward ``prefetch_layers`` layers later in the
            # backward order than the one now computing has finished (computed[-1] is the layer just issued).
            p = self.prefetch_layers
            after = ctx.computed[-1 - p:-p or None][:1]
        else:
            after = ctx.computed[-1:]  # on the compute stream: after what it ran before
        return [ctx.add(H2D, f"act_h2d:{u.name}", ctx.costs.copy_s(n, "h2d", True), [off, *after],
                        Phase.CHECKPOINT, Category.TRANSFER, u.index, n)]
