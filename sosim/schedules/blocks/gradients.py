"""Gradient paths: how gradients leave the GPU during backward, flush by flush (see layout.py).

Each path issues a flush's ops at the end of the backward op of the unit that closed the flush, and calls
``done(ctx, group, arrival)`` once a group's last gradient is on the host (at the last micro-batch), with
the op after which the optimizer may read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sosim.costs.offload_mechanisms import Z2FlushCosts
from sosim.engine.plan import D2H, GPU_CAST, H2D, NET, Category, Phase
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks.driver import Ctx, DoneCallback, Stream
from sosim.schedules.blocks.layout import Flush, Unit

G = Phase.GRADIENT
CAST, TRANSFER = Category.CAST, Category.TRANSFER


def _split(ctx: Ctx, f: Flush) -> tuple[float, float]:
    """(elements of the flush whose optimizer runs on the CPU, on the GPU), per rank."""
    gpu = ctx.layout.gpu_elements[f.index]
    return (f.elements - gpu) / ctx.dp, gpu / ctx.dp


def _reduce_scatter(ctx: Ctx, f: Flush, after: int, stream: Stream | None = None) -> int:
    """Data parallel: the flush's bf16 gradients are reduce-scattered (each rank keeps its partition).
    Returns the op after which the rank's partition is ready (``after`` itself on one rank)."""
    if ctx.dp <= 1:
        return after
    n_bytes = f.elements * BF16_BYTES
    dur = ctx.costs.collective_s("reduce_scatter", n_bytes, ctx.dp)
    sent = (ctx.dp - 1) / ctx.dp * n_bytes
    if stream is not None:
        return stream.add(ctx, NET, f"reduce_scatter:f{f.index}", dur, [after], phase=G, category=Category.COMM,
                          layer=f.unit, n_bytes=sent, group=f.index)
    return ctx.add(NET, f"reduce_scatter:f{f.index}", dur, [after], phase=G, category=Category.COMM, layer=f.unit,
                   n_bytes=sent, group=f.index)


def _report(ctx: Ctx, f: Flush, arrival: int, done: DoneCallback) -> None:
    if ctx.boundary:
        for g in ctx.layout.groups_done_by(f.index):
            done(ctx, g, arrival)


class _PerFlush:
    """A gradient path that acts once per flush, when backward has produced the flush's last gradient;
    by default nothing to set up before the step or to wait for after it."""

    def start(self, ctx: Ctx) -> None:
        del ctx

    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None:
        for f in ctx.layout.flushes_at.get(u.index, ()):
            self._flush(ctx, f, op, done)

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del ctx, done

    def _flush(self, ctx: Ctx, f: Flush, op: int, done: DoneCallback) -> None:
        raise NotImplementedError


@dataclass
class HostGradients(_PerFlush):
    """The paper's schedules: each flush's gradients go to host memory as soon as backward produces them.

    ``fp32_on_gpu``: cast to fp32 on a GPU side stream and move 4 B/param (SuperOffload's GPU casting), else
    move bf16 (2 B/param) and convert/accumulate into the fp32 buffer on the CPU. ``overlap_comm`` off: the
    copy is queued on the compute stream, so the next backward waits for it. Gradients of groups updated on
    the GPU stay there. Every micro-batch sends its gradients (the CPU accumulates them).
    """

    fp32_on_gpu: bool
    overlap_comm: bool

    def _flush(self, ctx: Ctx, f: Flush, op: int, done: DoneCallback) -> None:
        cpu, _gpu = _split(ctx, f)
        last = _reduce_scatter(ctx, f, op)
        if cpu <= 0:  # every gradient of the flush stays on the GPU for its optimizer there
            _report(ctx, f, last, done)
            return
        # ctx.add's arguments after deps, by position (once per op of every flush): phase, category, layer,
        # n_bytes, flops, group.
        n, u, costs = f.index, f.unit, ctx.costs
        if self.fp32_on_gpu:
            last = ctx.add(GPU_CAST, f"grad_cast_fp32:f{n}", costs.gpu_cast_s(cpu), [last], G, CAST, u, 0.0, 0.0, n)
        n_bytes = cpu * (FP32_BYTES if self.fp32_on_gpu else BF16_BYTES)
        last = ctx.add(D2H, f"grad_d2h:f{n}", costs.copy_s(n_bytes, "d2h", True), [last], G, TRANSFER, u, n_bytes,
                       0.0, n)
        if not self.overlap_comm:
            ctx.compute_gate.append(last)
        if not self.fp32_on_gpu:
            bulk = ctx.cpu.bulk
            last = ctx.add(bulk, f"grad_to_fp32:f{n}", costs.cpu_cast_s(cpu, ctx.cpu.bulk_cores), [last], G, CAST,
                           u, cpu * (BF16_BYTES + FP32_BYTES), 0.0, n)
        _report(ctx, f, last, done)


