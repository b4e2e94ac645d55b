"""zero_offload (sosim/schedules/zero_offload.py, ZeRO-Offload): its DeepSpeed form and its tuning space.

DeepSpeed: stage 1 or 2 with ``offload_optimizer: {device: cpu}``. sosim's zero_offload is stage 2 (stage 1
does not partition gradients across ranks: the same with one rank). ``dpu`` and a CPU-Adam core split are
the paper's (implementation ideal), not DeepSpeed config keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.tuning import BUCKET, IDEAL_ONLY, OVERLAP, Knob, fmt_onoff
from sosim.schedules.system_api import DELETE, PARAM, DeepSpeedForm, DsReader, Emitted, ZeroView

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario


def claims(v: ZeroView) -> str | None:
    if v.opt_dev == "cpu" and v.stage in (1, 2) and v.param_dev != "nvme":
        return (f"stage {v.stage} + offload_optimizer cpu: ZeRO-Offload"
                + (" (stage 1 does not partition gradients across ranks; sosim's zero_offload is stage 2)"
                   if v.stage == 1 and v.dp > 1 else "") + offload_ds.IMPLEMENTATION_WHY)
    return None


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    ok = (offload_ds.read_offload_start(m, v, sched, with_params=False, bucket_note="")
          and offload_ds.read_sub_group(m, v, sched) and offload_ds.ignore_prefetch(m, v, "zero_offload")
          and offload_ds.read_plain_cpu_adam(m, v, sched))
    if ok:
        sched["dpu"] = False
        offload_ds.ignore_nvme_only(m, v)


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    out[PARAM] = DELETE
    zero_base = base.get("zero_optimization")
    base_stage = zero_base.get("stage") if isinstance(zero_base, dict) else None
    offload_ds.emit_common(sc, base, out, stage=1 if base_stage == 1 else 2)
    offload_ds.emit_no_super_offload(sc, out)
    offload_ds.emit_cpu_adam_notes(sc, out)
    if sc.schedule.model_dump()["dpu"]:
        out.note("schedule.dpu", "delayed parameter update has no DeepSpeed 0.19 config key")
    offload_ds.emit_optimizer(sc, base, out)


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit)

DPU = Knob("schedule.dpu", "dpu", "delayed parameter update", (False, True), implementations=IDEAL_ONLY,
           fmt=fmt_onoff)
TUNE_SPACE: tuple[Knob, ...] = (BUCKET, OVERLAP, DPU)
