"""The ZeRO-3 family on one shared builder: ZeRO-3 offload, ZeRO-Infinity and SuperOffload.

The three systems differ only in a handful of decisions, collected in :class:`Stage3Strategy`:

* where bf16 weights live (HBM: *weight-stationary*; CPU, streamed per layer: *weight-flow*);
* how gradients cross the link (bytes per parameter, where the bf16->fp32 cast runs);
* when the CPU optimizer may start (after backward and the global norm, or *speculatively* per bucket as
  gradients arrive, with the expected cost of rollbacks when clipping triggers);
* how parameters come back (per bucket as soon as its update is done, or one blocking pass at ``step()``;
  fp32 over the link and cast on the GPU, or cast on the CPU and 2 B/param);
* which tail of the buckets keeps its optimizer state in HBM and is updated on the GPU;
* framework costs of the DeepSpeed implementation (per-layer stage-3 hooks, host synchronizations).

Each system module (zero3_offload, zero_infinity, superoffload) only maps its config to a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from sosim import model as tm
from sosim.config import Scenario, Zero3OffloadSchedule, ZeroInfinitySchedule
from sosim.costs import CostModel
from sosim.memory import MemoryUsage
from sosim.plan import (
    CAST,
    COMM,
    CPU_CAST,
    CPU_OPT,
    D2H,
    GPU,
    GPU_CAST,
    H2D,
    NET,
    OPTIMIZER,
    SYNC,
    TRANSFER,
    Phase,
    Plan,
)
from sosim.schedules.common import (
    Bucket,
    Unit,
    build_units,
    cores_for_adam,
    cpu_threads,
    duplex,
    gpu_pass_op,
    make_buckets,
    zero_group,
)
from sosim.units import BF16_BYTES, FP32_BYTES, MB

# DeepSpeed ZeRO-3 runs Python hooks around every submodule's forward and backward (fetch, release,
# partition bookkeeping) even on one GPU. Estimate: ~25 us per parameter tensor per pass; a decoder layer
# has ~8-12 tensors. Replace with a calibrated value (docs/calibration.md) when measured.
STAGE3_HOOK_S_PER_TENSOR = 25e-6
TENSORS_PER_LAYER = 10
# Host waiting for the GPU stream to drain (torch.cuda.synchronize / event sync): the GPU runs dry for the
# kernel-launch pipeline depth. Estimate: 100 us.
HOST_SYNC_S = 100e-6
# fp32 master + Adam m, v + fp32 gradient: bytes of optimizer state per parameter wherever it lives.
OPT_STATE_BYTES = 16.0
GRAD, REFRESH = Phase.GRADIENT, Phase.REFRESH
# DeepSpeed's host buffers per parameter: fp32 master, fp32 grad, m, v + a bf16 staging/grad buffer (18 B).
DEEPSPEED_CPU_STATE_BYTES = 18.0


@dataclass(frozen=True)
class Stage3Strategy:
    name: str
    weight_flow: bool
    offload_checkpoints: bool  # weight-flow also keeps activation checkpoints in CPU memory
    grad_path: Literal["bf16_cpu_cast", "fp32_gpu_cast", "deepspeed_stage3"]
    param_cast: Literal["gpu", "cpu"]  # where the fp32 -> bf16 cast of refreshed parameters runs
    speculative: bool  # CPU Adam per bucket during backward (STV)
    refresh: Literal["per_bucket", "blocking"]  # params back as each bucket finishes, or all at step()
    serial_subgroups: bool  # DeepSpeed: Adam of sub-group k+1 waits for the copy-back of k
    gpu_optimizer_fraction: float
    bucket_params: float
    cpu_adam: str
    cpu_adam_core_fraction: float
    pin_memory: bool
    overlap_comm: bool
    hook_s_per_layer: float  # framework overhead added to each layer's forward and backward
    host_sync_per_subgroup: bool
    prefetch_layers: int = 1
    # DeepSpeed details (stage3.py / superoffload_stage3.py, 0.19.6): whether the fp32 gradient D2H and the
    # parameter refresh H2D use pinned memory, the CPU unscale/clip pass over fp32 gradients before each
    # sub-group's copy-back, the worker's CPU->CPU copy of updated fp32 parameters, host bytes per parameter.
    grad_d2h_pinned: bool = True
    refresh_pinned: bool = True
    cpu_unscale_pass: bool = False
    worker_copy_back: bool = False
    cpu_state_bytes: float = OPT_STATE_BYTES
    # DeepSpeed's partition_grads uses blocking copies (copy_ / .to() without non_blocking) and pageable
    # destinations: the training thread waits for them, so the next backward kernels are issued only after.
    blocking_grad_copies: bool = False
    notes: tuple[tuple[str, str], ...] = ()


def zero3_strategy(name: str, s: Zero3OffloadSchedule | ZeroInfinitySchedule, weight_flow: bool) -> Stage3Strategy:
    """ZeRO-3 offload and ZeRO-Infinity: the same optimizer path, weights resident or streamed."""
    ds = s.implementation == "deepspeed"
    return Stage3Strategy(
        name=name, weight_flow=weight_flow, offload_checkpoints=False,
        grad_path="deepspeed_stage3" if ds else "bf16_cpu_cast",
        param_cast="cpu", speculative=False, refresh="per_bucket", serial_subgroups=ds,
        gpu_optimizer_fraction=0.0, bucket_params=s.sub_group_elements, cpu_adam=s.cpu_adam,
        cpu_adam_core_fraction=s.cpu_adam_core_fraction, pin_memory=s.pin_memory, overlap_comm=s.overlap_comm,
        hook_s_per_layer=STAGE3_HOOK_S_PER_TENSOR * TENSORS_PER_LAYER if ds else 0.0,
        host_sync_per_subgroup=False, refresh_pinned=not ds, cpu_unscale_pass=ds,
        cpu_state_bytes=DEEPSPEED_CPU_STATE_BYTES if ds else OPT_STATE_BYTES,
        prefetch_layers=getattr(s, "prefetch_layers", 1), blocking_grad_copies=ds,
    )


@dataclass(frozen=True)
class _Layout:
    units: list[Unit]
    buckets: list[Bucket]
    gpu_buckets: frozenset[int]  # bucket indices updated on the GPU
    unit_bucket: dict[int, int]
    p_total: int


def _layout(sc: Scenario, costs: CostModel, st: Stage3Strategy) -> _Layout:
    units = build_units(sc, costs)
    if st.hook_s_per_layer:
        units = [replace(u, fwd_s=u.fwd_s + st.hook_s_per_layer, bwd_s=u.bwd_s + st.hook_s_per_layer)
                 for u in units]
    buckets = make_buckets(units, st.bucket_params)
    p_total = sum(u.params for u in units)
    # The n' buckets produced last by backward (the first layers) stay on the GPU: their update is needed
    # first by the next forward, and they never cross the link.
    gpu: set[int] = set()
    budget = st.gpu_optimizer_fraction * p_total
    for b in reversed(buckets):
        if b.params > budget:
            break
        gpu.add(b.index)
        budget -= b.params
    unit_bucket = {u: b.index for b in buckets for u in b.units}
    return _Layout(units, buckets, frozenset(gpu), unit_bucket, p_total)


def memory_usage(sc: Scenario, st: Stage3Strategy) -> MemoryUsage:
    m, t = sc.model, sc.training
    p = tm.total_params(m)
    dp = zero_group(sc)
    gpu_frac = st.gpu_optimizer_fraction
    layer_bytes = tm.layer_params(m) * BF16_BYTES
    tokens = t.micro_batch * t.seq_len // sc.cluster.sequence_parallel
    bucket_bytes = st.bucket_params * FP32_BYTES
    gpu: dict[str, float] = {"transfer_buffers": 2 * bucket_bytes}
    cpu: dict[str, float] = {"optimizer_state": st.cpu_state_bytes * p * (1 - gpu_frac) / dp}
    if st.weight_flow:
        # Only the layers being computed or prefetched are resident; embedding and head stay.
        gpu["bf16_params_working_set"] = (1 + st.prefetch_layers) * layer_bytes + tm.embedding_params(m) * BF16_BYTES
        cpu["bf16_params"] = BF16_BYTES * p
        act = tm.activation_bytes_peak(m, t, layers_on_gpu=0 if st.offload_checkpoints else None,
                                       sequence_parallel=sc.cluster.sequence_parallel)
        if st.offload_checkpoints and t.activation_checkpointing:
            cpu["activation_checkpoints"] = m.layers * m.hidden * BF16_BYTES * tokens
    else:
        gpu["bf16_params"] = BF16_BYTES * p / dp
        if dp > 1:  # gathered working set: the unit being computed and the one prefetched
            gpu["bf16_params_gathered"] = 2 * layer_bytes
        act = tm.activation_bytes_peak(m, t, sequence_parallel=sc.cluster.sequence_parallel)
    gpu["activations"] = act
    if gpu_frac > 0:
        gpu["gpu_optimizer_state"] = OPT_STATE_BYTES * p * gpu_frac / dp
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes=cpu)


def build_plan(sc: Scenario, costs: CostModel, st: Stage3Strategy) -> Plan:
    lay = _layout(sc, costs, st)
    plan = Plan(duplex_factors=duplex(costs))
    dp = zero_group(sc)
    t = sc.training
    cores = cores_for_adam(sc, st.cpu_adam_core_fraction)
    # With a dedicated Adam worker (core fraction < 1) the training process casts on the remaining cores,
    # concurrently; otherwise casts and Adam share all cores and run one after the other on one resource.
    if st.cpu_adam_core_fraction < 1:
        cast_cores, cpu_cast = max(1.0, cpu_threads(sc) - cores), CPU_CAST
    else:
        cast_cores, cpu_cast = cores, CPU_OPT
    shard_total = lay.p_total / dp
    needs_norm = t.gradient_clipping > 0 or t.precision == "fp16"
    speculative = st.speculative
    tokens = t.micro_batch * t.seq_len // sc.cluster.sequence_parallel
    ckpt_bytes = sc.model.hidden * BF16_BYTES * tokens
    # Weight-flow with GPU casting streams fp32 weights and casts them on the GPU.
    fetch_bytes = FP32_BYTES if st.param_cast == "gpu" else BF16_BYTES

    def copy(direction: Literal["h2d", "d2h"], name: str, n_bytes: float, deps: list[int], layer: int, it: int,
             phase: Phase, pinned: bool = True, group: int = -1) -> int:
        res = H2D if direction == "h2d" else D2H
        return plan.add(res, name, costs.copy_s(n_bytes, direction, st.pin_memory and pinned), deps,
                        layer=layer, iteration=it, category=TRANSFER, phase=phase, n_bytes=n_bytes, group=group)

    def cpu_pass(name: str, params: float, deps: list[int], b: Bucket, it: int) -> int:
        """A streaming pass over fp32 data in the training process (read+write 8 B/param)."""
        return plan.add(cpu_cast, name, 2.0 * costs.cpu_norm_s(params), deps, layer=b.last_unit, iteration=it,
                        category=OPTIMIZER, phase=Phase.OPTIMIZER, group=b.index)

    def adam_s(params: float) -> float:
        return costs.cpu_adam_s(params, st.cpu_adam, cores, shard_total)  # type: ignore[arg-type]

    def grads_to_cpu(b: Bucket, dep: int, it: int) -> int:
        """Ops moving one bucket's gradients into the CPU fp32 buffer; returns the last op."""
        shard = b.params / dp
        deps = [dep]
        if dp > 1:
            deps = [plan.add(NET, f"reduce_scatter:b{b.index}", costs.reduce_scatter_s(b.params * BF16_BYTES, dp),
                             deps, layer=b.last_unit, iteration=it, category=COMM, phase=Phase.GRADIENT,
                             n_bytes=(dp - 1) / dp * b.params * BF16_BYTES, group=b.index)]
        if st.grad_path == "bf16_cpu_cast":
            d = copy("d2h", f"grad_d2h:b{b.index}", shard * BF16_BYTES, deps, b.last_unit, it, GRAD,
                     group=b.index)
            return plan.add(cpu_cast, f"grad_cast_fp32:b{b.index}", costs.cpu_cast_s(shard, cast_cores), [d],
                            layer=b.last_unit, iteration=it, category=CAST, phase=GRAD, group=b.index)
        if st.grad_path == "deepspeed_stage3":
            # DeepSpeed stage 3 partition_grads: bf16 grad into the pinned host buffer, back to the GPU, cast
            # to fp32 there at the boundary, fp32 to the host (8 B/param).
            d = copy("d2h", f"grad_d2h_bf16:b{b.index}", shard * BF16_BYTES, deps, b.last_unit, it, GRAD,
                     group=b.index)
            deps = [copy("h2d", f"grad_h2d_bf16:b{b.index}", shard * BF16_BYTES, [d], b.last_unit, it, GRAD,
                         group=b.index)]
        c = plan.add(GPU_CAST, f"grad_cast_fp32:b{b.index}", costs.gpu_cast_s(shard), deps,
                     layer=b.last_unit, iteration=it, category=CAST, phase=GRAD, group=b.index)
        return copy("d2h", f"grad_d2h_fp32:b{b.index}", shard * FP32_BYTES, [c], b.last_unit, it, GRAD,
                    pinned=st.grad_d2h_pinned, group=b.index)

    def params_to_gpu(b: Bucket, dep: list[int], it: int) -> int:
        shard = b.params / dp
        if st.weight_flow:
            # Weights live in CPU memory: the refresh only rewrites the CPU copy; the next forward streams it.
            if st.param_cast == "gpu":
                return dep[-1]  # fp32 is streamed and cast on the GPU as it is fetched
            return plan.add(cpu_cast, f"param_cast_bf16:b{b.index}", costs.cpu_cast_s(shard, cast_cores), dep,
                            layer=b.last_unit, iteration=it, category=CAST, phase=REFRESH, group=b.index)
        if st.worker_copy_back:
            dep = [cpu_pass(f"worker_copy_back:b{b.index}", shard, dep, b, it)]
        if st.cpu_unscale_pass:
            dep = [cpu_pass(f"unscale_clip:b{b.index}", shard, dep, b, it)]
        if st.param_cast == "cpu":
            c = plan.add(cpu_cast, f"param_cast_bf16:b{b.index}", costs.cpu_cast_s(shard, cast_cores), dep,
                         layer=b.last_unit, iteration=it, category=CAST, phase=REFRESH, group=b.index)
            last = copy("h2d", f"param_h2d_bf16:b{b.index}", shard * BF16_BYTES, [c], b.last_unit, it, REFRESH,
                        pinned=st.refresh_pinned, group=b.index)
        else:
            h = copy("h2d", f"param_h2d_fp32:b{b.index}", shard * FP32_BYTES, dep, b.last_unit, it, REFRESH,
                     group=b.index)
            last = plan.add(GPU_CAST, f"param_cast_bf16:b{b.index}", costs.gpu_cast_s(shard), [h],
                            layer=b.last_unit, iteration=it, category=CAST, phase=REFRESH, group=b.index)
        return last  # the rank's own partition: the next use all-gathers it (ZeRO-3)

    ready: dict[int, list[int]] = {}  # bucket index -> ops after which its updated params are usable
    for it in range(t.iterations):
        prev_ready = ready
        ready = {}
        arrived: dict[int, int] = {}
        ckpt_off: dict[int, int] = {}
        for micro in range(t.grad_accum):
            # ---- forward
            computed: list[int] = []  # GPU ops in order: a fetch may only run prefetch_layers ahead of use
            for u in lay.units:
                deps = list(prev_ready.get(lay.unit_bucket.get(u.index, -1), [])) if micro == 0 else []
                buffer_free = computed[-1 - st.prefetch_layers:-st.prefetch_layers or None][:1]
                if st.weight_flow and u.params and 0 < u.index <= sc.model.layers:
                    deps = [copy("h2d", f"fetch_fwd:{u.name}", u.params * fetch_bytes, deps + buffer_free,
                                 u.index, it, Phase.FETCH)]
                if dp > 1 and u.params:
                    # ZeRO-3: each rank holds 1/dp of the weights; gather the unit's weights before use.
                    deps = [plan.add(NET, f"allgather_fwd:{u.name}", costs.reduce_scatter_s(u.params * BF16_BYTES, dp),
                                     deps + buffer_free, layer=u.index, iteration=it, category=COMM,
                                     phase=Phase.FORWARD, n_bytes=(dp - 1) / dp * u.params * BF16_BYTES)]
                f = gpu_pass_op(plan, u, "fwd", u.fwd_s, deps, it)
                computed.append(f)
                if micro == 0 and u.index == 0:
                    plan.mark_iteration_start(f)
                if st.offload_checkpoints and t.activation_checkpointing and 0 < u.index <= sc.model.layers:
                    ckpt_off[u.index] = copy("d2h", f"ckpt_d2h:{u.name}", ckpt_bytes, [f], u.index, it,
                                             Phase.CHECKPOINT)
            # ---- backward
            for u in reversed(lay.units):
                deps = []
                buffer_free = computed[-1 - st.prefetch_layers:-st.prefetch_layers or None][:1]
                if st.weight_flow and u.params and 0 < u.index <= sc.model.layers:
                    deps.append(copy("h2d", f"fetch_bwd:{u.name}", u.params * fetch_bytes, buffer_free, u.index, it,
                                     Phase.FETCH))
                if dp > 1 and u.params:
                    deps.append(plan.add(NET, f"allgather_bwd:{u.name}",
                                         costs.reduce_scatter_s(u.params * BF16_BYTES, dp), deps + buffer_free,
                                         layer=u.index, iteration=it, category=COMM, phase=Phase.BACKWARD,
                                         n_bytes=(dp - 1) / dp * u.params * BF16_BYTES))
                if u.index in ckpt_off:
                    deps.append(copy("h2d", f"ckpt_h2d:{u.name}", ckpt_bytes, [ckpt_off[u.index]], u.index, it,
                                     Phase.CHECKPOINT))
                bwd = gpu_pass_op(plan, u, "bwd", u.bwd_s, deps, it)
                computed.append(bwd)
                b_idx = lay.unit_bucket.get(u.index)
                if b_idx is None or lay.buckets[b_idx].last_unit != u.index or b_idx in lay.gpu_buckets:
                    continue
                b = lay.buckets[b_idx]
                arrived[b.index] = grads_to_cpu(b, bwd, it)
                if not st.overlap_comm or st.blocking_grad_copies:
                    # The next backward kernel waits for this bucket's transfer (no comm/compute overlap).
                    plan.add(GPU, f"wait_grad:b{b.index}", 0.0, [arrived[b.index]], iteration=it, category=SYNC,
                             phase=GRAD, group=b.index)
        # ---- optimizer step
        cpu_buckets = [b for b in lay.buckets if b.index not in lay.gpu_buckets]
        adam_done: dict[int, int] = {}
        if speculative:
            # STV: each bucket's Adam starts as soon as its gradients are in; validation runs alongside.
            for b in cpu_buckets:
                deps = [arrived[b.index]]
                if st.host_sync_per_subgroup:
                    deps.append(plan.add(GPU, f"host_sync:b{b.index}", HOST_SYNC_S, deps, iteration=it,
                                         category=SYNC, phase=GRAD, group=b.index))
                adam_done[b.index] = plan.add(CPU_OPT, f"cpu_adam_spec:b{b.index}", adam_s(b.params / dp), deps,
                                              layer=b.last_unit, iteration=it, category=OPTIMIZER,
                                              phase=Phase.OPTIMIZER, group=b.index)
        else:
            gate = list(arrived.values())
            if needs_norm:
                gate = [plan.add(CPU_OPT, "grad_norm", costs.cpu_norm_s(shard_total), gate, iteration=it,
                                 category=OPTIMIZER, phase=Phase.OPTIMIZER)]
            prev: list[int] = []
            for b in cpu_buckets:
                adam = plan.add(CPU_OPT, f"cpu_adam:b{b.index}", adam_s(b.params / dp), gate + prev,
                                layer=b.last_unit, iteration=it, category=OPTIMIZER, phase=Phase.OPTIMIZER,
                                group=b.index)
                adam_done[b.index] = adam
                if st.serial_subgroups:
                    prev = [params_to_gpu(b, [adam], it)]
                    ready[b.index] = prev
        # GPU-resident tail buckets: updated on the GPU right after backward.
        for b in lay.buckets:
            if b.index in lay.gpu_buckets:
                ready[b.index] = [plan.add(GPU, f"gpu_adam:b{b.index}", costs.gpu_adam_s(b.params / dp), [],
                                           layer=b.last_unit, iteration=it, category=OPTIMIZER,
                                           phase=Phase.OPTIMIZER, group=b.index)]
        validation: list[int] = []
        if speculative and t.gradient_clipping > 0 and t.clip_rate > 0:
            # Expected cost of rollback + re-execution: clip_rate x (two more Adam passes over the CPU buckets
            # and a second parameter refresh), charged after the speculative pass.
            spec_params = sum(b.params for b in cpu_buckets) / dp
            refresh_s = costs.copy_s(spec_params * (FP32_BYTES if st.param_cast == "gpu" else BF16_BYTES),
                                     "h2d", st.pin_memory)
            validation = [plan.add(CPU_OPT, "rollback_expected", t.clip_rate * (2 * adam_s(spec_params) + refresh_s),
                                   list(adam_done.values()), iteration=it, category=OPTIMIZER,
                                   phase=Phase.OPTIMIZER)]
        if st.refresh == "blocking":
            last_adam = list(adam_done.values())
            prev = []
            for b in cpu_buckets:
                if b.index in ready:
                    continue
                prev = [params_to_gpu(b, last_adam + prev, it)]
                ready[b.index] = prev
            # step() returns only once every copy is done: every bucket waits for the last one.
            everything = [i for ops in ready.values() for i in ops] + validation
            ready = {k: everything for k in ready}
        else:
            for b in cpu_buckets:
                if b.index not in ready:
                    # Speculative copies go out as each update finishes; the next forward additionally waits for
                    # validation (and, in expectation, a rollback and re-copy).
                    ready[b.index] = [params_to_gpu(b, [adam_done[b.index]], it), *validation]
    return plan


def bucket_params_from_mb(bucket_mb: float) -> float:
    """Bucket sizes are quoted in MB of bf16 gradients, like DeepSpeed's reduce_bucket_size x 2 B."""
    return bucket_mb * MB / BF16_BYTES