@dataclass
class Stage2Gradients(_PerFlush):
    """DeepSpeed ZeRO-1/2 with ``offload_optimizer`` (``runtime/zero/stage_1_and_2.py``,
    ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` and ``copy_grads_in_partition``): each flush's
    gradients are cast to fp32 on the GPU and copied (4 B/param) into the pinned fp32 partition. The cast
    runs on the stream doing the copy: the compute stream unless ``overlap_comm``."""

    overlap_comm: bool
    pinned: bool
    # 0.19.8 ``copy_grads_in_partition`` (cpu_offload, at the boundary): per parameter,
    # ``update_offload_overflow_tracker_for_param_grad`` truth-tests ``_has_inf_or_nan(grad)`` -- a host sync
    # on the stream that holds the previous parameter's non-blocking D2H copy -- before queueing this one's.
    # So the host (which issues the backward's kernels) waits for each flush's copies: they run serially with
    # the backward instead of beside it.
    host_waits_for_copies: bool = False
    # Measured per-parameter costs of ``copy_grads_in_partition`` beyond the cast and the copy (the fp32 norm and
    # the overflow kernels per element, the host's wait per tensor: sosim/costs/offload_mechanisms.py); None: not
    # modelled (the host's wait then takes no time of its own).
    flush_costs: Z2FlushCosts | None = None

    def _flush(self, ctx: Ctx, f: Flush, op: int, done: DoneCallback) -> None:
        shard = f.elements / ctx.dp
        ready = _reduce_scatter(ctx, f, op)
        fc = self.flush_costs
        # Per parameter, on the flush's stream: norm + overflow kernels, then the cast (one op each, summed over
        # the flush's tensors; the stream runs them in order either way).
        kernels = [(f"grad_cast_fp32:f{f.index}", ctx.costs.gpu_cast_s(shard))]
        if fc is not None:
            kernels.insert(0, (f"grad_norm_overflow:f{f.index}", fc.norm_overflow_s_per_element * shard))
        last = ready
        for name, dur in kernels:
            if self.overlap_comm:
                # reduction_stream: queued by the host thread after its last blocking wait (the previous
                # flush's overflow checks); average_tensor first makes it wait for the compute stream.
                issue = ctx.host_issue if self.host_waits_for_copies else None
                last = ctx.add(GPU_CAST, name, dur, [last, issue], phase=G, category=Category.CAST, layer=f.unit,
                               group=f.index)
            else:
                last = ctx.gpu_op(name, dur, [last], phase=G, category=Category.CAST, layer=f.unit, group=f.index)
        n_bytes = shard * FP32_BYTES
        last = ctx.add(D2H, f"grad_d2h_fp32:f{f.index}", ctx.costs.copy_s(n_bytes, "d2h", self.pinned), [last],
                       phase=G, category=Category.TRANSFER, layer=f.unit, group=f.index, n_bytes=n_bytes)
        if not self.overlap_comm:
            ctx.compute_gate.append(last)
        if self.host_waits_for_copies:
            # The host truth-tests each tensor's overflow flag: a wait on the stream per tensor, summed here.
            wait_s = 0.0 if fc is None else fc.sync_s_per_tensor * len(f.tensors)
            last = ctx.host_op(f"grad_overflow_check_sync:f{f.index}", wait_s, [last], phase=G)
        _report(ctx, f, last, done)


