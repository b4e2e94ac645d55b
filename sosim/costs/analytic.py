"""Cost model: every duration the schedules need, resolved to a float before the simulation runs.

:class:`AnalyticCostModel` derives durations from a hardware profile (roofline with efficiency curves;
published CPU-Adam latencies). A measured calibration table, when a profile names one, takes precedence
for the operations it covers (see :mod:`sosim.costs.table`). The schedules see neither: they are handed the
cost object, :class:`sosim.costs.model.Costs`, built over one of them (its *components*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np

from sosim.costs import grace_host, training_stack
from sosim.hardware import model as tm
from sosim.hardware import moe
from sosim.hardware.machine import AIO_BLOCK_BYTES, AIO_QUEUE_DEPTH, AIO_THREADS
from sosim.inputs.config import AdamImpl, Curve, HardwareProfile, ModelSpec, TrainingSpec
from sosim.inputs.units import BF16_BYTES, FP32_BYTES, GB, TFLOP, us_to_s

if TYPE_CHECKING:
    from sosim.costs.calibration_table import CalibrationTable

Direction = Literal["h2d", "d2h"]
CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]
# Fraction of the full s x s attention work a causal flash-attention kernel actually performs (the same
# fraction the FLOP metrics count: sosim.hardware.model).
CAUSAL_WORK_FRACTION = tm.CAUSAL_ATTENTION_FRACTION
# Adam reads p, g, m, v and writes p, m, v in fp32 (28 B)
# plus the bf16 copy of p (2 B) (ZeRO-Offload, Ren et al., USENIX ATC'21).
GPU_ADAM_BYTES_PER_PARAM = 30.0
# CPU Adam's memory traffic: read p, g, m, v and write p, m, v in fp32 (ZeRO-Offload, Ren et al.).
ADAM_BYTES_PER_PARAM = 28.0
# Below this fraction of the memory bandwidth (at its reference cores) a CPU Adam is taken to be core bound.
# DeepSpeed's scalar CPUAdam on Grace reaches 0.45 of STREAM (148 of 330 GB/s, PR 8365), GraceAdam and the x86
# VM's AVX CPUAdam ~1.0: any threshold between them classifies both; 0.6 sits between.
CORE_BOUND_FRACTION = 0.6
# fp32 -> bf16 cast reads 4 B and writes 2 B per element (bf16 -> fp32 the reverse): 6 B either way.
CAST_BYTES_PER_ELEMENT = 6.0

# --- DeepSpeed stage-3 estimates: the analytic fallbacks of the costs ``sosim calibrate`` measures -------
# A freshly allocated host buffer is written through page faults (the kernel zeroes each 4 KiB page and
# maps it) before the data lands: DeepSpeed's refresh ``copy_`` of an fp32 host partition into a bf16 GPU
# parameter casts into such a temporary (PyTorch's cross-device, cross-dtype copy converts on the source
# device first: aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda). Estimate: ~1.5 us per 4 KiB page on
# one core = ~2.7 GB/s per core of first-touch bandwidth (Linux anonymous page faults incl. zeroing).
FIRST_TOUCH_GBps_PER_CORE = grace_host.REFERENCE_FIRST_TOUCH_GBps_PER_CORE  # at 4 KiB pages (sosim.costs.grace_host)
# DeepSpeed ZeRO-3 runs Python hooks around every submodule's forward and backward (fetch, release,
# partition bookkeeping) even on one GPU; with the kernel launches after them, this host work is what a
# layer's pass waits for. Fallback where no table measured it (e.g. GH200's Grace host): the x86 H200
# machine's measurement carried over per parameter-holding submodule: a Hugging Face Llama layer (9 such
# modules, one parameter tensor each) under ZeRO-3 takes 8.1-10.0 ms forward and 7.7-8.2 ms backward alone
# whatever its shape at 2048-8192 tokens (calibration/nvidia-h200-2026-11-30/measurements.csv, layer z3_fwd /
# z3_fwd_bwd) = ~1.0 ms per module per pass. Per module, not per tensor (issue 21): DeepSpeed's hook time timed
# on the lent H200 for GPT-2 layers (12 tensors in 6 parameter modules) against Llama layers (9 in 9) at two
# sizes (calibration/nvidia-h200-2026-12-01-z3hooks): GPT-2 / Llama 0.70 and 0.75 (per tensor would give 1.34);
# least squares over the 8 rows: 1.14 ms per parameter module per step, mean error 12% (per tensor: 29%), and a
# per-tensor term beside it fits to ~0. Not measured on any other host (its single-thread speed sets it).
STAGE3_HOOK_S_PER_MODULE = 1.0e-3
# Host waiting for the GPU stream to drain (torch.cuda.synchronize / event sync, e.g. the norm's .item()):
# the GPU runs dry for the kernel-launch pipeline depth. Estimate: 100 us.
HOST_SYNC_S = 100e-6
# engine.step()'s fixed part outside the optimizer kernels, the unscale pass and the copies, from its pieces as
# DeepSpeed 0.19.8 runs them on the x86 H200 VM (calibration/nvidia-h200-2026-11-30/measurements.csv,
# ds_step_fixed zero3_* / superoffload_*, 0.49 B params, 5 sub-groups, 75 parameter tensors). The gradient norm
# is not a host pass: stage 3 takes each gradient's norm on the GPU as it is partitioned
# (``partition_grads``: ``_constant_buffered_norm2``) and ``_get_norm_groups`` only gathers them, per sub-group
# with a host sync: 4.9-5.3 ms / 5 sub-groups.
DS_STEP_PER_SUBGROUP_S = 1.0e-3
# ``_partition_all_parameters``: release / re-partition per parameter tensor: 3.1-3.2 ms / 75 tensors.
DS_STEP_PER_TENSOR_S = 42e-6
# ``_pre_step`` + ``_overflow_check_and_loss_scale_update`` + ``_post_step``: 0.8 ms per step.
DS_STEP_PER_STEP_S = 0.8e-3
# SuperOffload's hand-off of one sub-group to its Adam worker process (multiprocessing queue put + get of a
# task and its result: deepspeed/runtime/superoffload/superoffload_utils.py, SuperOffloadCPUOptimizer).
# Estimate: 2 x 50 us for the two queue messages; the data goes through shared buffers, counted below.
SO_WORKER_IPC_S = 100e-6
# The worker reads the gradient from and writes the parameter to shared host buffers: one fp32 copy each
# way, read 4 B + write 4 B per element per copy, streamed at the host memory bandwidth.
SO_WORKER_COPY_BYTES_PER_ELEMENT = 16.0
# NVMe tier (until profiles describe their drives): DeepNVMe ds_io over a RAID-0 of 4 Gen4 drives with 1 GB
# transfers reads 10 GB/s and writes 5 GB/s (DeepSpeed DeepNVMe blog, 2024): per drive 2.5 / 1.25 GB/s.
NVME_READ_GBps = 2.5
NVME_WRITE_GBps = 1.25
# One I/O's submission-to-completion latency on an NVMe drive. Estimate: 100 us.
NVME_LATENCY_S = 100e-6

# ZeRO++'s quantization kernels (sosim/schedules/zero3.py says how each mode times them). Seconds per element
# on an H200 (4.8 TB/s) of a torch implementation of DeepSpeed's block quantization, 99,999,744 elements
# (calibration/nvidia-h200-2026-11-30/measurements.csv, op ``quantize``): int8 quantize 1.521 ms, dequantize
# 0.698 ms; int4 quantize 1.847 ms, dequantize 1.376 ms.
QUANT_S_PER_ELEMENT: dict[str, float] = {
    "int8": 1.520576e-3 / 99_999_744, "int8_dequant": 6.97664e-4 / 99_999_744,
    "int4": 1.846912e-3 / 99_999_744, "int4_dequant": 1.376384e-3 / 99_999_744}
QUANT_MEASURED_HBM_GBps = 4800.0  # the H200's HBM3e (NVIDIA H200 datasheet), where they were measured
# Fused kernels (csrc/quantization, no published throughput): HBM bytes per element (read + write), against the
# 6 B per element of a GPU dtype cast (CAST_BYTES_PER_ELEMENT).
QUANT_FUSED_BYTES: dict[str, float] = {"int8": 3.0, "int8_dequant": 3.0, "int4": 2.5, "int4_dequant": 2.5}
QuantKernel = Literal["int8", "int8_dequant", "int4", "int4_dequant"]

# Bytes crossing each rank's link per byte of the collective's buffer, ring algorithms (NCCL's "bus
# bandwidth" factors): all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, all-to-all (n-1)/n.
_RING_FACTOR: dict[str, float] = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0}


def parameter_tensors_per_layer(m: ModelSpec) -> int:
    """Parameter tensors of one decoder layer: the weights of its GEMMs, GPT's biases, the norm scales."""
    if m.ffn_kind == "gelu":
        return 2 * len(tm.layer_gemms(m)) + 4  # weight + bias per linear, LayerNorm scale + bias twice
    # Hugging Face Llama keeps q, k, v and gate, up as separate Linear modules: 7 weights + 2 RMSNorm scales.
    # Qwen3 adds q_norm / k_norm, GPT-OSS its sinks; an MoE layer's MLP is its router, the experts' two 3-D
    # tensors and a shared expert's three (sosim/hardware/moe.py: transformers 5.x's layout).
    extras = (2 if m.qk_norm else 0) + (1 if m.attention_sinks else 0)
    mlp = moe.mlp_tensors(m) if m.is_moe else 3
    return 4 + mlp + 2 + extras


