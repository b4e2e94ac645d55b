"""Cost model: every duration the schedules need, resolved to a float before the simulation runs.

:class:`AnalyticCostModel` derives durations from a hardware profile (roofline with efficiency curves;
published CPU-Adam latencies). A measured calibration table, when a profile names one, takes precedence
for the operations it covers (see :mod:`sosim.table_costs`). The schedules only see the
:class:`CostModel` protocol, so either can feed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, Protocol

import numpy as np

from sosim import model as tm
from sosim.config import AdamImpl, Curve, HardwareProfile, ModelSpec, TrainingSpec
from sosim.units import FP32_BYTES, GB, TFLOP, us_to_s

Direction = Literal["h2d", "d2h"]
# Fraction of the full s x s attention work a causal flash-attention kernel actually performs.
CAUSAL_WORK_FRACTION = 0.5
# Adam reads p, g, m, v and writes p, m, v in fp32 (28 B) plus the bf16 copy of p (2 B): REFERENCE.md §1.
GPU_ADAM_BYTES_PER_PARAM = 30.0
# fp32 -> bf16 cast reads 4 B and writes 2 B per element (bf16 -> fp32 the reverse): 6 B either way.
CAST_BYTES_PER_ELEMENT = 6.0


class CostModel(Protocol):
    """Durations in seconds for one GPU's share of the work."""

    def layer_fwd_s(self) -> float: ...
    def layer_bwd_s(self) -> float: ...
    def head_fwd_s(self) -> float: ...
    def head_bwd_s(self) -> float: ...
    def gpu_adam_s(self, params: float) -> float: ...
    def gpu_cast_s(self, elements: float) -> float: ...
    def copy_s(self, n_bytes: float, direction: Direction, pinned: bool) -> float: ...
    def cpu_adam_s(self, params: float, impl: AdamImpl, cores: float, total_params: float) -> float: ...
    def cpu_cast_s(self, elements: float, cores: float) -> float: ...
    def cpu_norm_s(self, params: float) -> float: ...
    def allreduce_s(self, n_bytes: float, ranks: int) -> float: ...
    def reduce_scatter_s(self, n_bytes: float, ranks: int) -> float: ...
    @property
    def duplex_factors(self) -> dict[str, float]: ...
    @property
    def provenance(self) -> dict[str, str]: ...


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

    @cached_property
    def _layer_parts_s(self) -> tuple[float, float, float, float]:
        """(gemm, attention, elementwise, overhead) forward seconds of one layer."""
        t = self.tokens_per_gpu
        gemm = sum(self.gemm_s(g.flops(t)) for g in tm.layer_gemms(self.model))
        attn_flops = tm.attention_flops_fwd(self.model, t, self.training.seq_len) * CAUSAL_WORK_FRACTION
        attn = attn_flops / (self._peak_flops * self.hw.gpu.attention_efficiency)
        elem_bytes = tm.elementwise_bytes_fwd_per_token(self.model) * self.hw.gpu.elementwise_traffic_factor
        elem = elem_bytes * t / self._hbm_Bps
        return gemm, attn, elem, us_to_s(self.hw.gpu.layer_overhead_us)

    @cached_property
    def _min_fwd_s(self) -> float:
        return us_to_s(self.hw.gpu.layer_min_fwd_us)

    def layer_fwd_s(self) -> float:
        return max(sum(self._layer_parts_s), self._min_fwd_s)

    def layer_bwd_s(self) -> float:
        """Backward of one layer (dgrad + wgrad GEMMs = 2x forward), plus its recompute when checkpointing."""
        gemm, attn, elem, over = self._layer_parts_s
        bwd = 2.0 * gemm + self.hw.gpu.attention_bwd_factor * attn + 2.0 * elem + 2.0 * over
        bwd = max(bwd, 2.0 * self._min_fwd_s)
        if self.training.activation_checkpointing:
            bwd += self.layer_fwd_s()
        return bwd

    def head_fwd_s(self) -> float:
        """Embedding gather + logits GEMM + softmax/cross-entropy (memory bound: 6 B per logit)."""
        t = self.tokens_per_gpu
        logits = self.gemm_s(tm.head_flops_fwd(self.model, t))
        loss = 6.0 * t * self.model.vocab / self._hbm_Bps
        return logits + loss

    def head_bwd_s(self) -> float:
        t = self.tokens_per_gpu
        return 2.0 * self.gemm_s(tm.head_flops_fwd(self.model, t)) + 6.0 * t * self.model.vocab / self._hbm_Bps

    def gpu_adam_s(self, params: float) -> float:
        return params * GPU_ADAM_BYTES_PER_PARAM / self._hbm_Bps

    def gpu_cast_s(self, elements: float) -> float:
        return elements * CAST_BYTES_PER_ELEMENT / self._hbm_Bps

    # --- host link ---------------------------------------------------------------------------------------
    def copy_s(self, n_bytes: float, direction: Direction, pinned: bool) -> float:
        link = self.hw.link
        bw = (link.h2d_GBps if direction == "h2d" else link.d2h_GBps) * GB
        if not pinned:
            bw *= link.pageable_factor
        return us_to_s(link.latency_us) + n_bytes / bw

    @property
    def duplex_factors(self) -> dict[str, float]:
        """Speed factor of each direction while the other is busy: it runs at min(own, bidir / 2).

        An even split of the bidirectional total; monotone in every bandwidth (more bandwidth never slows
        a copy), at the price of under-using a very asymmetric link.
        """
        link = self.hw.link
        half = link.bidir_GBps / 2.0
        return {"h2d": min(1.0, half / link.h2d_GBps), "d2h": min(1.0, half / link.d2h_GBps)}

    # --- CPU -------------------------------------------------------------------------------------------
    def _core_factor(self, cores: float) -> float:
        """Slowdown of a bandwidth-bound CPU kernel run on ``cores`` instead of the reference core count."""
        cpu = self.hw.cpu
        ref = min(cpu.adam_ref_cores, cpu.adam_saturation_cores)
        used = min(max(cores, 1.0), cpu.adam_saturation_cores)
        return ref / used

    def cpu_adam_s(self, params: float, impl: AdamImpl, cores: float, total_params: float) -> float:
        """Adam over ``params`` parameters, at the per-parameter rate of a whole step of ``total_params``."""
        curve = self.hw.cpu.adam_s_by_gparams[impl]
        total_s = adam_latency_s(curve, total_params / 1e9)
        return total_s * (params / total_params) * self._core_factor(cores)

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

    def allreduce_s(self, n_bytes: float, ranks: int) -> float:
        """Ring all-reduce: 2(n-1)/n of the bytes cross each GPU's link."""
        if ranks <= 1:
            return 0.0
        lat = us_to_s(self.hw.interconnect.latency_us) if self.hw.interconnect else 0.0
        return lat + 2.0 * (ranks - 1) / ranks * n_bytes / self._fabric_Bps(ranks)

    def reduce_scatter_s(self, n_bytes: float, ranks: int) -> float:
        """Ring reduce-scatter (or all-gather): (n-1)/n of the bytes."""
        if ranks <= 1:
            return 0.0
        lat = us_to_s(self.hw.interconnect.latency_us) if self.hw.interconnect else 0.0
        return lat + (ranks - 1) / ranks * n_bytes / self._fabric_Bps(ranks)

    @property
    def provenance(self) -> dict[str, str]:
        return {"cost_model": "analytic", "profile": self.hw.name}
