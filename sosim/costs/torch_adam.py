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
(scripts/torch_cpu_adam_bench.py), at the thread count clamped into the measured range (above it: the rate at
the largest measured count, Adam being bandwidth bound there); else the profile's ``torch`` Adam (foreach on
plain tensors, measured or published), which stands for every implementation and says so
(:func:`torch_adam_source`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from sosim.costs.calibration_table import CalibrationTable

if TYPE_CHECKING:
    from sosim.costs.analytic import CostModel

TorchAdamImpl = Literal["forloop", "foreach", "fused"]
TORCH_ADAM_IMPLS: tuple[TorchAdamImpl, ...] = ("forloop", "foreach", "fused")


def variant_name(impl: TorchAdamImpl, dtensor: bool) -> str:
    """The calibration table's variant of ``impl`` (the bench's ``impl`` and ``variant`` columns joined)."""
    return f"torch_{impl}" + ("_dtensor" if dtensor else "")


def _table(costs: CostModel) -> CalibrationTable | None:
    """The measured table behind ``costs`` (sosim.costs.model.Costs over a TableCostModel), if any."""
    components = getattr(costs, "components", costs)
    table = getattr(components, "table", None)
    return table if isinstance(table, CalibrationTable) else None


def _measured_s(table: CalibrationTable, elements: float, threads: float, variant: str) -> float | None:
    span = table.thread_range("cpu_adam", variant)
    if span is None:
        return None
    clamped = min(max(round(threads), span[0]), span[1])
    return table.cpu_adam_variant_time_s(elements, clamped, variant)


def torch_adam_s(costs: CostModel, elements: float, impl: TorchAdamImpl, dtensor: bool, threads: float,
                 total_elements: float) -> float:
    """One AdamW step over ``elements`` fp32 parameters of a step over ``total_elements`` (the per-element
    rate of the whole step: the for-loop's per-tensor costs are in the measured rate), on ``threads``."""
    if elements <= 0:
        return 0.0
    total = max(total_elements, elements)
    table = _table(costs)
    if table is not None:
        for variant in (variant_name(impl, dtensor), variant_name(impl, False)):
            whole = _measured_s(table, total, threads, variant)
            if whole is not None:
                return whole * elements / total
    return costs.cpu_adam_s(elements, "torch", threads, total)


def torch_adam_source(costs: CostModel, impl: TorchAdamImpl, dtensor: bool) -> str:
    """Where :func:`torch_adam_s` takes its rate from, in words (for the result's provenance)."""
    table = _table(costs)
    if table is not None:
        for variant in (variant_name(impl, dtensor), variant_name(impl, False)):
            if table.thread_range("cpu_adam", variant) is not None:
                return f"measured: calibration rows cpu_adam/{variant}"
    return (f"not measured for torch AdamW {impl}{' on DTensors' if dtensor else ''}: the profile's torch Adam "
            "(foreach, plain tensors) stands for it")