def hooked_modules_per_layer(m: ModelSpec) -> int:
    """What DeepSpeed's ZeRO-3 hooks run over in one decoder layer, counted per hooked parameter-holding module
    (the hook time follows modules, not tensors: STAGE3_HOOK_S_PER_MODULE): a dense layer's parameter modules;
    an MoE layer's attention and norm modules plus the MLP's hooked modules (a leaf MoE block is one:
    sosim/hardware/moe.py hooked_mlp_modules)."""
    if not m.is_moe:
        return parameter_modules_per_layer(m)
    extras = (2 if m.qk_norm else 0) + (1 if m.attention_sinks else 0)
    return 4 + 2 + extras + moe.hooked_mlp_modules(m)


def parameter_modules_per_layer(m: ModelSpec) -> int:
    """Submodules of one decoder layer that hold parameters (what DeepSpeed's ZeRO-3 hooks fetch and release,
    one module at a time): one Linear per GEMM (weight, and GPT's bias) and the two norms. Hugging Face Llama keeps
    q, k, v and gate, up as separate Linear modules: 7 + 2; Qwen3's q_norm / k_norm are two more, GPT-OSS's sinks
    make its attention module hold a parameter of its own. An MoE layer: its hooked modules."""
    if m.is_moe:
        return hooked_modules_per_layer(m)
    if m.ffn_kind == "gelu":
        return len(tm.layer_gemms(m)) + 2
    return 7 + 2 + (2 if m.qk_norm else 0) + (1 if m.attention_sinks else 0)


