"""gpu_only (sosim/schedules/gpu_only.py): its DeepSpeed form and its tuning space.

DeepSpeed: ZeRO stage 0, 1 or 2 without offload. Stage 3 without offload is the ``zero3`` system (it gathers
parameters per layer), so gpu_only is never written as stage 3: a state of 16/dp bytes per parameter that only
stage 3 gives is not a gpu_only configuration the tuner offers. The stage is represented by the model state
per parameter (bf16 params and grads + fp32 master, m, v = 16 B/param; stage 1 partitions the 12 B of
optimizer state, stage 2 also the gradients; ZeRO paper, Rajbhandari et al. SC'20, Fig. 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.tuning import Knob, fmt_float
from sosim.schedules.system_api import DELETE, OPT, PARAM, ZERO, DeepSpeedForm, DsReader, Emitted, ZeroView

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario

GPU_ONLY_STAGES = (0, 1, 2)


def state_bytes(stage: int, dp: int) -> float:
    """Model state per parameter per GPU of ZeRO ``stage`` (0-3) without offload on ``dp`` ranks."""
    return (16.0, 4.0 + 12.0 / dp, 2.0 + 14.0 / dp, 16.0 / dp)[stage]


def stages_of(state: float, dp: int, stages: tuple[int, ...] = (0, 1, 2, 3)) -> list[int]:
    return [s for s in stages if math.isclose(state_bytes(s, dp), state, rel_tol=1e-9)]


def zero_stage_of(state: float, dp: int) -> int | None:
    """The ZeRO stage (0-3, lowest first) whose model state per GPU is ``state`` on ``dp`` ranks."""
    found = stages_of(state, dp)
    return found[0] if found else None


def state_values(dp: int) -> tuple[float, ...]:
    """The distinct states of stages 0-2 on ``dp`` ranks (with one rank they are all 16 B/param)."""
    seen: list[float] = []
    for stage in GPU_ONLY_STAGES:
        v = state_bytes(stage, dp)
        if not any(abs(v - s) < 1e-9 for s in seen):
            seen.append(v)
    return tuple(seen)


def claims(v: ZeroView) -> str | None:
    if v.opt_dev == "none" and v.param_dev != "nvme" and v.stage < 3:
        return f"stage {v.stage} without offload: everything in HBM"
    return None


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    stage, dp = v.stage, v.dp
    sched["state_bytes_per_param"] = state_bytes(stage, dp)
    m.note("mapped", "zero_optimization.stage", "schedule.state_bytes_per_param", sched["state_bytes_per_param"],
           f"stage {stage} on {dp} data-parallel ranks: bf16 params and grads plus fp32 master, m, v (16 B/param), "
           "partitioned as ZeRO does", path=(*ZERO, "stage"), value=stage)
    for key in ("overlap_comm", "reduce_bucket_size", "sub_group_size"):
        if key in v.zero:
            m.ignored((*ZERO, key), "gpu_only models DDP's overlapped 25 MB all-reduce buckets"
                      if key != "sub_group_size" else "used by offloaded ZeRO-3 optimizers only")
    offload_ds.ignore_offload_sections(m, v)
    if not m.missing(m.get(("optimizer",))):
        m.ignored(("optimizer",), "gpu_only times a fused GPU Adam step")
    if not m.missing(m.get(("zero_force_ds_cpu_optimizer",))):
        m.ignored(("zero_force_ds_cpu_optimizer",), "no CPU optimizer without offload")


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    out[OPT] = DELETE
    out[PARAM] = DELETE
    state = sc.schedule.model_dump()["state_bytes_per_param"]
    dp = sc.cluster.dp
    zero_base = base.get("zero_optimization")
    base_stage = zero_base.get("stage") if isinstance(zero_base, dict) else None
    stages = stages_of(state, dp, GPU_ONLY_STAGES)
    if base_stage in stages:
        stage = int(base_stage)
    elif stages:
        stage = stages[0]
    else:
        stage = 0
        out.note("schedule.state_bytes_per_param", f"{state:g} B/param matches no ZeRO stage 0-2 on {dp} "
                 "data-parallel ranks (0: 16, 1: 4+12/dp, 2: 2+14/dp; stage 3 is the zero3 system); written as "
                 "stage 0")
    out[(*ZERO, "stage")] = stage
    if not isinstance(base.get("optimizer"), dict):
        out[("optimizer",)] = {"type": "AdamW"}


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit)

def _state_text(state: Any, dp: int) -> str:
    stage = zero_stage_of(float(state), dp)
    return f"ZeRO-{stage} ({float(state):.3g} B/param)" if stage is not None else f"state_B {fmt_float(state)}"


# Stage 3's state (16/dp) is the zero3 system's: the tuner searches it there.
STATE = Knob("schedule.state_bytes_per_param", "state_B", "model state per parameter (ZeRO stage 0-2)",
             (16.0,), structural=True, dp_values=state_values, fmt=fmt_float, prefer_first=True, text_dp=_state_text)
TUNE_SPACE: tuple[Knob, ...] = (STATE,)
