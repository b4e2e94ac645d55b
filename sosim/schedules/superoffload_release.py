"""DeepSpeed SuperOffload as released: 0.18.0-0.18.8 (PR 7559, commit af56ed4d3), before PR 7906.

What the release-era ``runtime/superoffload/superoffload_stage3.py`` does, read against 0.18.0 and 0.18.8 (the
two are the same on this path: the diff is the constructor's ``**kwargs``, a deque and the master dtype), and
how it differs from the 0.18.9+ path ``superoffload.deepspeed`` models (sosim/schedules/blocks/ds_version.py names
each difference):

* **Flushes are sub-groups.** ``reduce_independent_p_g_buckets_and_remove_grads`` is overridden: gradients of
  one sub-group fill the bucket (those of the next sub-group wait in ``params_in_ipg_bucket_buffer``) and the
  bucket is reduced when it holds the sub-group's parameter count, so one flush per sub-group, issued by the
  hook of its last gradient (its first-registered tensor); ``reduce_bucket_size`` plays no part.
* **partition_grads, per flush:** ``torch.cat`` of the sub-group's gradient partitions and ``.float()`` on
  the GPU (two kernels over the flush); a CPU sub-group's fp32 CUDA tensor is put on the worker's queue
  (``async_step``), then copied ``non_blocking=True`` into the sub-group's fp32 host gradient (4 B/param over
  the link; pinned with ``pin_memory``: in 0.18 the host gradient is not shared with the worker, only the fp32
  master is). A GPU sub-group's copy stays on the GPU. No bf16 round trip, no stream synchronisation: the host
  thread never waits for a flush.
* **The worker** (``superoffload_utils.py``) copies the CUDA gradient into its pinned buffer,
  ``non_blocking=True`` (a second 4 B/param over the link), and steps DeepSpeedCPUAdam without waiting for
  that copy; sosim starts its Adam at the hand-off (the end of the layer's backward that completed the
  sub-group: the host runs at most two submodules ahead, ``__max_ongoing_fetch_events``) and puts the worker's
  copy on the link beside it. Its round trip is the 0.18.9+ one without the host copy of the gradient and with
  half the storage mapping (only the fp32 master is shared memory): ``ReleaseStep._worker_update``.
* **Speculation regardless of clipping** (no ``not self.clip_grad`` gate). ``step()``: wait for the worker;
  the fixed part; when the norm exceeds ``gradient_clipping`` (``check_clip_grads``), each CPU sub-group is
  rolled back and stepped again synchronously (expected cost: ``clip_rate`` x two worker Adam passes); then
  per sub-group ``unscale_and_clip_grads`` (a CPU ``mul_`` for a CPU sub-group, always: stage3.py has no early
  return), Adam on the GPU for a GPU sub-group and ``_reassign_or_swap_out_partitioned_parameters``: for a
  CPU sub-group only ``_unflatten_partitioned_parameters`` -- its fp32 master is never copied into the GPU's
  bf16 partition, so the step has no refresh for it (the bug PR 7906 fixed; the Alps study's "parameters not
  updated"). A GPU sub-group is cast on the GPU as in every version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sosim.costs import grace_host
from sosim.costs.analytic import SO_WORKER_IPC_S
from sosim.engine.plan import D2H, GPU_CAST, Category, Phase
from sosim.hardware import model as tm
from sosim.hardware.machine import Machine, zero_group
from sosim.inputs.units import BF16_BYTES, FP32_BYTES, GB
from sosim.schedules.blocks import cpu, layout, stage3
from sosim.schedules.blocks.driver import Ctx, DoneCallback, Recipe, Stream
from sosim.schedules.blocks.gradients import _PerFlush, _reduce_scatter, _split
from sosim.schedules.blocks.steps import OPT, R, Stage3Step, _layer, _shard, cpu_adam
from sosim.schedules.blocks.weights import Partitioned

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import AdamImpl, Scenario
    from sosim.schedules.blocks.layout import Flush, Group

G = Phase.GRADIENT
# The 0.18.9+ worker's gradient copy_ out of shared memory: read 4 + write 4 B per element.
WORKER_GRAD_COPY_BYTES = 8.0


def release_gpu_buffers(sc: Scenario, bucket_mb: float, sub_group_elements: float) -> float:
    """HBM the release-era gradient path holds at a flush: the full bf16 gradients of one sub-group's parameters
    (in the contiguous reduce bucket as far as it reaches, the rest as their own tensors until the flush; a
    sub-group of ``sub_group_size`` partition elements is dp times that in full gradients), then their
    partitions' ``torch.cat`` copy (bf16) and its ``.float()`` (fp32)."""
    dp = zero_group(sc)
    # A sub-group closes once it reaches sub_group_size, so one holding the largest tensor (the embedding) is at
    # least that tensor.
    largest = max(*tm.layer_tensor_sizes(sc.model), sc.model.vocab * sc.model.hidden)
    full = min(max(sub_group_elements * dp, largest), float(tm.total_params(sc.model)))
    bucket = layout.bucket_elements_from_mb(bucket_mb)
    return max(bucket, full) * BF16_BYTES + full / dp * (BF16_BYTES + FP32_BYTES)


