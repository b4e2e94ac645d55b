"""torch.optim.AdamW on the CPU, by implementation: what FSDP2's CPU offload and Megatron's hybrid optimizer run.

torch has three CPU implementations of the same update (torch/optim/adamw.py -> adam.py): the for-loop
(``_single_tensor_adam``: one set of elementwise kernels per parameter tensor, each op allocating), foreach
(``_multi_tensor_adam``: the ``_foreach_*`` ops, which on CPU fall back to a per-tensor loop in C++), and fused
(``_fused_adam``: one vectorised kernel per tensor, ``aten/src/ATen/native/FusedAdam.cpp``). On CPU tensors
torch's default is the for-loop (``_default_to_fused_or_foreach`` picks foreach only for CUDA tensors), so
FSDP2's CPU-offloaded shards use it unless the user names foreach or fused (torchtitan's
``[optimizer] implementation`` defaults to fused). FSDP2's shards are DTensors: every op pays DTensor
dispatch, per tensor, which the ``_dtensor`` variants measure.

Sources, in order: the profile's calibration table rows ``cpu_adam`` / ``torch_<impl>[_dtensor]``
(scripts/torch_cpu_adam_bench.py), at the thread count clamped into the measured range and scaled from there
as the profile's ``torch`` Adam scales with threads (measured 1-16 threads on the H200 machine); else the
profile's ``torch`` Adam (foreach on plain tensors, measured or published), which stands for every
implementation and says so (:func:`torch_adam_source`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from sosim.costs.calibration_table import CalibrationTable

if TYPE_CHECKING:
    from sosim.costs.model import Costs

TorchAdamImpl = Literal["forloop", "foreach", "fused"]
TORCH_ADAM_IMPLS: tuple[TorchAdamImpl, ...] = ("forloop", "foreach", "fused")


def variant_name(impl: TorchAdamImpl, dtensor: bool) -> str:
    """The calibration table's variant of ``impl`` (the bench's ``impl`` and ``variant`` columns joined)."""
    return f"torch_{impl}" + ("_dtensor" if dtensor else "")


def _table(costs: Costs) -> CalibrationTable | None:
    """The measured table behind ``costs`` (sosim.costs.model.Costs over a TableCostModel), if any."""
    table = costs.measured_table()
    return table if isinstance(table, CalibrationTable) else None


def _measured_s(costs: Costs, table: CalibrationTable, elements: float, threads: float,
                variant: str) -> float | None:
    """The variant's time at ``threads``; outside its measured thread counts, at the nearest one, scaled by how
    the profile's ``torch`` Adam (measured by threads where the profile's tables have it) scales between them."""
    span = table.thread_range("cpu_adam", variant)
    if span is None:
        return None
    clamped = min(max(round(threads), span[0]), span[1])
    at = table.cpu_adam_variant_time_s(elements, clamped, variant)
    if at is None or clamped == threads:
        return at
    there = costs.cpu_adam_s(elements, "torch", clamped, elements)
    return at * costs.cpu_adam_s(elements, "torch", threads, elements) / there if there > 0 else at


# The bench's tensor size (scripts/torch_cpu_adam_bench.py --tensor-numel default, a 1.1b MLP matrix): its main
# curve at E elements steps ceil(E / this) tensors.
BENCH_TENSOR_NUMEL = 2048 * 5632


def per_tensor_s(table: CalibrationTable, variant: str) -> float | None:
    """Seconds each extra tensor adds at a fixed element count: the least-squares slope of the bench's
    per-tensor sweep (``<variant>_sweep`` rows: the same elements in 12-191 tensors), None without one."""
    cols = table.columns_by_op.get(("cpu_adam", f"{variant}_sweep"))
    if cols is None or "subgroups" not in cols:
        return None
    n, t = cols["subgroups"], cols["median_s"]
    ok = np.isfinite(n) & np.isfinite(t)
    if len(set(n[ok].tolist())) < 2:
        return None
    slope = float(np.polyfit(n[ok], t[ok], 1)[0])
    return max(slope, 0.0)


def torch_adam_s(costs: Costs, elements: float, impl: TorchAdamImpl, dtensor: bool, threads: float,
                 total_elements: float, n_tensors: int | None = None) -> float:
    """One AdamW step over ``elements`` fp32 parameters of a step over ``total_elements`` tensors' worth (the
    per-element rate of the whole step), on ``threads``. ``n_tensors``: the parameter tensors of the whole
    step; with the bench's per-tensor sweep, each tensor more than the bench stepped at that size adds the
    measured per-tensor time."""
    if elements <= 0:
        return 0.0
    total = max(total_elements, elements)
    table = _table(costs)
    if table is not None:
        for variant in (variant_name(impl, dtensor), variant_name(impl, False)):
            whole = _measured_s(costs, table, total, threads, variant)
            if whole is None:
                continue
            extra = per_tensor_s(table, variant) if n_tensors is not None else None
            if extra is not None and n_tensors is not None:
                bench_tensors = -(-total // BENCH_TENSOR_NUMEL)
                # Only tensors beyond the bench's count are added: the sweep measures smaller tensors, not
                # fewer, larger ones than the bench's 11.5M-element matrices.
                whole += extra * max(n_tensors - bench_tensors, 0)
            return whole * elements / total
    return costs.cpu_adam_s(elements, "torch", threads, total)


def torch_adam_source(costs: Costs, impl: TorchAdamImpl, dtensor: bool) -> str:
    """Where :func:`torch_adam_s` takes its rate from, in words (for the result's provenance)."""
    table = _table(costs)
    if table is not None:
        for variant in (variant_name(impl, dtensor), variant_name(impl, False)):
            if table.thread_range("cpu_adam", variant) is not None:
                return f"measured: calibration rows cpu_adam/{variant}"
    return (f"not measured for torch AdamW {impl}{' on DTensors' if dtensor else ''}: the profile's torch Adam "
            "(foreach, plain tensors) stands for it")
