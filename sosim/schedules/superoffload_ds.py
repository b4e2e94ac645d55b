"""superoffload (sosim/schedules/superoffload.py): its DeepSpeed form and its tuning space.

DeepSpeed: stage 3 with ``offload_optimizer: {device: cpu, super_offload: true}``; ``ratio`` is the share of
sub-groups updated on the CPU (sosim's ``gpu_optimizer_fraction`` = 1 - ratio), ``cpuadam_cores_perc`` the
worker's share of the cores, ``offload_param: {device: cpu}`` streams the bf16 weights from CPU memory
(``weight_placement: flow``). The DeepSpeed path casts on the CPU and speculates whenever clipping is off
(superoffload_stage3.py); the paper's choices (cast on the GPU, 64 MB buckets, GraceAdam) are not config keys.

Grids: ``gpu_optimizer_fraction`` (1 - ratio) from 0 (DeepSpeed's default ratio 1.0) to 1; the SuperOffload
artifact runs 0.01-0.1 (ratio 0.9-0.99) and NeMo-RL issue 3628 measured 0-100%. ``cpu_adam_core_fraction``
(cpuadam_cores_perc) 0.5 to 1.0 around DeepSpeed's default 0.8. The paper's transfer buckets: 16 MB to 1 GB
around its 64 MB.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.ds_schema import DS_DEFAULTS
from sosim.schedules.blocks.tuning import IDEAL_ONLY, OVERLAP, SUB_GROUP, Knob, fmt_float
from sosim.schedules.system_api import DELETE, OPT, PARAM, ZERO, DeepSpeedForm, DsReader, Emitted, ZeroView

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario

WORKER_ADAM = "the SuperOffload worker always runs DeepSpeedCPUAdam (superoffload_utils.py)"


def claims(v: ZeroView) -> str | None:
    if v.opt_dev == "cpu" and v.stage == 3 and v.is_super and v.param_dev != "nvme":
        return ("stage 3 + offload_optimizer.super_offload: SuperOffloadOptimizer_Stage3 (engine.py)"
                + offload_ds.IMPLEMENTATION_WHY)
    return None


def _read_optimizer(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    del v
    opt = m.get(("optimizer",))
    sched["cpu_adam"] = "cpu_adam"
    if isinstance(opt, dict) and "type" in opt:
        m.mapped(("optimizer", "type"), "schedule.cpu_adam", "cpu_adam", WORKER_ADAM)
    else:
        m.defaulted(("optimizer",), "schedule.cpu_adam", "cpu_adam", WORKER_ADAM)
    if not m.missing(m.get(("zero_force_ds_cpu_optimizer",))):
        m.ignored(("zero_force_ds_cpu_optimizer",), WORKER_ADAM)
    if isinstance(opt, dict):
        m.handled.add(("optimizer",))
        if isinstance(opt.get("params"), dict) and "torch_adam" in opt["params"]:
            m.ignored(("optimizer", "params", "torch_adam"), WORKER_ADAM)
        offload_ds.ignore_optimizer_rest(m, opt)
    return True


def _read_ratio_cores(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    ratio = offload_ds.read_ratio(m, v)
    if ratio is None:
        return False
    ratio_path, cores_path = (*OPT, "ratio"), (*OPT, "cpuadam_cores_perc")
    sched["gpu_optimizer_fraction"] = round(1.0 - ratio, 12)
    if "ratio" in v.opt:
        m.mapped(ratio_path, "schedule.gpu_optimizer_fraction", sched["gpu_optimizer_fraction"],
                 "1 - ratio: the share of sub-groups whose optimizer stays on the GPU")
    else:
        m.defaulted(ratio_path, "schedule.gpu_optimizer_fraction", 0.0, "DeepSpeed default ratio 1.0")
    cores = DS_DEFAULTS["cpuadam_cores_perc"]
    if "cpuadam_cores_perc" in v.opt and not m.is_auto(cores_path):
        c = m.number(cores_path, integer=False, lo=0, lo_open=True, hi=1)
        if c is None:
            return False
        cores = float(c)
        m.mapped(cores_path, "schedule.cpu_adam_core_fraction", cores,
                 "the SuperOffload worker's share of the cores (superoffload_utils.py)")
    else:
        m.defaulted(cores_path, "schedule.cpu_adam_core_fraction", cores, "DeepSpeed default 0.8")
    sched["cpu_adam_core_fraction"] = cores
    return True


def _read_placement(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    placement = "flow" if v.param_dev == "cpu" else "stationary"
    sched["weight_placement"] = placement
    # The DeepSpeed path casts on the CPU and speculates whenever clipping is off; both follow from the
    # implementation (superoffload_stage3.py), so they are written as such.
    sched["cast"] = "cpu"
    sched["speculation"] = True
    reason = ("offload_param cpu: bf16 weights stream from CPU memory" if placement == "flow"
              else "no offload_param: bf16 weights stay in HBM")
    m.note("defaulted", "zero_optimization.offload_param", "schedule.weight_placement", placement, reason)


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    sched["implementation"] = "deepspeed"
    ok = (offload_ds.read_pin(m, v, sched, with_params=False) and offload_ds.read_overlap(m, v, sched)
          and offload_ds.read_bucket(m, v, sched, offload_ds.STAGE3_BUCKET_NOTE) and _read_optimizer(m, v, sched)
          and offload_ds.read_sub_group(m, v, sched) and offload_ds.ignore_prefetch(m, v, "superoffload")
          and _read_ratio_cores(m, v, sched))
    if ok:
        _read_placement(m, v, sched)
        offload_ds.ignore_nvme_only(m, v)


def weight_flow(sc: Scenario) -> bool:
    from sosim.schedules import superoffload  # the placement rule lives with the schedule

    assert isinstance(sc.schedule, superoffload.SuperOffloadKnobs)
    return superoffload.placement(sc, sc.schedule)[0]


def _paper_notes(sc: Scenario, out: Emitted) -> None:
    k = sc.schedule.model_dump()
    if k["implementation"] == "ideal":
        if k["cast"] == "gpu":
            out.note("schedule.cast", "gpu (fp32 over the link, cast on the GPU) is the paper's; DeepSpeed casts on "
                     "the CPU")
        out.note("schedule.bucket_mb", f"{k['bucket_mb']:g} MB transfer buckets are the paper's; DeepSpeed's "
                 "SuperOffload moves gradients per sub-group (sub_group_size)")
    if not k["speculation"] and sc.training.gradient_clipping == 0:
        out.note("schedule.speculation", "false has no DeepSpeed switch (its SuperOffload speculates whenever "
                 "gradient_clipping is 0)")
    if k["cpu_adam"] != "cpu_adam":
        out.note("schedule.cpu_adam", f"{k['cpu_adam']}: DeepSpeed's SuperOffload worker always runs DeepSpeedCPUAdam")


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    k = sc.schedule.model_dump()
    flow = weight_flow(sc)
    if not flow:
        out[PARAM] = DELETE
    offload_ds.emit_common(sc, base, out, stage=3)
    out[(*ZERO, "sub_group_size")] = round(k["sub_group_elements"])
    out[(*OPT, "super_offload")] = True
    out[(*OPT, "ratio")] = round(1.0 - k["gpu_optimizer_fraction"], 12)
    out[(*OPT, "cpuadam_cores_perc")] = k["cpu_adam_core_fraction"]
    if flow:
        out[(*PARAM, "device")] = "cpu"
        out[(*PARAM, "pin_memory")] = k["pin_memory"]
    _paper_notes(sc, out)
    offload_ds.emit_optimizer(sc, base, out, torch_adam_allowed=False)


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit, checks_max_live=True)


def _fmt_ratio(v: Any) -> str:
    # Shown as DeepSpeed's ratio (share of sub-groups updated on the CPU), which is what users set.
    return f"{1.0 - float(v):.3g}"


GPU_FRACTION = Knob(
    "schedule.gpu_optimizer_fraction", "ratio", "SuperOffload ratio (share of sub-groups updated on the CPU)",
    (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0), refine="linear", bounds=(0.0, 1.0), memory=True, fmt=_fmt_ratio)
CORES = Knob(
    "schedule.cpu_adam_core_fraction", "cores", "CPU Adam core fraction (cpuadam_cores_perc)",
    (0.5, 0.65, 0.8, 0.9, 1.0), refine="linear", bounds=(0.05, 1.0), fmt=fmt_float)
PLACEMENT = Knob(
    "schedule.weight_placement", "weights", "weight placement (stationary in HBM, or flow from CPU memory)",
    ("stationary", "flow"), structural=True)
CAST = Knob("schedule.cast", "cast", "where fp32<->bf16 casts run (paper: GPU)", ("gpu", "cpu"),
            implementations=IDEAL_ONLY)
SO_BUCKET = Knob(
    "schedule.bucket_mb", "bucket_MB", "SuperOffload transfer bucket (MB)", (16.0, 64.0, 256.0, 1000.0),
    implementations=IDEAL_ONLY, refine="log", bounds=(4.0, 4000.0), memory=True, fmt=fmt_float)
TUNE_SPACE: tuple[Knob, ...] = (PLACEMENT, GPU_FRACTION, SUB_GROUP, CORES, CAST, SO_BUCKET, OVERLAP)