def subgroup_flushes(groups: list[Group], tensors: list[layout.Tensor]) -> list[Flush]:
    """One flush per sub-group, in backward order (the last sub-group's gradients come first), issued at the
    end of the backward op that produces the sub-group's last gradient: its first-registered tensor."""
    out: list[Flush] = []
    for g in reversed(groups):
        out.append(layout.Flush(len(out), tensors[g.tensors[0]].unit, tuple(reversed(g.tensors)), g.elements))
    return out


def release_layout(sc: Scenario, costs: Costs, sub_group_elements: float, ratio: float) -> layout.Layout:
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    groups = layout.gpu_groups_by_ratio(layout.subgroups(tensors, sub_group_elements * zero_group(sc)), ratio)
    return layout.make_layout(units, tensors, subgroup_flushes(groups, tensors), groups)


@dataclass
class ReleaseGradients(_PerFlush):
    """``partition_grads`` of the release-era SuperOffload (module docstring), on ``reduce_and_partition_stream``
    with ``overlap_comm`` (else the compute stream); the host never waits."""

    overlap_comm: bool
    pinned: bool
    _stream: Stream | None = None

    def start(self, ctx: Ctx) -> None:
        del ctx
        self._stream = Stream()

    def _flush(self, ctx: Ctx, f: Flush, op: int, done: DoneCallback) -> None:
        assert self._stream is not None
        s, n, u, costs = self._stream, f.index, f.unit, ctx.costs
        cpu_el, gpu_el = _split(ctx, f)
        shard = cpu_el + gpu_el
        ready = _reduce_scatter(ctx, f, op, s)
        if not ctx.boundary:
            # Off the boundary the release code only computes nothing but the partition (no host copy).
            s.last = ready
            return
        # torch.cat (a bf16 copy) and .float() over the flush: two GPU kernels, each a pass over the flush.
        last = ctx.add(GPU_CAST, f"grad_cat:f{n}", costs.gpu_cast_s(shard), [ready, s.last], G, Category.CAST, u,
                       0.0, 0.0, n)
        last = ctx.add(GPU_CAST, f"grad_cast_fp32:f{n}", costs.gpu_cast_s(shard), [last], G, Category.CAST, u,
                       0.0, 0.0, n)
        if cpu_el > 0:
            b32 = cpu_el * FP32_BYTES
            copy_s = costs.copy_s(b32, "d2h", self.pinned)
            # The main process's non-blocking copy into the fp32 host gradient (stream order) ...
            last = ctx.add(D2H, f"grad_d2h_fp32:f{n}", copy_s, [last], G, Category.TRANSFER, u, b32, 0.0, n)
            # ... and the worker's own copy of the CUDA tensor into its pinned buffer (its own stream; nothing
            # waits for it: the worker's Adam does not synchronise).
            ctx.add(D2H, f"worker_grad_d2h_fp32:f{n}", costs.copy_s(b32, "d2h", True), [last], G, Category.TRANSFER,
                    u, b32, 0.0, n)
        s.last = last
        if not self.overlap_comm:
            ctx.compute_gate.append(last)
        for g in ctx.layout.groups_done_by(n):
            # The hand-off is the host's, right after issuing the flush: the worker starts then.
            done(ctx, g, op)

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del done
        # independent_gradient_partition_epilogue: the host synchronises with the reduce stream once.
        if self._stream is not None and self._stream.last is not None:
            ctx.host_op("grad_stream_sync", 0.0, [self._stream.last], phase=G)


