"""SuperOffload (Lian et al., ASPLOS'26), each technique a knob; paper ('ideal') and DeepSpeed variants.

ideal (the paper's schedule):
  * weight placement: stationary (bf16 weights in HBM) or flow (weights and activation checkpoints in CPU
    memory, streamed per layer); ``auto`` picks stationary whenever it fits in HBM, else flow, and says why;
  * bucketization repartitioning: ``bucket_mb`` transfer buckets; the ``gpu_optimizer_fraction`` of the
    parameters in the buckets backward produces last keep their optimizer state in HBM, updated on the GPU;
  * casting: ``cast: gpu`` moves fp32 over the link and casts on the GPU; ``cpu`` moves bf16 and casts on
    the CPU;
  * speculation (STV): CPU Adam per bucket as soon as its gradients arrive, during backward; with clipping
    the expected rollback cost ``clip_rate x (2 Adam passes + a second refresh)`` is charged;
  * ``cpu_adam``: torch | cpu_adam | grace_adam, on ``cpu_adam_core_fraction`` of the cores;
  * parameters return per bucket as each update finishes.
deepspeed (0.19.6, ``deepspeed/runtime/superoffload/superoffload_stage3.py``): a ZeRO-3 code path with
per-layer hooks; gradients take bf16 D2H -> bf16 H2D -> GPU cast -> fp32 D2H (8 B/param), the last one
into buffers that lost their pinning when shared with the worker process (inferred from PyTorch's storage
sharing: modelled as pageable); the host synchronizes the stream when a sub-group completes and, only
with ``gradient_clipping: 0``, queues its Adam on the worker (a spawned process on ``cpuadam_cores_perc``
of the cores; the training process keeps the rest); ``step()`` waits for all updates, then per sub-group:
the worker's result is copied CPU->CPU into the fp32 master, a redundant CPU unscale pass, and a blocking
``copy_`` into the bf16 GPU weights (CPU cast, pageable, 2 B/param) before the next forward. With
clipping on, every CPU sub-group is stepped synchronously after backward (Adam, then its copy-back, then
the next). The open-source version has no speculate-then-validate rollback for clipping (only an fp16
overflow rollback), so ``clip_rate`` has no effect here.
"""

from __future__ import annotations

from sosim.config import Scenario, SuperOffloadSchedule
from sosim.memory import check_fit
from sosim.schedules import stage3


def _placement(sc: Scenario, s: SuperOffloadSchedule) -> tuple[bool, str]:
    """(weight_flow, reason)."""
    if s.weight_placement != "auto":
        return s.weight_placement == "flow", f"weight_placement: {s.weight_placement} (set by the scenario)"
    stationary = stage3.memory_usage(sc, _strategy(sc, s, weight_flow=False))
    fit = check_fit(stationary, sc.hardware)
    if fit.feasible:
        return False, "auto -> stationary: bf16 weights, activations and GPU optimizer tail fit in HBM"
    return True, f"auto -> flow: weight-stationary does not fit ({fit.reason})"


def _strategy(sc: Scenario, s: SuperOffloadSchedule, weight_flow: bool, reason: str = "") -> stage3.Stage3Strategy:
    ds = s.implementation == "deepspeed"
    speculative = s.speculation and (not ds or sc.training.gradient_clipping == 0)
    return stage3.Stage3Strategy(
        name="superoffload", weight_flow=weight_flow, offload_checkpoints=weight_flow,
        grad_path="deepspeed_stage3" if ds else ("fp32_gpu_cast" if s.cast == "gpu" else "bf16_cpu_cast"),
        param_cast="cpu" if ds else s.cast, speculative=speculative,
        refresh="blocking" if ds else "per_bucket", serial_subgroups=ds and not speculative,
        gpu_optimizer_fraction=s.gpu_optimizer_fraction,
        bucket_params=s.sub_group_elements if ds else stage3.bucket_params_from_mb(s.bucket_mb),
        cpu_adam=s.cpu_adam, cpu_adam_core_fraction=s.cpu_adam_core_fraction, pin_memory=s.pin_memory,
        overlap_comm=s.overlap_comm,
        hook_s_per_layer=stage3.STAGE3_HOOK_S_PER_TENSOR * stage3.TENSORS_PER_LAYER if ds else 0.0,
        host_sync_per_subgroup=ds, grad_d2h_pinned=not ds, refresh_pinned=not ds, cpu_unscale_pass=ds,
        worker_copy_back=ds, blocking_grad_copies=ds,
        cpu_state_bytes=stage3.DEEPSPEED_CPU_STATE_BYTES if ds else stage3.OPT_STATE_BYTES,
        notes=(("weight_placement", "flow" if weight_flow else "stationary"), ("placement_reason", reason),
               ("speculation_active", str(speculative))),
    )


def strategy(sc: Scenario) -> stage3.Stage3Strategy:
    s = sc.schedule
    assert isinstance(s, SuperOffloadSchedule)
    flow, reason = _placement(sc, s)
    return _strategy(sc, s, flow, reason)