def model_parameter_tensors(m: ModelSpec) -> int:
    """Parameter tensors of the whole model: the layers', the embedding, the final norm (scale, GPT's bias)
    and an untied output head."""
    final_norm = 2 if m.ffn_kind == "gelu" else 1
    return m.layers * parameter_tensors_per_layer(m) + 1 + final_norm + (0 if m.tied_embeddings else 1)


def stage3_variant(system: str) -> str:
    """The calibration variant of a DeepSpeed stage-3 cost: SuperOffload's engine, or plain ZeRO-3's."""
    return "superoffload" if system == "superoffload" else "zero3"


def interp_log_x(curve: Curve, x: float) -> float:
    """Piecewise-linear in log(x), flat beyond the ends (never extrapolates an efficiency)."""
    xs = np.log([p[0] for p in curve])
    ys = [p[1] for p in curve]
    return float(np.interp(math.log(max(x, 1e-30)), xs, ys))


def adam_latency_s(curve: Curve, gparams: float) -> float:
    """Whole-step Adam latency for ``gparams`` billion parameters from a (gparams, s) curve.

    Inside the measured range: linear interpolation. Outside: proportional to size at the per-parameter
    rate of the nearest end point (Adam is a streaming kernel, linear in size once past cache effects).
    """
    xs = [p[0] for p in curve]
    ys = [p[1] for p in curve]
    if gparams <= xs[0]:
        return ys[0] * gparams / xs[0]
    if gparams >= xs[-1]:
        return ys[-1] * gparams / xs[-1]
    return float(np.interp(gparams, xs, ys))


