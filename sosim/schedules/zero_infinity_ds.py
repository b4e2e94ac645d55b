"""zero_infinity (sosim/schedules/zero_infinity.py, parameters streamed from CPU memory): its DeepSpeed form
and its tuning space.

DeepSpeed: stage 3 with ``offload_optimizer`` and ``offload_param`` both ``{device: cpu}``; the prefetch
depth is ``stage3_prefetch_bucket_size`` (elements) read as layers ahead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.tuning import OVERLAP, PREFETCH, SUB_GROUP, Knob
from sosim.schedules.system_api import DeepSpeedForm, DsReader, Emitted, ZeroView
from sosim.schedules.zero3_offload_ds import emit_stage3

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario


def claims(v: ZeroView) -> str | None:
    if v.opt_dev == "cpu" and v.stage == 3 and not v.is_super and v.param_dev == "cpu":
        return ("stage 3 + offload_optimizer cpu + offload_param cpu: ZeRO-Infinity (parameters streamed from CPU)"
                + offload_ds.IMPLEMENTATION_WHY)
    return None


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    ok = (offload_ds.read_offload_start(m, v, sched, with_params=True, bucket_note=offload_ds.STAGE3_BUCKET_NOTE)
          and offload_ds.read_sub_group(m, v, sched) and offload_ds.read_prefetch(m, v, sched)
          and offload_ds.read_plain_cpu_adam(m, v, sched))
    if ok:
        offload_ds.ignore_nvme_only(m, v)


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    emit_stage3(sc, base, out)
    offload_ds.emit_params_from_host(sc, out, "cpu", sc.schedule.model_dump()["prefetch_layers"])
    offload_ds.emit_cpu_adam_notes(sc, out)
    offload_ds.emit_optimizer(sc, base, out)


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit, checks_max_live=True)
TUNE_SPACE: tuple[Knob, ...] = (SUB_GROUP, PREFETCH, OVERLAP)
