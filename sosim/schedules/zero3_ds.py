"""zero3 (sosim/schedules/zero3.py, ZeRO-3 in HBM with ZeRO++): its DeepSpeed form and its tuning space.

DeepSpeed: stage 3 without offload; ZeRO++ is three keys of zero_optimization (zero_quantized_weights,
zero_hpz_partition_size, zero_quantized_gradients; DeepSpeed's defaults off, 1, off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.ds_schema import BF16_BYTES_PER_ELEMENT
from sosim.schedules.blocks.tuning import Knob, fmt_onoff
from sosim.schedules.system_api import DELETE, OPT, PARAM, ZERO, DeepSpeedForm, DsReader, Emitted, ZeroView

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario

ZEROPP_KEYS: tuple[tuple[str, type], ...] = (
    ("zero_quantized_weights", bool), ("zero_hpz_partition_size", int), ("zero_quantized_gradients", bool))


def claims(v: ZeroView) -> str | None:
    if v.stage == 3 and v.opt_dev == "none" and v.param_dev == "none":
        return "stage 3 without offload: ZeRO-3 in HBM (weights gathered per layer, gradients reduce-scattered)"
    return None


def _read_zeropp(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    for key, knob_type in ZEROPP_KEYS:
        if key in v.zero and not m.is_auto((*ZERO, key)):
            value = v.zero[key]
            if isinstance(value, knob_type) and not (knob_type is int and isinstance(value, bool)):
                sched[key] = value
                m.mapped((*ZERO, key), f"schedule.{key}", value, "ZeRO++ (sosim/schedules/zero3.py)")


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    _read_zeropp(m, v, sched)
    # ZeRO-3 in HBM: the reduce bucket is the schedule's; offload sections and CPU optimizer do not apply.
    if "reduce_bucket_size" in v.zero and not m.is_auto((*ZERO, "reduce_bucket_size")):
        n = v.zero["reduce_bucket_size"]
        if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0:
            sched["bucket_mb"] = float(n) * BF16_BYTES_PER_ELEMENT / 1e6
            m.mapped((*ZERO, "reduce_bucket_size"), "schedule.bucket_mb", sched["bucket_mb"])
    for key in ("overlap_comm", "sub_group_size"):
        if key in v.zero:
            m.ignored((*ZERO, key), "zero3 overlaps its collectives with compute; the GPU optimizer steps the "
                      "whole partition")
    offload_ds.ignore_offload_sections(m, v)
    if not m.missing(m.get(("optimizer",))):
        m.ignored(("optimizer",), "zero3 times a GPU Adam step over each rank's partition")
    if not m.missing(m.get(("zero_force_ds_cpu_optimizer",))):
        m.ignored(("zero_force_ds_cpu_optimizer",), "no CPU optimizer without offload")


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    k = sc.schedule.model_dump()
    out[OPT] = DELETE
    out[PARAM] = DELETE
    out[(*ZERO, "stage")] = 3
    out[(*ZERO, "reduce_bucket_size")] = offload_ds.bucket_elements(k["bucket_mb"])
    for key in ("zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients"):
        out[(*ZERO, key)] = k[key]
    if k["quantize_kernels"] != "fused":
        out.note("schedule.quantize_kernels", f"{k['quantize_kernels']} describes how sosim times the quantization "
                 "kernels, not a DeepSpeed setting")
    if not isinstance(base.get("optimizer"), dict):
        out[("optimizer",)] = {"type": "AdamW"}


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit)

# ZeRO++ (DeepSpeed zero_quantized_weights / zero_quantized_gradients / zero_hpz_partition_size): only with
# data parallelism.
QW = Knob("schedule.zero_quantized_weights", "qwZ", "ZeRO++ quantized weights (qwZ)", (False, True), min_dp=2,
          fmt=fmt_onoff)
QG = Knob("schedule.zero_quantized_gradients", "qgZ", "ZeRO++ quantized gradients (qgZ)", (False, True), min_dp=2,
          fmt=fmt_onoff)
HPZ = Knob("schedule.zero_hpz_partition_size", "hpZ", "ZeRO++ secondary partition size (hpZ)", (1, 2, 4, 8),
           min_dp=2, integer=True, structural=True, memory=True)
TUNE_SPACE: tuple[Knob, ...] = (QW, QG, HPZ)