@dataclass(frozen=True)
class NoCpuRefresh:
    """``_reassign_or_swap_out_partitioned_parameters`` as released: a CPU sub-group is unflattened only (no
    copy to the GPU); a GPU sub-group's fp32 -> bf16 copy runs on the GPU."""

    def __call__(self, ctx: Ctx, g: Group, deps: list[int]) -> int:
        if g.on_gpu:
            return ctx.gpu_op(f"param_cast_bf16:g{g.index}", ctx.costs.gpu_cast_s(_shard(ctx, g)), deps, R,
                              Category.CAST, _layer(ctx, g), 0.0, g.index)
        return deps[-1]


@dataclass
class ReleaseStep(Stage3Step):
    """``step()`` as released: Stage3Step with every CPU sub-group handed off in backward, no refresh for them,
    and, with clipping, the expected synchronous rollback and redo when the norm exceeds the clip."""

    def _worker_update(self, ctx: Ctx, g: Group, deps: list[int], with_copies: bool = False) -> int:
        """The release-era worker's round trip, from the 0.18.9+ one (``so_worker``: the task message, the
        worker's ``copy_`` of the shared fp32 gradient into its pinned buffer, mapping the shared parameter and
        gradient storages anew for each task) without what 0.18 does not do on the CPU: the gradient arrives as a
        CUDA tensor and is copied by the GPU (``non_blocking=True``: the link op ReleaseGradients adds, which the
        worker does not wait for), so no host copy (8 B/param at the DRAM rate) and only the fp32 master's
        storage to map (half of the mapped bytes). The updated master aliases the main process's storage (the
        result ``copy_`` is a no-op in both)."""
        del with_copies
        shard = _shard(ctx, g)
        cpu = ctx.sc.hardware.cpu
        ipc_s = grace_host.host_thread_s(SO_WORKER_IPC_S, cpu)
        copy_s = shard * WORKER_GRAD_COPY_BYTES / (cpu.mem_GBps * GB)
        mapping_s = max(0.0, ctx.costs.so_worker_roundtrip_s(shard) - ipc_s - copy_s)
        return cpu_adam(ctx, g, deps, name="worker_adam", extra_s=ipc_s + 0.5 * mapping_s)

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        t = ctx.sc.training
        if t.gradient_clipping > 0 and t.clip_rate > 0 and self._async:
            redo_s = sum(2.0 * ctx.costs.cpu_adam_s(_shard(ctx, g), ctx.cpu.adam, ctx.cpu.optimizer_cores,
                                                     ctx.layout.p_total / ctx.dp) for g in ctx.layout.cpu_groups)
            ctx.host_op("rollback_redo_expected", t.clip_rate * redo_s, [*self._async.values()], OPT,
                        Category.OPTIMIZER)
        return super().run(ctx, arrivals, backward_end)


def recipe(sc: Scenario, costs: Costs, machine: Machine, *, sub_group_elements: float, ratio: float,
           core_fraction: float, overlap_comm: bool, pinned: bool, adam: AdamImpl) -> Recipe:
    """The release-era DeepSpeed SuperOffload with SuperOffload's knobs (``ratio`` = DeepSpeed's
    ``offload_optimizer.ratio``). Weights in HBM: the release's offload_param path is not modelled
    (superoffload.py refuses ``weight_placement: flow`` for these versions)."""
    return Recipe(
        layout=release_layout(sc, costs, sub_group_elements, ratio),
        cpu=cpu.split_cores(machine.threads_per_rank, core_fraction, False, adam),
        weights=Partitioned(),
        hooks=stage3.deepspeed_hooks(sc, costs),
        grads=ReleaseGradients(overlap_comm=overlap_comm, pinned=pinned),
        step=ReleaseStep(NoCpuRefresh(), system="superoffload", worker=True, handed_off=True),
    )
