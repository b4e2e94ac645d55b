"""Optimizer steps and parameter refreshes: when each group is updated, where, and how its parameters return.

A step block is built with a refresh block (how updated parameters reach the place the next forward reads
them); both are swappable, and an optimizer-state tier (host memory today; NVMe later) is the ``update``
callable a step runs per group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sosim.engine.plan import H2D, NET, Category, Phase, Resource, ResourceKind
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks.driver import Ctx
from sosim.schedules.blocks.layout import Group

OPT, R = Phase.OPTIMIZER, Phase.REFRESH
CAST, OPTIMIZER, TRANSFER = Category.CAST, Category.OPTIMIZER, Category.TRANSFER
# The paper's parameter casts run on their own side stream: on the gradient casts' stream they would queue
# behind (or ahead of) work they do not depend on.
REFRESH_STREAM = Resource(ResourceKind.GPU_CAST, 1)


def _shard(ctx: Ctx, g: Group) -> float:
    return g.elements / ctx.dp


def _layer(ctx: Ctx, g: Group) -> int:
    """The unit of the group's first tensor (for traces)."""
    return ctx.layout.tensors[g.tensors[0]].unit


def _allgather(ctx: Ctx, g: Group, layer: int, after: int) -> int:
    """ZeRO-1/2's all-gather of the group's refreshed bf16 parameters across the data-parallel ranks."""
    n_all = g.elements * BF16_BYTES
    return ctx.add(NET, f"allgather:g{g.index}", ctx.costs.collective_s("all_gather", n_all, ctx.dp), [after],
                   phase=R, category=Category.COMM, layer=layer, group=g.index, n_bytes=(ctx.dp - 1) / ctx.dp * n_all)


# --- updates: the Adam math of one group --------------------------------------------------------------------
def cpu_adam(ctx: Ctx, g: Group, deps: list[int], name: str = "cpu_adam", resource: Resource | None = None,
             extra_s: float = 0.0) -> int:
    """CPU Adam over one group's partition on the optimizer's cores (fp32 p, g, m, v in host memory)."""
    c = ctx.cpu
    shard = g.elements / ctx.dp  # _shard
    adam = ctx.costs.cpu_adam_s(shard, c.adam, c.optimizer_cores, ctx.layout.p_total / ctx.dp)
    # ctx.add's arguments after deps, by position (once per group and step): phase, category, layer, n_bytes,
    # flops, group.
    return ctx.add(resource or c.optimizer, f"{name}:g{g.index}", adam + extra_s, deps, OPT, OPTIMIZER,
                   _layer(ctx, g), 28.0 * shard, 0.0, g.index)


def gpu_adam(ctx: Ctx, g: Group, deps: list[int]) -> int:
    """Adam on the GPU for a group whose optimizer state stays in HBM."""
    return ctx.gpu_op(f"gpu_adam:g{g.index}", ctx.costs.gpu_adam_s(_shard(ctx, g)), deps, phase=OPT,
                      category=Category.OPTIMIZER, layer=_layer(ctx, g), group=g.index)


def cpu_pass(ctx: Ctx, g: Group, name: str, deps: list[int]) -> int:
    """A streaming read+write of the group's fp32 gradients in the training process (unscale/clip)."""
    shard = _shard(ctx, g)
    return ctx.add(ctx.cpu.bulk, f"{name}:g{g.index}", 2.0 * ctx.costs.cpu_norm_s(shard), deps, phase=OPT,
                   category=Category.OPTIMIZER, layer=_layer(ctx, g), group=g.index, n_bytes=8.0 * shard)


# --- refreshes ---------------------------------------------------------------------------------------------------
class Refresh(Protocol):
    def __call__(self, ctx: Ctx, g: Group, deps: list[int]) -> int: ...


