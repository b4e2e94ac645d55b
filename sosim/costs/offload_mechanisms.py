"""Per-tensor host costs of DeepSpeed 0.19.8's ZeRO-2 offload flush and ZeRO-Infinity's parameter fetch, read
from the ``layer_offload`` calibration section (sosim/calibrate/offload_layer_bench.py; docs/calibration.md
"ZeRO-2's flush and ZeRO-Infinity's fetch"), with the 2026-12-01 H200 lease's values as the stated fallback.

Why a module of its own: both costs are what DeepSpeed's Python does per parameter tensor (a host round trip,
launches), not a rate of the GPU, the link or the CPU's arithmetic, so they are neither a cost-model method
nor rescaled on what-if hardware; they read the profile's table when it measured them (``sample`` and
``at_quantile`` of a table model draw them like any other row).

* **ZeRO-2 flush** (``stage_1_and_2.py`` ``reduce_ipg_grads`` -> ``copy_grads_in_partition``, the
  ``cpu_offload`` path at the boundary, once per parameter of the flush): the fp32 norm
  (``set_norm_for_param_grad_in_gpu``), the overflow test truth-tested on the host
  (``update_offload_overflow_tracker_for_param_grad``: ``has_inf_or_nan`` then ``if``: the host waits for the
  stream, which holds the previous parameter's copy), the fp32 cast and the non-blocking copy. The plan already
  times the cast and the copy; this adds the norm + overflow kernels (per element, on the flush's stream) and
  the host's wait per tensor (rows ``z2_flush``: ``no_sync - cast_copy`` per element, ``sync - no_sync`` per
  tensor, pooled over the measured flushes).
* **ZeRO-Infinity fetch** (``offload_param: cpu``; one rank: ``partitioned_param_coordinator.fetch_sub_module``
  -> ``NoGatherCoalescedHandle``: per parameter ``ds_tensor.data.to(device, non_blocking=True)`` from the
  pinned flat buffer, then ``synchronize()`` of the fetch stream before the sub-module runs): a host cost per
  fetched tensor, from rows ``layer z3_offload_param_fwd - z3_offload_sgd_fwd`` at the same point (the same
  stack with and without ``offload_param``, one lease), per fetched tensor of the harness's Llama layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sosim.hardware.model import ModelSpec, layer_tensor_sizes

if TYPE_CHECKING:
    from sosim.costs.model import Costs

# DeepSpeed's stage3_param_persistence_threshold default (runtime/zero/config.py, 1e5 elements): smaller
# parameters (norm scales, biases) stay on the GPU and are never fetched.
PARAM_PERSISTENCE_THRESHOLD = 100_000
# Fetched tensors per layer of the harness's stack (Hugging Face Llama: q, k, v, o, gate, up, down; the two
# RMSNorm scales are persistent), the divisor of the measured per-layer difference.
HARNESS_FETCHED_TENSORS_PER_LAYER = 7
_SOURCE = "calibration/nvidia-h200-2026-12-01-mech/measurements.csv"


@dataclass(frozen=True)
class Z2FlushCosts:
    """ZeRO-2 offload flush costs beyond the cast and the copy the plan already times."""

    sync_s_per_tensor: float  # host waits for the flush's stream, once per parameter tensor
    norm_overflow_s_per_element: float  # fp32 norm + amax/amin kernels, on the flush's stream
    source: str


# For reference (tests, docs): lease nvidia-h200-2026-12-01-f7ceca6d, pooled over the
# 1-layer (9 tensors, 45.1 M elements) and 0.5b (75 tensors, 491.8 M elements) flushes.
Z2_FLUSH_H200 = Z2FlushCosts(
    sync_s_per_tensor=(0.005428628 - 0.004662641 + 0.0523442175 - 0.0441761735) / (9 + 75),
    norm_overflow_s_per_element=(0.004662641 - 0.0037443985 + 0.0441761735 - 0.038402951)
    / (45_092_864 + 491_816_960),
    source=f"measured on an H200 ({_SOURCE}, z2_flush)",
)
# Estimate kept for profiles whose tables lack the z2_flush rows (z2_flush_costs measures it): DeepSpeed's overflow
# tracker truth-tests a CUDA scalar per parameter; ~20 us of GPU idle each, ~10 tensors per layer. (It lived in
# sosim/schedules/zero_offload.py; a duration is the costs' to state.)
Z2_SYNC_ESTIMATE_S_PER_TENSOR = 20e-6
Z2_ESTIMATE_TENSORS_PER_LAYER = 10
# For reference: (z3_offload_param_fwd - z3_offload_sgd_fwd) per layer at hidden 2048, batch 4, same lease.
ZINF_FETCH_H200_S_PER_TENSOR = (0.0108508138 - 0.0061695685) / HARNESS_FETCHED_TENSORS_PER_LAYER


def z2_flush_costs(costs: Costs) -> Z2FlushCosts | None:
    """The profile's measured ZeRO-2 flush costs (rows ``z2_flush``); None when its tables lack them (a host
    round trip measured on the H200's x86 host says little about another host: such profiles keep the earlier
    estimate, :data:`Z2_SYNC_ESTIMATE_S_PER_TENSOR`; :data:`Z2_FLUSH_H200` is the H200's, for reference)."""
    table = costs.measured_table()
    cols = {v: table.columns_by_op.get(("z2_flush", v)) for v in ("sync", "no_sync", "cast_copy")} if table else {}
    if not cols or any(c is None for c in cols.values()):
        return None
    sync, no_sync, cast = cols["sync"], cols["no_sync"], cols["cast_copy"]
    assert sync is not None and no_sync is not None and cast is not None
    d_sync = d_norm = tensors = elements = 0.0
    for i, n in enumerate(sync["elements"]):
        j, k = np.flatnonzero(no_sync["elements"] == n), np.flatnonzero(cast["elements"] == n)
        if not (len(j) and len(k)):
            continue
        d_sync += float(sync["median_s"][i] - no_sync["median_s"][j[0]])
        d_norm += float(no_sync["median_s"][j[0]] - cast["median_s"][k[0]])
        tensors += float(sync["subgroups"][i])
        elements += float(n)
    if tensors <= 0 or elements <= 0:
        return None
    assert table is not None
    return Z2FlushCosts(max(0.0, d_sync / tensors), max(0.0, d_norm / elements),
                        f"measured: {table.path} (z2_flush)")


