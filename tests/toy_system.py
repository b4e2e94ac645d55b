"""A toy system: everything sosim needs to know about a system, in one module (docs/systems.md shows it).

``toy`` is ZeRO-3 offload whose parameters a DeepSpeed config places on NVMe (stage 3, offload_optimizer cpu,
offload_param nvme: a configuration no shipped system claims). It is a toy: its plan and memory are
ZeRO-3 offload's (the NVMe parameter tier is not modelled), and its one own knob, ``param_buffer_count``
(DeepSpeed's offload_param.buffer_count), changes nothing in the prediction. It exists to prove that a system
with its DeepSpeed form and tuning space is one module plus one registry line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from sosim.inputs.config import Scenario
from sosim.schedules import zero3_offload
from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.tuning import SUB_GROUP, Knob
from sosim.schedules.system_api import PARAM, DeepSpeedForm, DsReader, Emitted, ZeroView
from sosim.schedules.zero3_offload_ds import emit_stage3


class ToyKnobs(zero3_offload.Zero3OffloadKnobs):
    system: Literal["toy"]  # type: ignore[assignment]  # the toy is ZeRO-3 offload under another name
    param_buffer_count: int = Field(5, ge=1)  # DeepSpeed offload_param.buffer_count (default 5)


# Plan and memory: ZeRO-3 offload's (a toy).
build_plan = zero3_offload.build_plan
memory_usage = zero3_offload.memory_usage


def claims(v: ZeroView) -> str | None:
    if v.stage == 3 and v.opt_dev == "cpu" and v.param_dev == "nvme" and not v.is_super:
        return "stage 3 + offload_optimizer cpu + offload_param nvme: the toy system"
    return None


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    ok = (offload_ds.read_offload_start(m, v, sched, with_params=False, bucket_note="")
          and offload_ds.read_sub_group(m, v, sched) and offload_ds.read_plain_cpu_adam(m, v, sched))
    path = (*PARAM, "buffer_count")
    if ok and "buffer_count" in v.param:
        count = m.number(path, integer=True, lo=1)
        if count is not None:
            sched["param_buffer_count"] = int(count)
            m.mapped(path, "schedule.param_buffer_count", int(count))


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    k = sc.schedule.model_dump()
    emit_stage3(sc, base, out)
    out[(*PARAM, "device")] = "nvme"
    out[(*PARAM, "nvme_path")] = "/local_nvme"
    out[(*PARAM, "buffer_count")] = k["param_buffer_count"]
    offload_ds.emit_optimizer(sc, base, out)


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit)
TUNE_SPACE: tuple[Knob, ...] = (
    SUB_GROUP,
    Knob("schedule.param_buffer_count", "buffers", "offload_param.buffer_count", (4, 5, 8), integer=True),
)