@dataclass(frozen=True)
class CastAndCopy:
    """The paper's refresh, per group as soon as it is updated: cast on the CPU and copy bf16 from pinned
    memory (2 B/param), or copy fp32 and cast on a GPU side stream (4 B/param, SuperOffload's GPU casting).
    ``allgather``: ZeRO-2 across ranks, each rank's updated partition is all-gathered afterwards."""

    cast_on_gpu: bool
    pinned: bool = True
    allgather: bool = False

    def __call__(self, ctx: Ctx, g: Group, deps: list[int]) -> int:
        shard, layer, i, costs = g.elements / ctx.dp, _layer(ctx, g), g.index, ctx.costs
        # ctx.add's arguments after deps, by position (once per op of every group): phase, category, layer,
        # n_bytes, flops, group.
        if self.cast_on_gpu:
            n = shard * FP32_BYTES
            h = ctx.add(H2D, f"param_h2d_fp32:g{i}", costs.copy_s(n, "h2d", self.pinned), deps, R, TRANSFER, layer,
                        n, 0.0, i)
            last = ctx.add(REFRESH_STREAM, f"param_cast_bf16:g{i}", costs.gpu_cast_s(shard), [h], R, CAST, layer, 0.0,
                           0.0, i)
        else:
            c = ctx.add(ctx.cpu.bulk, f"param_cast_bf16:g{i}", costs.cpu_cast_s(shard, ctx.cpu.bulk_cores), deps, R,
                        CAST, layer, 6.0 * shard, 0.0, i)
            n = shard * BF16_BYTES
            last = ctx.add(H2D, f"param_h2d_bf16:g{i}", costs.copy_s(n, "h2d", self.pinned), [c], R, TRANSFER, layer,
                           n, 0.0, i)
        if self.allgather and ctx.dp > 1:
            last = _allgather(ctx, g, layer, last)
        return last


@dataclass(frozen=True)
class CopyBf16:
    """The ZeRO-Offload paper's refresh: CPU-Adam writes the bf16 copy as it updates, so each group is copied
    to the GPU (2 B/param, pinned) as soon as it is updated; ZeRO-2 all-gathers it across ranks."""

    pinned: bool = True

    def __call__(self, ctx: Ctx, g: Group, deps: list[int]) -> int:
        shard, layer = _shard(ctx, g), _layer(ctx, g)
        n = shard * BF16_BYTES
        last = ctx.add(H2D, f"param_h2d_bf16:g{g.index}", ctx.costs.copy_s(n, "h2d", self.pinned), deps, phase=R,
                       category=Category.TRANSFER, layer=layer, group=g.index, n_bytes=n)
        if ctx.dp > 1:
            last = _allgather(ctx, g, layer, last)
        return last


@dataclass(frozen=True)
class HostCopyOnly:
    """Weights live in host memory (ZeRO-Infinity, weight-flow): the refresh rewrites the host bf16 copy
    (a CPU cast into the existing buffer), or nothing when the fp32 master is streamed and cast on the GPU."""

    cast: bool

    def __call__(self, ctx: Ctx, g: Group, deps: list[int]) -> int:
        if not self.cast:
            return deps[-1]
        shard = _shard(ctx, g)
        return ctx.add(ctx.cpu.bulk, f"param_cast_bf16:g{g.index}", ctx.costs.cpu_cast_s(shard, ctx.cpu.bulk_cores),
                       deps, phase=R, category=Category.CAST, layer=_layer(ctx, g), group=g.index,
                       n_bytes=6.0 * shard)


@dataclass(frozen=True)
class BlockingCopy:
    """DeepSpeed stage 3 (``_reassign_or_swap_out_partitioned_parameters``, also SuperOffload's override):
    ``fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)``, one blocking call
    per sub-group: PyTorch casts fp32 -> bf16 on the CPU into a freshly allocated (pageable) temporary and
    copies it to the GPU from pageable memory (``aten/src/ATen/native/Copy.cpp``, cross-device copies with a
    dtype change convert on the source device first). One op of ``ds_refresh_s`` on the link, timed as
    DeepSpeed runs it; 2 B/param cross the link. A sub-group updated on the GPU is a GPU cast instead.
    ``system`` selects the measured variant (ZeRO-3's or SuperOffload's thread split)."""

    system: str

    def __call__(self, ctx: Ctx, g: Group, deps: list[int]) -> int:
        shard, layer = g.elements / ctx.dp, _layer(ctx, g)
        # The calls' arguments after deps, by position: phase, category, layer, (n_bytes,) flops, group.
        if g.on_gpu:
            return ctx.gpu_op(f"param_cast_bf16:g{g.index}", ctx.costs.gpu_cast_s(shard), deps, R, CAST, layer, 0.0,
                              g.index)
        # The cast runs on the training process's OpenMP pool: all cores, also under SuperOffload, whose affinity
        # call confines only the main thread (docs/calibration.md "Affinities").
        dur = ctx.costs.ds_refresh_s(shard, ctx.cpu.bulk_cores, False, self.system)
        return ctx.add(H2D, f"param_refresh_copy_:g{g.index}", dur, [*deps, ctx.host_issue], R, TRANSFER, layer,
                       shard * BF16_BYTES, 0.0, g.index)