def zinf_fetch_s_per_tensor(costs: Costs) -> tuple[float, str] | None:
    """Host time per fetched parameter tensor of ZeRO-Infinity's CPU tier, and its source; None when the
    profile's tables lack the rows (such profiles keep the fetch as a copy only, as before;
    :data:`ZINF_FETCH_H200_S_PER_TENSOR` is the H200's, for reference)."""
    table = costs.measured_table()
    with_param = table.columns_by_op.get(("layer", "z3_offload_param_fwd")) if table else None
    without = table.columns_by_op.get(("layer", "z3_offload_sgd_fwd")) if table else None
    if with_param is None or without is None:
        return None
    diffs = []
    for i, (hidden, batch) in enumerate(zip(with_param["hidden"], with_param["batch"], strict=True)):
        j = np.flatnonzero((without["hidden"] == hidden) & (without["batch"] == batch))
        if len(j):
            diffs.append(float(with_param["median_s"][i] - without["median_s"][j[0]]))
    if not diffs:
        return None
    per_tensor = max(0.0, float(np.mean(diffs))) / HARNESS_FETCHED_TENSORS_PER_LAYER
    assert table is not None
    return per_tensor, f"measured: {table.path} (layer z3_offload_param)"


def fetched_tensors_per_layer(m: ModelSpec) -> int:
    """Parameter tensors of one layer that ZeRO-3 fetches (above the persistence threshold)."""
    return sum(1 for n in layer_tensor_sizes(m) if n > PARAM_PERSISTENCE_THRESHOLD)
