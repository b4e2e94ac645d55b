"""zero3_offload (sosim/schedules/zero3_offload.py, ZeRO-3 offload): its DeepSpeed form and tuning space.

DeepSpeed: stage 3 with ``offload_optimizer: {device: cpu}``, parameters in HBM (no offload_param).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.tuning import OVERLAP, SUB_GROUP, Knob
from sosim.schedules.system_api import DELETE, PARAM, ZERO, DeepSpeedForm, DsReader, Emitted, ZeroView

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario


def claims(v: ZeroView) -> str | None:
    if v.opt_dev == "cpu" and v.stage == 3 and not v.is_super and v.param_dev == "none":
        return "stage 3 + offload_optimizer cpu: ZeRO-3 offload" + offload_ds.IMPLEMENTATION_WHY
    return None


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    ok = (offload_ds.read_offload_start(m, v, sched, with_params=False, bucket_note=offload_ds.STAGE3_BUCKET_NOTE)
          and offload_ds.read_sub_group(m, v, sched) and offload_ds.ignore_prefetch(m, v, "zero3_offload")
          and offload_ds.read_plain_cpu_adam(m, v, sched))
    if ok:
        offload_ds.ignore_nvme_only(m, v)


def emit_stage3(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    """Stage 3 with the optimizer on the CPU: the keys zero3_offload and zero_infinity share."""
    offload_ds.emit_common(sc, base, out, stage=3)
    out[(*ZERO, "sub_group_size")] = round(sc.schedule.model_dump()["sub_group_elements"])
    offload_ds.emit_no_super_offload(sc, out)


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    out[PARAM] = DELETE
    emit_stage3(sc, base, out)
    offload_ds.emit_cpu_adam_notes(sc, out)
    offload_ds.emit_optimizer(sc, base, out)


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit, checks_max_live=True)
TUNE_SPACE: tuple[Knob, ...] = (SUB_GROUP, OVERLAP)
