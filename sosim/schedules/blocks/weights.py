"""Weight sources, activation placement and framework hooks: what a unit's compute waits for.

A weight source is swappable: a new tier (NVMe, a neighbour's host memory) is a class with ``before_use``
that adds the ops bringing a unit's weights to the GPU and returns the ones its compute must wait for.
"""

from __future__ import annotations

from dataclasses import dataclass

from sosim.engine.plan import D2H, H2D, NET, Category, Phase
from sosim.inputs.units import BF16_BYTES
from sosim.schedules.blocks.driver import Ctx
from sosim.schedules.blocks.layout import Unit


def _gather(ctx: Ctx, u: Unit, phase: Phase, deps: list[int]) -> list[int]:
    """ZeRO-3: each rank holds 1/dp of the weights; the unit's weights are all-gathered before use."""
    if ctx.dp <= 1 or not u.params:
        return deps
    n_bytes = u.params * BF16_BYTES
    tag = "fwd" if phase is Phase.FORWARD else "bwd"
    op = ctx.add(NET, f"allgather_{tag}:{u.name}", ctx.costs.collective_s("all_gather", n_bytes, ctx.dp), deps,
                 phase=phase, category=Category.COMM, layer=u.index, n_bytes=(ctx.dp - 1) / ctx.dp * n_bytes)
    return [op]


@dataclass(frozen=True)
class Replicated:
    """bf16 weights resident in HBM on every rank (ZeRO-1/2, DDP): nothing to wait for."""

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        del ctx, u, phase
        return []

    def adds_nothing(self, ctx: Ctx) -> bool:
        """``before_use`` adds no op and returns [] for every unit of ``ctx``'s plan (the driver skips it)."""
        del ctx
        return True


@dataclass(frozen=True)
class Partitioned:
    """ZeRO-3 weights resident in HBM, each rank holding its partition: all-gathered per unit and pass."""

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        return _gather(ctx, u, phase, [])

    def adds_nothing(self, ctx: Ctx) -> bool:
        """One rank holds all of its weights: nothing to gather (the driver skips ``before_use``)."""
        return ctx.dp <= 1


@dataclass(frozen=True)
class HostStreamed:
    """Weights in host memory, copied to the GPU per layer ``prefetch_layers`` ahead of use, in forward and
    again in backward (ZeRO-Infinity's ``offload_param: cpu``, SuperOffload's weight-flow); with dp ranks each
    copies its 1/dp shard, then the layer is all-gathered.

    ``bytes_per_param``: 2 (bf16) or 4 (fp32, cast on the GPU as it arrives). The copy of a layer may start
    once the layer ``prefetch_layers`` before it has been computed (its buffer is then free).
    """

    prefetch_layers: int
    bytes_per_param: float

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        if not u.is_layer:
            return _gather(ctx, u, phase, [])
        p = self.prefetch_layers
        buffer_free = ctx.computed[-1 - p:-p or None][:1]
        tag = "fwd" if phase is Phase.FORWARD else "bwd"
        # Each rank holds 1/dp of the weights in host memory (ZeRO-3 partitions before it offloads): it copies
        # its own shard, and the all-gather below assembles the layer (partitioned_param_coordinator fetches
        # the rank's partition; the all-gather follows).
        n_bytes = u.params * self.bytes_per_param / ctx.dp
        fetch = ctx.add(H2D, f"fetch_{tag}:{u.name}", ctx.costs.copy_s(n_bytes, "h2d", True), buffer_free,
                        phase=Phase.FETCH, category=Category.TRANSFER, layer=u.index, n_bytes=n_bytes)
        return _gather(ctx, u, phase, [fetch])