@dataclass
class Stage3Gradients(_PerFlush):
    """DeepSpeed ZeRO-3 with ``offload_optimizer`` (0.19.8, ``runtime/zero/stage3.py``).

    * A flush (``__reduce_and_partition_ipg_grads``) runs on ``reduce_and_partition_stream``: a side stream
      with ``overlap_comm`` (the stage-3 default), else the compute stream. The side stream first waits for
      the compute stream (``__add_grad_to_ipg_bucket``: ``wait_stream``).
    * ``partition_grads``: each gradient is copied non-blocking into the bf16 host buffer
      (``grad_partitions_flat_buffer``, pinned with ``pin_memory``), copied back to the GPU, and at the last
      micro-batch cast to fp32 on the GPU and copied non-blocking into the sub-group's fp32 host gradient
      (``_offload_grad_partition_at_boundary``): 2 + 2 + 4 B/param, all in stream order. Gradients of
      sub-groups updated on the GPU (``ratio < 1``) take the bf16 round trip too (the buffer is on the host
      for every parameter) but their fp32 copy stays on the GPU.
    * The host does not wait per flush except for back-pressure: when more than ``max_param_reduce_events``
      (2) flushes are in flight, issuing the next one waits for the oldest (``param_reduce_events``).
    * ``superoffload`` (``superoffload_stage3.py`` ``partition_grads``): at the last micro-batch every flush
      ends with the host waiting for the stream (the fp32 gradient copy goes to a buffer shared with the Adam
      worker: ``torch.multiprocessing`` moves shared storage to shared memory, which is not pinned, so the
      copy is pageable and returns only when done; and a flush completing a sub-group synchronises the
      stream), then every completed CPU sub-group is handed to the Adam worker at once (``done``).
    * The end of backward (``independent_gradient_partition_epilogue``) synchronises the host with the stream.
    """

    overlap_comm: bool
    pinned: bool
    superoffload: bool
    # DeepSpeed 0.18.0-0.19.4 (before PR 8207): ``fp32_grad_tensor.copy_(...)`` without non_blocking, so the
    # host waits for every flush's fp32 copy (sosim/schedules/blocks/ds_version.py zero3_blocking_grad_copy).
    blocking_fp32_copy: bool = False
    max_in_flight: int = 2
    _stream: Stream = field(default_factory=Stream)
    _flush_ends: list[int] = field(default_factory=list)

    def start(self, ctx: Ctx) -> None:
        del ctx
        self._stream = Stream()
        self._flush_ends = []

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del done
        if self._flush_ends:
            ctx.host_op("grad_stream_sync", 0.0, [self._flush_ends[-1]], phase=G)

    def _flush(self, ctx: Ctx, f: Flush, op: int, done: DoneCallback) -> None:
        n, u = f.index, f.unit
        ends = self._flush_ends
        if len(ends) > self.max_in_flight:
            # param_reduce_events: issuing this flush waits for the one max_in_flight + 1 back.
            ctx.host_op(f"grad_backpressure:f{n}", 0.0, [ends[-1 - self.max_in_flight]], G)
        cpu, gpu = _split(ctx, f)
        s = self._stream
        shard = cpu + gpu
        b16 = shard * BF16_BYTES
        costs, add = ctx.costs, ctx.add
        d2h_b16 = costs.copy_s(b16, "d2h", self.pinned)
        h2d_b16 = costs.copy_s(b16, "h2d", self.pinned)
        # The flush's ops in stream order, each after the stream's last (Stream.add, inlined: once per op of every
        # flush). ctx.add's arguments after deps, by position: phase, category, layer, n_bytes, flops, group.
        ready = _reduce_scatter(ctx, f, op, s)  # moves s.last when it adds an op
        last = add(D2H, f"grad_d2h_bf16:f{n}", d2h_b16, [ready, s.last], G, TRANSFER, u, b16, 0.0, n)
        last = add(H2D, f"grad_h2d_bf16:f{n}", h2d_b16, [last], G, TRANSFER, u, b16, 0.0, n)
        if ctx.boundary:
            cast_s = costs.gpu_cast_s(shard)
            last = add(GPU_CAST, f"grad_cast_fp32:f{n}", cast_s, [last], G, CAST, u, 0.0, 0.0, n)
            if cpu > 0:
                b32 = cpu * FP32_BYTES
                pinned = self.pinned and not self.superoffload
                fp32_s = costs.copy_s(b32, "d2h", pinned)
                whole = costs.so_flush_s(shard) if self.superoffload else None
                if whole is not None:
                    # The flush as measured (so_grads: per parameter, into the worker's shared memory) minus the
                    # ops before it: the per-parameter overheads and the norm land on the pageable copy, the op
                    # that holds the host (its CPU-sub-group share when ratio < 1 keeps some on the GPU).
                    fp32_s = max(0.0, whole - d2h_b16 - h2d_b16 - cast_s) * cpu / shard
                last = add(D2H, f"grad_d2h_fp32:f{n}", fp32_s, [last], G, TRANSFER, u, b32, 0.0, n)
        s.last = last
        ends.append(last)
        if not self.overlap_comm:
            ctx.compute_gate.append(last)  # the flush ran on the compute stream
        if not ctx.boundary:
            return
        arrival = last
        if self.superoffload or self.blocking_fp32_copy:
            arrival = ctx.host_op(f"grad_sync:f{n}", 0.0, [last], G)
        for g in ctx.layout.groups_done_by(n):
            done(ctx, g, arrival)