# --- step blocks ------------------------------------------------------------------------------------------------
@dataclass
class AfterBackward:
    """The paper's ZeRO-Offload / ZeRO-3 step: after the last gradient (and the global norm, when clipping or
    fp16 needs it) CPU Adam runs group by group on the optimizer's cores, and each group's parameters are
    refreshed as soon as it is updated. Groups kept on the GPU are updated there right after backward."""

    refresh: Refresh
    norm: bool
    # ZeRO-Offload: the next forward waits for every parameter (step() returns after the whole refresh);
    # ZeRO-3 and SuperOffload: a unit waits only for the groups holding its parameters.
    wait_for_all: bool = False

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx, group, arrival

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        gate = list(arrivals.values())
        if self.norm:
            p = ctx.layout.p_total / ctx.dp
            gate = [ctx.add(ctx.cpu.optimizer, "grad_norm", ctx.costs.cpu_norm_s(p), gate, phase=OPT,
                            category=Category.OPTIMIZER, n_bytes=4.0 * p)]
        ready: dict[int, list[int]] = {}
        for g in ctx.layout.groups:
            if g.on_gpu:
                ready[g.index] = [gpu_adam(ctx, g, [backward_end])]
            else:
                ready[g.index] = [self.refresh(ctx, g, [cpu_adam(ctx, g, gate)])]
        if self.wait_for_all:
            everything = [op for ops in ready.values() for op in ops]
            return dict.fromkeys(ready, everything)
        return ready


@dataclass
class Speculative:
    """SuperOffload's speculation-then-validation (paper): each group's CPU Adam starts as soon as its
    gradients are on the host, during backward; parameters go back as each update finishes; the next
    forward also waits for validation, which with clipping costs, in expectation, ``clip_rate`` x (two
    more Adam passes over the CPU groups and a second refresh)."""

    refresh: Refresh
    refresh_bytes_per_param: float
    _adam: dict[int, int] = field(default_factory=dict)
    _refreshed: dict[int, int] = field(default_factory=dict)

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        if not group.on_gpu:
            adam = cpu_adam(ctx, group, [arrival], name="cpu_adam_spec")
            self._adam[group.index] = adam
            self._refreshed[group.index] = self.refresh(ctx, group, [adam])

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        del arrivals
        t = ctx.sc.training
        validation: list[int] = []
        if t.gradient_clipping > 0 and t.clip_rate > 0:
            cpu = sum(g.elements for g in ctx.layout.cpu_groups) / ctx.dp
            adam = ctx.costs.cpu_adam_s(cpu, ctx.cpu.adam, ctx.cpu.optimizer_cores, ctx.layout.p_total / ctx.dp)
            again = ctx.costs.copy_s(cpu * self.refresh_bytes_per_param, "h2d", True)
            validation = [ctx.add(ctx.cpu.optimizer, "rollback_expected", t.clip_rate * (2 * adam + again),
                                  list(self._adam.values()), phase=OPT, category=Category.OPTIMIZER)]
        ready: dict[int, list[int]] = {}
        for g in ctx.layout.groups:
            if g.on_gpu:
                ready[g.index] = [gpu_adam(ctx, g, [backward_end])]
            else:
                ready[g.index] = [self._refreshed[g.index], *validation]
        self._adam, self._refreshed = {}, {}
        return ready


@dataclass
class Stage2Step:
    """DeepSpeed ZeRO-1/2 with ``offload_optimizer`` (``stage_1_and_2.py`` ``step``): the norm was
    accumulated on the GPU during backward; step() unscales/clips the fp32 gradients on the CPU (only with
    clipping or an fp16 loss scale: 0.19.8 skips the pass otherwise), runs
    DeepSpeed CPU-Adam over the partition, then casts it to bf16 on the CPU into a pinned staging buffer and
    copies it to the GPU (2 B/param), after the whole update."""

    refresh: Refresh
    # DeepSpeed 0.18.0-0.19.5: unscale_and_clip_grads has no early return, the pass always runs
    # (sosim/schedules/blocks/ds_version.py zero2_unscale_always).
    unscale_always: bool = False

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx, group, arrival

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        del backward_end
        p = ctx.layout.p_total / ctx.dp
        t = ctx.sc.training
        gate = list(arrivals.values())
        # 0.19.8 ``unscale_and_clip_grads`` returns at once when clip_grad == 0 and loss_scale == 1 (bf16); the
        # runs' timer inside step() reads 2.5 us (calibration/nvidia-h200-2026-11-30, ZeRO-2 runs).
        if self.unscale_always or t.gradient_clipping > 0 or t.precision == "fp16":
            gate = [ctx.add(ctx.cpu.bulk, "unscale_clip", 2.0 * ctx.costs.cpu_norm_s(p), gate, phase=OPT,
                            category=Category.OPTIMIZER, n_bytes=8.0 * p)]
        adams = [cpu_adam(ctx, g, gate) for g in ctx.layout.groups]
        return {g.index: [self.refresh(ctx, g, adams[-1:])] for g in ctx.layout.groups}