@dataclass(frozen=True)
class CpuParamsFetched:
    """DeepSpeed 0.19.8 ZeRO-3 with ``offload_param: cpu`` (ZeRO-Infinity's CPU tier) on the host thread.

    ``partitioned_param_coordinator.fetch_sub_module`` per sub-module: on one rank ``NoGatherCoalescedHandle``
    copies each parameter from the pinned flat host buffer (``ds_tensor.data.to(device, non_blocking=True)``,
    on the fetch stream, prefetched ahead of use) and then ``synchronize()``s that stream: the host, which
    issues the layer's kernels, waits until the layer's copy has landed and pays a per-tensor cost
    (``s_per_tensor``, measured: sosim/costs/offload_mechanisms.py). Norm scales and biases are below
    ``stage3_param_persistence_threshold`` and stay on the GPU (``tensors_per_layer`` counts the others).
    With activation checkpointing the backward's recompute fetches the layer again; without it the layer
    measured (rows ``layer z3_offload_param``) showed no fetch cost in backward. With dp ranks each copies its
    shard and the layer is all-gathered after the copy."""

    streamed: HostStreamed
    s_per_tensor: float
    tensors_per_layer: int
    refetch_in_backward: bool

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        tag = "fwd" if phase is Phase.FORWARD else "bwd"
        if u.is_layer:
            deps, tensors = self.streamed.before_use(ctx, u, phase), self.tensors_per_layer
        elif u.params > 0:
            # The embedding and the output head are offloaded too (one tensor each, above the threshold).
            n_bytes = u.params * self.streamed.bytes_per_param / ctx.dp
            fetch = ctx.add(H2D, f"fetch_{tag}:{u.name}", ctx.costs.copy_s(n_bytes, "h2d", True), [],
                            phase=Phase.FETCH, category=Category.TRANSFER, layer=u.index, n_bytes=n_bytes)
            deps, tensors = _gather(ctx, u, phase, [fetch]), 1
        else:
            return []
        if phase is Phase.FORWARD or self.refetch_in_backward:
            ctx.host_op(f"param_fetch_wait_{tag}:{u.name}", self.s_per_tensor * tensors, deps, phase,
                        Category.HOOK, u.index)
        return deps


class CheckpointsOnHost:
    """Weight-flow: each layer's activation checkpoint goes to host memory after its forward and comes back
    before its backward."""

    def __init__(self) -> None:
        self._off: dict[int, int] = {}

    def _bytes(self, ctx: Ctx) -> float:
        t = ctx.sc.training
        tokens = t.micro_batch * t.seq_len // ctx.sc.cluster.sequence_parallel
        return float(ctx.sc.model.hidden * BF16_BYTES * tokens)

    def after_forward(self, ctx: Ctx, u: Unit, op: int) -> None:
        if not (u.is_layer and ctx.sc.training.activation_checkpointing):
            return
        n = self._bytes(ctx)
        self._off[u.index] = ctx.add(D2H, f"ckpt_d2h:{u.name}", ctx.costs.copy_s(n, "d2h", True), [op],
                                     phase=Phase.CHECKPOINT, category=Category.TRANSFER, layer=u.index, n_bytes=n)

    def before_backward(self, ctx: Ctx, u: Unit) -> list[int]:
        off = self._off.pop(u.index, None)
        if off is None:
            return []
        n = self._bytes(ctx)
        return [ctx.add(H2D, f"ckpt_h2d:{u.name}", ctx.costs.copy_s(n, "h2d", True), [off],
                        phase=Phase.CHECKPOINT, category=Category.TRANSFER, layer=u.index, n_bytes=n)]


@dataclass(frozen=True)
class Stage3Hooks:
    """DeepSpeed ZeRO-3's module hooks (``runtime/zero/parameter_offload.py``: pre/post forward and backward
    hooks that fetch, release and re-partition each submodule's parameters) run on the host thread before
    the layer's kernels are issued. The GPU waits only when the host work is longer than the GPU's queue:
    each layer's compute depends on its hook op, and the hooks run back to back on the host thread.
    Durations per decoder layer come from the cost model (``stage3_hook_s``, measured or estimated)."""

    fwd_s: float
    bwd_s: float

    def around(self, ctx: Ctx, u: Unit, phase: Phase) -> None:
        if not u.is_layer:
            return
        if phase is Phase.FORWARD:
            name, duration = f"stage3_hooks_fwd:{u.name}", self.fwd_s
        else:
            name, duration = f"stage3_hooks_bwd:{u.name}", self.bwd_s
        # ctx.host_op, inlined (once per layer and pass). ctx.add's arguments after deps, by position: phase,
        # category, layer, n_bytes, flops, group.
        ctx.host_issue = ctx.add(ctx.cpu.host, name, duration, [ctx.host_issue], phase, Category.HOOK, u.index,
                                 0.0, 0.0, -1)


@dataclass(frozen=True)
class HostSyncsInBackward:
    """DeepSpeed ZeRO-1/2's overflow tracker truth-tests a CUDA scalar per parameter tensor during backward
    (``stage_1_and_2.py``): the host waits for the stream once per tensor and the GPU's queue runs dry each
    time. Modelled as ``sync_s`` of GPU time per unit, on the compute stream before the unit's backward."""

    sync_s: float

    def around(self, ctx: Ctx, u: Unit, phase: Phase) -> None:
        if phase is Phase.BACKWARD and self.sync_s > 0:
            ctx.gpu_op(f"host_syncs:{u.name}", self.sync_s, (), phase, Category.SYNC, u.index)