@dataclass(frozen=True)
class AnalyticCostModel:
    hw: HardwareProfile
    model: ModelSpec
    training: TrainingSpec
    # Tokens one GPU processes per micro-batch (sequence parallelism divides the sequence).
    tokens_per_gpu: int

    # --- GPU -------------------------------------------------------------------------------------------
    @cached_property
    def _peak_flops(self) -> float:
        return self.hw.gpu.peak_bf16_tflops * TFLOP

    @cached_property
    def _hbm_Bps(self) -> float:
        return self.hw.gpu.hbm_GBps * GB * self.hw.gpu.hbm_efficiency

    def gemm_s(self, flops: float) -> float:
        eff = interp_log_x(self.hw.gpu.gemm_efficiency, flops / 1e9)
        return flops / (self._peak_flops * eff)

    # The layer composition below calls these component costs; the measured-table model overrides exactly
    # the components it measured and inherits the composition (the launch-bound floor included).
    def gemm_shape_s(self, m: int, n: int, k: int) -> float:
        """A bf16 GEMM (m x k) @ (k x n) by its shape (the analytic model only needs its FLOPs)."""
        return self.gemm_s(2.0 * m * n * k)

    def attention_fwd_s(self) -> float:
        """Causal flash attention forward of one layer: half the full s x s work (CAUSAL_WORK_FRACTION)."""
        return self._attention_flops_fwd / (self._peak_flops * self.hw.gpu.attention_efficiency)

    def attention_bwd_s(self) -> float:
        """Attention backward: ``attention_bwd_factor`` x forward, never faster than its 2x forward FLOPs at
        peak (the roofline every GPU op obeys, so hardware FLOP/s can never exceed the peak)."""
        return max(self.hw.gpu.attention_bwd_factor * self.attention_fwd_s(),
                   2.0 * self._attention_flops_fwd / self._peak_flops)

    @cached_property
    def _attention_flops_fwd(self) -> float:
        # The stack's share of that work (sosim/costs/training_stack.py: 1 unless attention skips padding);
        # sliding-window layers do less (tm.causal_attention_fraction, CAUSAL_WORK_FRACTION without them).
        return (tm.attention_flops_fwd(self.model, self.tokens_per_gpu, self.training.seq_len)
                * tm.causal_attention_fraction(self.model, self.training.seq_len)
                * training_stack.attention_work_fraction(self.training))

    def elementwise_fwd_s(self) -> float:
        """The memory-bound kernels of one layer's forward (norms, residuals, rotary, activation)."""
        elem_bytes = tm.elementwise_bytes_fwd_per_token(self.model) * self.hw.gpu.elementwise_traffic_factor
        if self.model.is_moe:  # the token permutation's single kernels, at their bytes (sosim/hardware/moe.py)
            elem_bytes += moe.permutation_elems_fwd_per_token(self.model) * BF16_BYTES
        return elem_bytes * self.tokens_per_gpu / self._hbm_Bps

    @cached_property
    def _layer_parts_s(self) -> tuple[float, float, float, float]:
        """(gemm, attention, elementwise, overhead) forward seconds of one layer."""
        t = self.tokens_per_gpu
        gemm = sum(self.gemm_shape_s(t, g.n_out, g.k_in) for g in tm.layer_gemms(self.model))
        over = us_to_s(self.hw.gpu.layer_overhead_us)
        if self.model.is_moe:
            gemm += self._moe_expert_gemms_s()
            over += moe.eager_host_syncs_fwd(self.model, t) * HOST_SYNC_S
        return gemm, self.attention_fwd_s(), self.elementwise_fwd_s(), over

    def _moe_expert_gemms_s(self) -> float:
        """The routed experts' GEMMs of the mean layer (the router and shared experts are in layer_gemms):
        grouped_mm: one GEMM per projection over every expert's tile-padded rows; eager: one per expert at its
        routed tokens. A model with dense layers adds their dense MLP GEMMs in proportion."""
        m, t = self.model, self.tokens_per_gpu
        (k1, n1), (k2, n2) = moe.routed_gemm_shapes(m)
        if m.experts_impl == "grouped_mm":
            rows = moe.grouped_rows(m, t)
            routed = self.gemm_shape_s(rows, n1, k1) + self.gemm_shape_s(rows, n2, k2) if rows else 0.0
        else:
            counts = [round(c) for c in moe.expert_tokens(m, t)]
            routed = sum(self.gemm_shape_s(c, n1, k1) + self.gemm_shape_s(c, n2, k2) for c in counts if c > 0)
        dense = 0.0
        if m.dense_layers:
            f, h = m.ffn_dim, m.hidden
            dense = self.gemm_shape_s(t, 2 * f, h) + self.gemm_shape_s(t, h, f)
        return (routed * m.moe_layers + dense * m.dense_layers) / m.layers

    @cached_property
    def _min_fwd_s(self) -> float:
        # The launch-bound floor, measured on Llama layers; an MoE layer (or Qwen3's q/k norms) dispatches more
        # ops: the floor per op (sosim/hardware/moe.py host_ops_fwd).
        floor = us_to_s(self.hw.gpu.layer_min_fwd_us)
        if not self.model.is_moe and not self.model.qk_norm:
            return floor
        return floor * moe.host_ops_fwd(self.model, self.tokens_per_gpu) / moe.LLAMA_LAYER_FWD_OPS

    @cached_property
    def _layer_flops_fwd(self) -> float:
        return tm.layer_flops_fwd(self.model, self.tokens_per_gpu, self.training.seq_len)

    def layer_fwd_s(self) -> float:
        # The whole layer obeys the roofline too: its parts are timed separately (GEMMs at an efficiency,
        # elementwise by HBM bytes), but the FLOPs it is credited with may not run faster than the peak.
        return max(sum(self._layer_parts_s), self._min_fwd_s, self._layer_flops_fwd / self._peak_flops)

    def layer_bwd_only_s(self) -> float:
        """Backward of one layer without recompute: dgrad + wgrad GEMMs = 2x forward, attention backward."""
        gemm, _, elem, over = self._layer_parts_s
        bwd = 2.0 * gemm + self.attention_bwd_s() + 2.0 * elem + 2.0 * over
        return max(bwd, 2.0 * self._min_fwd_s, 2.0 * self._layer_flops_fwd / self._peak_flops)

    def layer_bwd_s(self) -> float:
        """Backward of one layer, plus its recompute (one more forward) when checkpointing."""
        bwd = self.layer_bwd_only_s()
        if self.training.activation_checkpointing:
            bwd += self.layer_fwd_s()
        return bwd

    def _loss_s(self) -> float:
        """Softmax / cross-entropy over the logits: memory bound, 6 B per logit."""
        return 6.0 * self.tokens_per_gpu * self.model.vocab / self._hbm_Bps

    def head_fwd_s(self) -> float:
        """Embedding gather + logits GEMM + softmax/cross-entropy."""
        gemm = self.gemm_shape_s(self.tokens_per_gpu, self.model.vocab, self.model.hidden)
        return max(gemm + self._loss_s(), tm.head_flops_fwd(self.model, self.tokens_per_gpu) / self._peak_flops)

    def head_bwd_s(self) -> float:
        gemm = self.gemm_shape_s(self.tokens_per_gpu, self.model.vocab, self.model.hidden)
        roofline_s = 2.0 * tm.head_flops_fwd(self.model, self.tokens_per_gpu) / self._peak_flops
        return max(2.0 * gemm + self._loss_s(), roofline_s)

    def gpu_adam_s(self, params: float) -> float:
        return params * GPU_ADAM_BYTES_PER_PARAM / self._hbm_Bps

    def gpu_cast_s(self, elements: float) -> float:
        return elements * CAST_BYTES_PER_ELEMENT / self._hbm_Bps

    def gpu_quantize_s(self, elements: float, kernel: QuantKernel, fused: bool) -> float:
        """One of ZeRO++'s (de)quantization kernels over ``elements``. ``fused``: memory bound, its HBM bytes at
        the rate of this model's GPU cast (a measured cast where the table has one); else the H200's torch
        implementation as measured, scaled by HBM bandwidth (an upper bound)."""
        if not fused:
            return elements * QUANT_S_PER_ELEMENT[kernel] * QUANT_MEASURED_HBM_GBps / self.hw.gpu.hbm_GBps
        return self.gpu_cast_s(elements) * QUANT_FUSED_BYTES[kernel] / CAST_BYTES_PER_ELEMENT

    # --- host link ---------------------------------------------------------------------------------------
    def copy_s(self, n_bytes: float, direction: Direction, pinned: bool) -> float:
        link = self.hw.link
        bw = (link.h2d_GBps if direction == "h2d" else link.d2h_GBps) * GB
        if not pinned:
            bw *= link.pageable_factor
        return us_to_s(link.latency_us) + n_bytes / bw


    # --- CPU -------------------------------------------------------------------------------------------
    def _core_factor(self, cores: float, impl: AdamImpl | None = None) -> float:
        """Slowdown of a CPU Adam run on ``cores`` instead of the reference core count.

        Bandwidth-bound (the default): it stops speeding up at ``adam_saturation_cores``. Core-bound: an
        implementation whose published rate moves its 28 B/param at less than :data:`CORE_BOUND_FRACTION` of
        ``mem_GBps`` on all reference cores (DeepSpeed's scalar CPUAdam on Grace: 148 of 330 GB/s) is limited
        by its cores, not by memory, so it scales with every core up to the reference count (roofline)."""
        cpu = self.hw.cpu
        if impl is not None and self._adam_core_bound(impl):
            return cpu.adam_ref_cores / min(max(cores, 1.0), float(cpu.adam_ref_cores))
        ref = min(cpu.adam_ref_cores, cpu.adam_saturation_cores)
        used = min(max(cores, 1.0), cpu.adam_saturation_cores)
        return ref / used

    def _adam_core_bound(self, impl: AdamImpl) -> bool:
        """Whether ``impl``'s Adam traffic at its largest published size stays well below the memory bandwidth."""
        gparams, seconds = self.hw.cpu.adam_s_by_gparams[impl][-1]
        return ADAM_BYTES_PER_PARAM * gparams * 1e9 / seconds < CORE_BOUND_FRACTION * self.hw.cpu.mem_GBps * GB

    def cpu_adam_s(self, params: float, impl: AdamImpl, cores: float, total_params: float) -> float:
        """Adam over ``params`` parameters, at the per-parameter rate of a whole step of ``total_params``."""
        curve = self.hw.cpu.adam_s_by_gparams[impl]
        total_s = adam_latency_s(curve, total_params / 1e9)
        return total_s * (params / total_params) * self._core_factor(cores, impl)

    def cpu_cast_s(self, elements: float, cores: float) -> float:
        cpu = self.hw.cpu
        core_share = min(1.0, cores / cpu.cores)
        return elements * FP32_BYTES / (cpu.cast_GBps * GB * core_share)

    def cpu_norm_s(self, params: float) -> float:
        """Global gradient norm + NaN/Inf check: one streaming read of the fp32 gradients."""
        return params * FP32_BYTES / (self.hw.cpu.mem_GBps * GB)

    # --- GPU-GPU collectives ------------------------------------------------------------------------------
    def _fabric_Bps(self, ranks: int) -> float:
        ic = self.hw.interconnect
        if ic is None:
            return math.inf
        bw = ic.gpu_gpu_GBps if ranks <= ic.gpus_per_node else ic.node_node_GBps
        return bw * GB

    def collective_s(self, kind: CollectiveKind, n_bytes: float, ranks: int, per_node: int | None = None) -> float:
        """Ring collective over a buffer of ``n_bytes`` (the whole buffer, not one rank's shard). ``per_node``:
        ignored, this per-GPU ring has no nodes (the cost object's topology uses it: sosim/costs/model.py)."""
        del per_node
        if kind not in _RING_FACTOR:
            raise ValueError(f"collective kind must be one of {', '.join(_RING_FACTOR)}, not {kind!r}")
        if ranks <= 1:
            return 0.0
        lat = us_to_s(self.hw.interconnect.latency_us) if self.hw.interconnect else 0.0
        return lat + _RING_FACTOR[kind] * (ranks - 1) / ranks * n_bytes / self._fabric_Bps(ranks)

    # --- NVMe ------------------------------------------------------------------------------------------------
    def disk_s(self, n_bytes: float, write: bool, block_bytes: float = AIO_BLOCK_BYTES,
               queue_depth: int = AIO_QUEUE_DEPTH, threads: int = AIO_THREADS) -> float:
        """Direct I/O of ``n_bytes`` to or from one NVMe drive (published per-drive rates, see constants). The
        aio settings are ignored here: only a node's NVMe volume models them (sosim/costs/model.py)."""
        del block_bytes, queue_depth, threads
        if n_bytes <= 0:
            return 0.0
        return NVME_LATENCY_S + n_bytes / ((NVME_WRITE_GBps if write else NVME_READ_GBps) * GB)

    # --- DeepSpeed stage-3 paths ---------------------------------------------------------------------------
    def ds_refresh_s(self, elements: float, threads: float, pinned: bool, system: str = "zero3_offload") -> float:
        """One sub-group's parameter refresh: fp32 host master -> bf16 device parameter in one blocking copy_.

        ``pinned=False`` is DeepSpeed's stage-3 path: the CPU casts into a freshly allocated (pageable,
        first-touch) bf16 temporary, then a pageable H2D copy. ``pinned=True`` is a cast into a preallocated
        pinned staging buffer and a pinned copy (ZeRO-2's path). ``system`` only selects the measured variant
        in a table; the analytic estimate is the same for both engines at the same thread count.
        """
        if elements <= 0:
            return 0.0
        cast = self.cpu_cast_s(elements, threads)
        if not pinned:
            first_touch = grace_host.first_touch_GBps_per_core(self.hw.cpu)  # page size sets it
            cast += elements * BF16_BYTES / (first_touch * GB * max(1.0, threads))
        return cast + self.copy_s(elements * BF16_BYTES, "h2d", pinned)

    def stage3_hook_s(self, tokens: int, backward: bool) -> float:
        """Host-side time of one decoder layer's forward (or backward alone) under DeepSpeed's ZeRO-3 hooks,
        kernel launches included: the GPU's pass of the layer waits for it when it is longer.

        Analytic: a figure per parameter-holding submodule (measured to follow modules, not tensors:
        STAGE3_HOOK_S_PER_MODULE), the same in both passes and for every token count, on this profile's host
        thread (sosim.costs.grace_host: the x86 VM's figure / cpu.host_thread_speed).
        """
        del tokens, backward  # the estimate depends on neither
        per_module = grace_host.host_thread_s(STAGE3_HOOK_S_PER_MODULE, self.hw.cpu)
        return per_module * hooked_modules_per_layer(self.model)

    def ds_unscale_clip_s(self, elements: float, system: str) -> float:
        """DeepSpeed stage 3's ``unscale_and_clip_grads`` over one sub-group's fp32 host gradients: a CPU
        ``mul_`` (read + write 4 B per element), run whether or not clipping is on (it multiplies by
        1 / combined_scale)."""
        del system  # same estimate for ZeRO-3 and SuperOffload
        return 2.0 * self.cpu_norm_s(elements)

    def ds_step_fixed_s(self, params: float, subgroups: int, system: str) -> float:
        """engine.step() outside the optimizer kernels, the unscale pass and the copies: the per-sub-group
        gathering of the GPU-computed gradient norms with its host sync, the per-tensor re-partition, the fixed
        pre/overflow/post steps (x86 VM pieces, on this profile's host thread: sosim.costs.grace_host), and one host
        sync for the global norm (schedules using this must not add their own norm op)."""
        del params, system  # same pieces for ZeRO-3 and SuperOffload; the norm is not a host pass over them
        python_s = (DS_STEP_PER_SUBGROUP_S * max(0, subgroups) + DS_STEP_PER_STEP_S
                    + DS_STEP_PER_TENSOR_S * model_parameter_tensors(self.model))
        return HOST_SYNC_S + grace_host.host_thread_s(python_s, self.hw.cpu)

    def so_worker_roundtrip_s(self, elements: float, with_copies: bool = False) -> float:
        """SuperOffload: hand one sub-group of ``elements`` to the Adam worker and take it back (no Adam).

        ``with_copies``: while the main process copies and casts (only a measured table tells the
        difference; the analytic estimate does not model that contention).
        """
        del with_copies
        if elements <= 0:
            return 0.0
        ipc = grace_host.host_thread_s(SO_WORKER_IPC_S, self.hw.cpu)
        return ipc + elements * SO_WORKER_COPY_BYTES_PER_ELEMENT / (self.hw.cpu.mem_GBps * GB)

    def so_flush_s(self, elements: float) -> float | None:
        """SuperOffload's whole gradient flush of ``elements`` as measured (``so_grads``), or None: the
        analytic model has no number of its own, and the plan then sums its copy and cast ops."""
        del elements
        return None

    def measured_table(self) -> CalibrationTable | None:
        """No table: every duration here is the analytic model's."""
        return None

    @property
    def provenance(self) -> dict[str, str]:
        out = {"cost_model": "analytic", "profile": self.hw.name,
               "costs_analytic": "all (the profile names no calibration table)"}
        moved = grace_host.transferred_note(self.hw.cpu)
        if moved:
            out["costs_transferred"] = moved
        return out
