"""The DeepSpeed configs of the layer_offload section's modes (ZeRO-2 offload with and without overlap_comm,
ZeRO-3 offload, ZeRO-Infinity's offload_param). Its own module: both the section (offload_layer_bench) and the
layer step it runs (ds_bench.layer_target) read it, and neither imports the other for it."""

from __future__ import annotations

from typing import Any

OFFLOAD_MODES = frozenset(("z2_offload", "z2_offload_no_overlap", "z3_offload_sgd", "z3_offload_param"))


def zero_config(mode: str) -> dict[str, Any]:
    """The DeepSpeed config of one offload mode (the runs' settings: bf16, pinned host buffers)."""
    offload = {"device": "cpu", "pin_memory": True}
    zero: dict[str, Any] = {"offload_optimizer": dict(offload), "contiguous_gradients": True}
    if mode.startswith("z2"):
        zero |= {"stage": 2, "overlap_comm": mode == "z2_offload"}
    else:
        zero |= {"stage": 3, "overlap_comm": True, "sub_group_size": 100_000_000}
        if mode == "z3_offload_param":
            zero["offload_param"] = dict(offload)
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero,
    }