@dataclass
class Stage3Step:
    """DeepSpeed ZeRO-3 ``step()`` (``runtime/zero/stage3.py``; SuperOffload's override in
    ``superoffload_stage3.py``), all on the training process's host thread, one call after the other:

    1. SuperOffload without clipping: wait for every update the worker was handed during backward
       (``_wait_for_async_operations``);
    2. the fixed part: ``_pre_step``, ``_partition_all_parameters``, the gradient norm over every parameter
       with its host syncs, ``_post_step`` (``ds_step_fixed_s``);
    3. per sub-group, in order: ``unscale_and_clip_grads`` (a CPU pass over its fp32 gradients, a GPU op for
       a GPU sub-group), its update (``update``: CPU Adam in-process for ZeRO-3; for SuperOffload with
       clipping a synchronous hand-off to the worker; nothing for a CPU sub-group the worker already updated;
       Adam on the GPU for a GPU sub-group), then the refresh (a blocking copy).

    The next forward is issued when step() returns.
    """

    refresh: Refresh
    system: str
    worker: bool  # SuperOffload: CPU Adam runs in the worker process
    handed_off: bool  # SuperOffload with gradient_clipping 0: CPU sub-groups were updated during backward
    _async: dict[int, int] = field(default_factory=dict)

    def _worker_update(self, ctx: Ctx, g: Group, deps: list[int], with_copies: bool = False) -> int:
        """One sub-group through the Adam worker: hand-off, gradient copy, CPU Adam, result copy.
        ``with_copies``: the main process is still copying gradients meanwhile (so_worker with_copies)."""
        extra = ctx.costs.so_worker_roundtrip_s(_shard(ctx, g), with_copies)
        return cpu_adam(ctx, g, deps, name="worker_adam", extra_s=extra)

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        if self.handed_off and not group.on_gpu:
            # The worker's round trip as measured alone. Not the ``with_copies`` rows, although a sub-group
            # completed before the last flush is updated while backward goes on: that measurement keeps the main
            # process copying and casting on all of its OpenMP threads without a pause, which backward does not
            # (between flushes the main thread launches kernels; at a flush it does the pageable copies, which
            # the plan has as their own ops). Measured inside step() on three leases, the worker wait of the
            # 1.1B runs (11 sub-groups, 3 flushes) is 0.28-0.30 s: the with_copies rate predicted 0.42 s, the
            # alone rate 0.34 s.
            self._async[group.index] = self._worker_update(ctx, group, [arrival])

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        groups = ctx.layout.groups
        deps = [*arrivals.values(), backward_end]
        if self._async:
            ctx.host_op("wait_worker_updates", 0.0, [*deps, *self._async.values()], phase=OPT)
            self._async = {}
        costs = ctx.costs
        fixed = costs.ds_step_fixed_s(ctx.layout.p_total / ctx.dp, len(groups), self.system)
        last = ctx.host_op("step_fixed", fixed, deps, OPT, Category.FRAMEWORK)
        bulk = ctx.cpu.bulk
        for g in groups:
            shard = g.elements / ctx.dp  # _shard
            if g.on_gpu:
                # ctx.gpu_op's arguments after deps, by position: phase, category, layer, flops, group.
                last = gpu_adam(ctx, g, [ctx.gpu_op(f"unscale_clip:g{g.index}", costs.gpu_cast_s(shard), [last], OPT,
                                                    OPTIMIZER, -1, 0.0, g.index)])
            else:
                unscale = costs.ds_unscale_clip_s(shard, self.system)
                # ctx.add's arguments after deps, by position: phase, category, layer, n_bytes, flops, group.
                last = ctx.add(bulk, f"unscale_clip:g{g.index}", unscale, [last], OPT, OPTIMIZER, _layer(ctx, g),
                               8.0 * shard, 0.0, g.index)
                if self.worker and not self.handed_off:
                    last = self._worker_update(ctx, g, [last])
                elif not self.worker:
                    last = cpu_adam(ctx, g, [last])
            last = self.refresh(ctx, g, [last])
            ctx.host_issue = last  # the host thread continues once the blocking copy returned
        return {g.index: [last] for g in groups}
