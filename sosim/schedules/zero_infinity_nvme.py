"""ZeRO-Infinity with the NVMe tier: DeepSpeed ZeRO-3 with ``offload_optimizer: {device: nvme}`` and, by
default, ``offload_param: {device: nvme}`` (DeepSpeed 0.19, ``runtime/zero/stage3.py`` and
``runtime/swap_tensor/``).

What DeepSpeed does, and what this recipe replays:

* **Gradients.** The stage-3 gradient path (bf16 round trip, fp32 to the host at the boundary) is ZeRO-3
  offload's; the fp32 gradients of a swappable sub-group are then written to NVMe by the gradient swapper
  (``_swap_out_offload_fp32_gradients`` -> ``swap_out_gradients``, asynchronous on the write handle).
* **Step** (``step``: per sub-group ``_prepare_sub_group``, ``unscale_and_clip_grads``, ``_optimizer_step``,
  ``_reassign_or_swap_out_partitioned_parameters``, ``_release_sub_group``): first the gradient swapper is
  flushed; each sub-group's fp32 master, Adam m and v and its fp32 gradient are read from NVMe (16 B/param,
  ``swap_in_optimizer_state``), unscaled, updated by CPU Adam, the updated parameters go back (the blocking
  fp32 -> bf16 ``copy_`` into the GPU partition, or, with ``offload_param: nvme``, a CPU cast and a write of
  the bf16 partition to NVMe, ``_partitioned_params_swap_out``), and the state is written back
  (12 B/param, ``swap_out_optimizer_state``). With ``pipeline_read`` the next sub-group's read is issued
  before this one is updated (``PipelinedOptimizerSwapper``); with ``pipeline_write`` the write-back is
  asynchronous and only the next write waits for it. DeepSpeed's defaults are both off (synchronous).
* **Parameters** with ``offload_param: nvme``: each layer's partition is read from NVMe into a pinned
  buffer, copied to the GPU and all-gathered, ``prefetch_layers`` ahead of use, in forward and backward
  (``AsyncPartitionedParameterSwapper``); with ``cpu`` it is copied from host memory (ZeRO-Infinity's CPU
  tier); with ``none`` the bf16 partition stays in HBM.
* **aio settings that matter**: ``aio_block_size``, ``aio_queue_depth`` and ``aio_intra_op_parallelism`` set
  how many bytes one rank keeps in flight on the volume (Little's law, :func:`sosim.hardware.machine.nvme_s`); the
  volume's aggregate read and write rates are the profile's (``node.nvme``), shared by the node's ranks in
  the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from sosim.engine.plan import H2D, NET, NVME_READ, NVME_WRITE, Category, Phase, Plan
from sosim.hardware import model as tm
from sosim.hardware.machine import Machine, nvme_throughput_Bps, zero_group
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks import cpu, stage3
from sosim.schedules.blocks.driver import Ctx, DoneCallback, Recipe, plan_for
from sosim.schedules.blocks.gradients import Stage3Gradients
from sosim.schedules.blocks.layout import Group, Unit
from sosim.schedules.blocks.steps import BlockingCopy, cpu_adam, cpu_pass
from sosim.schedules.blocks.weights import HostStreamed, Partitioned
from sosim.schedules.zero3_offload import STAGE3_DEFAULTS, Stage3OffloadKnobs

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.hardware.memory import MemoryUsage
    from sosim.inputs.config import Scenario

OPT, R = Phase.OPTIMIZER, Phase.REFRESH
# Bytes per parameter of one sub-group read from NVMe (fp32 master, m, v and the fp32 gradient) and written
# back (master, m, v): optimizer_utils.py OptimizerSwapper state tensors + swapped gradients.
SWAP_IN_BYTES = 16.0
SWAP_OUT_BYTES = 12.0
GRAD_BYTES = FP32_BYTES
# DeepSpeed's pinned swap buffers (offload_optimizer.buffer_count default 4, each a sub-group partition of
# every state tensor) and parameter buffers (offload_param.buffer_count 5 x buffer_size 1e8 elements, bf16).
OPT_BUFFER_COUNT = 4
PARAM_BUFFER_BYTES = 5 * 1e8 * BF16_BYTES


class ZeroInfinityNvmeKnobs(Stage3OffloadKnobs):
    system: Literal["zero_infinity_nvme"]
    offload_param: Literal["none", "cpu", "nvme"] = Field("nvme", description=
        "Where the bf16 parameter partitions live (DeepSpeed offload_param.device)")
    # offload_optimizer.pipeline_read / pipeline_write (DeepSpeed default false).
    pipeline_read: bool = Field(False, description=
        "Read the next sub-group's optimizer state from NVMe while this one is updated "
        "(offload_optimizer.pipeline_read)")
    pipeline_write: bool = Field(False, description=
        "Write the state back asynchronously; only the next write waits (offload_optimizer.pipeline_write)")
    # aio: block_size, queue_depth, intra_op_parallelism (DeepSpeed defaults 1 MiB, 8, 1).
    aio_block_size: int = Field(1 << 20, gt=0, description=
        "Bytes per asynchronous I/O request (aio.block_size; DeepSpeed default 1 MiB)")
    aio_queue_depth: int = Field(8, gt=0, description=
        "Requests in flight per handle (aio.queue_depth; DeepSpeed default 8)")
    aio_intra_op_parallelism: int = Field(1, gt=0, description=
        "I/O threads per handle (aio.intra_op_parallelism, formerly thread_count); with the block size and queue depth "
        "it sets how many bytes a rank keeps in flight on the volume")
    # Layers of parameters fetched ahead of use (DeepSpeed prefetch_bucket_size, expressed in layers).
    prefetch_layers: int = Field(1, ge=0, description=
        "Layers of parameters fetched ahead of use (DeepSpeed stage3_prefetch_bucket_size, in layers)")
    DEFAULTS = STAGE3_DEFAULTS
    NEEDS_NVME: ClassVar[bool] = True


def _knobs(sc: Scenario) -> ZeroInfinityNvmeKnobs:
    assert isinstance(sc.schedule, ZeroInfinityNvmeKnobs)
    return sc.schedule


@dataclass(frozen=True)
class Nvme:
    """One rank's aio handles on the node's volume: a read queue and a write queue (timed by the cost object's
    disk, sosim/costs/model.py, at these aio settings)."""

    block: int
    depth: int
    threads: int

    def op(self, ctx: Ctx, write: bool, name: str, n_bytes: float, deps: list[int | None], *, phase: Phase,
           layer: int = -1, group: int = -1) -> int:
        dur = ctx.costs.disk_s(n_bytes, write, self.block, self.depth, self.threads)
        return ctx.add(NVME_WRITE if write else NVME_READ, name, dur, deps, phase=phase, category=Category.TRANSFER,
                       layer=layer, group=group, n_bytes=n_bytes)


@dataclass(frozen=True)
class NvmeStreamed:
    """``offload_param: nvme``: a layer's partition is read from NVMe into a pinned buffer, copied to the GPU
    and all-gathered before use, ``prefetch_layers`` ahead (its buffer is free once the layer that far back
    has been computed). The embedding and head stay resident (gathered like ZeRO-3's)."""

    nvme: Nvme
    prefetch_layers: int

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        if not u.is_layer:
            return Partitioned().before_use(ctx, u, phase)
        p = self.prefetch_layers
        buffer_free = ctx.computed[-1 - p:-p or None][:1]
        tag = "fwd" if phase is Phase.FORWARD else "bwd"
        shard = u.params * BF16_BYTES / ctx.dp
        read = self.nvme.op(ctx, False, f"param_read_{tag}:{u.name}", shard, [*buffer_free], phase=Phase.FETCH,
                            layer=u.index)
        h2d = ctx.add(H2D, f"param_h2d_{tag}:{u.name}", ctx.costs.copy_s(shard, "h2d", True), [read],
                      phase=Phase.FETCH, category=Category.TRANSFER, layer=u.index, n_bytes=shard)
        if ctx.dp <= 1:
            return [h2d]
        full = u.params * BF16_BYTES
        return [ctx.add(NET, f"allgather_{tag}:{u.name}", ctx.costs.collective_s("all_gather", full, ctx.dp), [h2d],
                        phase=phase, category=Category.COMM, layer=u.index, n_bytes=(ctx.dp - 1) / ctx.dp * full)]


@dataclass
class NvmeGradients:
    """The stage-3 gradient path, then each sub-group's fp32 gradients written to NVMe (asynchronously, on
    the write handle) before the step may read them back."""

    inner: Stage3Gradients
    nvme: Nvme

    def start(self, ctx: Ctx) -> None:
        self.inner.start(ctx)

    def _swap_out(self, done: DoneCallback) -> DoneCallback:
        nvme = self.nvme

        def wrapped(ctx: Ctx, group: Group, arrival: int) -> None:
            if group.on_gpu:
                done(ctx, group, arrival)
                return
            n = group.elements / ctx.dp * GRAD_BYTES
            write = nvme.op(ctx, True, f"grad_swap_out:g{group.index}", n, [arrival], phase=Phase.GRADIENT,
                            group=group.index)
            done(ctx, group, write)

        return wrapped

    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None:
        self.inner.after_backward(ctx, u, op, self._swap_out(done))

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        self.inner.finish(ctx, self._swap_out(done))


@dataclass
class NvmeStage3Step:
    """DeepSpeed ZeRO-3 ``step()`` with the optimizer state on NVMe, on the training process's host thread."""

    nvme: Nvme
    params_on_nvme: bool
    pipeline_read: bool
    pipeline_write: bool
    system: str = "zero3_offload"

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx, group, arrival

    def _read(self, ctx: Ctx, g: Group, deps: list[int | None]) -> int:
        n = g.elements / ctx.dp * SWAP_IN_BYTES
        return self.nvme.op(ctx, False, f"opt_swap_in:g{g.index}", n, deps, phase=OPT, group=g.index)

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        groups = ctx.layout.groups
        deps = [*arrivals.values(), backward_end]
        fixed = ctx.costs.ds_step_fixed_s(ctx.layout.p_total / ctx.dp, len(groups), self.system)
        last = ctx.host_op("step_fixed", fixed, deps, phase=OPT, category=Category.FRAMEWORK)
        refresh = BlockingCopy(self.system)
        reads: dict[int, int] = {}
        pending_write: int | None = None
        ready: dict[int, list[int]] = {}
        cpu_groups = [g for g in groups if not g.on_gpu]
        for g in groups:
            if g.on_gpu:
                last = refresh(ctx, g, [last])
                ready[g.index] = [last]
                continue
            # Swap in: synchronous unless the pipelined swapper issued it during the previous sub-group.
            read = reads.pop(g.index, None)
            if read is None:
                read = self._read(ctx, g, [last])
            last = ctx.host_op(f"swap_in_wait:g{g.index}", 0.0, [read], phase=OPT, group=g.index)
            nxt = cpu_groups[cpu_groups.index(g) + 1] if cpu_groups.index(g) + 1 < len(cpu_groups) else None
            if self.pipeline_read and nxt is not None:
                reads[nxt.index] = self._read(ctx, nxt, [last])
            last = cpu_pass(ctx, g, "unscale_clip", [last])
            last = cpu_adam(ctx, g, [last])
            ctx.host_issue = last
            shard = g.elements / ctx.dp
            if self.params_on_nvme:
                cast = ctx.add(ctx.cpu.bulk, f"param_cast_bf16:g{g.index}",
                               ctx.costs.cpu_cast_s(shard, ctx.cpu.bulk_cores), [last], phase=R,
                               category=Category.CAST, group=g.index, n_bytes=6.0 * shard)
                last = self.nvme.op(ctx, True, f"param_swap_out:g{g.index}", shard * BF16_BYTES, [cast], phase=R,
                                    group=g.index)
                ready[g.index] = [last]
            else:
                last = refresh(ctx, g, [last])
                ready[g.index] = [last]
            ctx.host_issue = last
            # Write the state back: asynchronously with pipeline_write (the next write waits for it).
            write = self.nvme.op(ctx, True, f"opt_swap_out:g{g.index}", shard * SWAP_OUT_BYTES,
                                 [last, pending_write], phase=OPT, group=g.index)
            if self.pipeline_write:
                pending_write = write
            else:
                last = ctx.host_op(f"swap_out_wait:g{g.index}", 0.0, [write], phase=OPT, group=g.index)
        if pending_write is not None:
            # step() returns after the last asynchronous write (_post_step -> swapper's wait).
            last = ctx.host_op("swap_out_wait_last", 0.0, [pending_write], phase=OPT)
        return {k: [*ops, last] for k, ops in ready.items()}


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    dp = zero_group(sc)
    p = tm.total_params(sc.model)
    base = stage3.footprint(
        sc, weight_flow=s.offload_param != "none", offload_checkpoints=False, gpu_fraction=0.0,
        cpu_state_bytes=0.0, gpu_buffer_bytes=stage3.deepspeed_gpu_buffers(sc, s.bucket_mb),
        prefetch_layers=s.prefetch_layers)
    cpu_bytes = {k: v for k, v in base.cpu_bytes.items() if v > 0}
    shard_group = min(s.sub_group_elements, p / dp)
    # Host: the bf16 gradient buffer of every parameter (2 B/param of the partition) and the pinned swap
    # buffers; the optimizer state itself lives on NVMe.
    cpu_bytes["bf16_grad_buffer"] = BF16_BYTES * p / dp
    cpu_bytes["optimizer_swap_buffers"] = OPT_BUFFER_COUNT * shard_group * SWAP_IN_BYTES
    nvme_bytes = {"optimizer_state": SWAP_IN_BYTES * p / dp}
    if s.offload_param == "nvme":
        cpu_bytes.pop("bf16_params", None)
        cpu_bytes["param_swap_buffers"] = PARAM_BUFFER_BYTES
        nvme_bytes["bf16_params"] = BF16_BYTES * p / dp
    elif s.offload_param == "cpu":
        cpu_bytes["bf16_params"] = BF16_BYTES * p / dp
    return replace(base, cpu_bytes=cpu_bytes, nvme_bytes=nvme_bytes)


def deepspeed(sc: Scenario, costs: Costs, s: ZeroInfinityNvmeKnobs, machine: Machine) -> Recipe:
    nvme = Nvme(s.aio_block_size, s.aio_queue_depth, s.aio_intra_op_parallelism)
    weights: Partitioned | HostStreamed | NvmeStreamed
    if s.offload_param == "nvme":
        weights = NvmeStreamed(nvme, s.prefetch_layers)
    elif s.offload_param == "cpu":
        weights = HostStreamed(s.prefetch_layers, BF16_BYTES)
    else:
        weights = Partitioned()
    return Recipe(
        layout=stage3.deepspeed_layout(sc, costs, s.sub_group_elements, s.bucket_mb, ratio=1.0),
        cpu=cpu.one_process(machine.threads_per_rank, s.cpu_adam),
        weights=weights,
        hooks=stage3.deepspeed_hooks(sc, costs),
        grads=NvmeGradients(Stage3Gradients(overlap_comm=s.overlap_comm, pinned=s.pin_memory, superoffload=False),
                            nvme),
        step=NvmeStage3Step(nvme, params_on_nvme=s.offload_param == "nvme", pipeline_read=s.pipeline_read,
                            pipeline_write=s.pipeline_write),
    )


def choices(sc: Scenario, machine: Machine) -> dict[str, str]:
    s = _knobs(sc)
    read = nvme_throughput_Bps(machine, False, s.aio_block_size, s.aio_queue_depth, s.aio_intra_op_parallelism)
    write = nvme_throughput_Bps(machine, True, s.aio_block_size, s.aio_queue_depth, s.aio_intra_op_parallelism)
    return {"offload_param": s.offload_param,
            "nvme_rank_stream_GBps": f"read {read / 1e9:.1f}, write {write / 1e9:.1f} (aio block "
                                     f"{s.aio_block_size} B, queue depth {s.aio_queue_depth}, "
                                     f"{s.aio_intra_op_parallelism} thread)"}


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    s = _knobs(sc)
    # One preset: DeepSpeed's (the paper's ZeRO-Infinity overlaps more; pipeline_read/write express it).
    return plan_for(sc, costs, deepspeed(sc, costs, s, machine))
