"""DeepSpeed config keys shared by the systems that run the optimizer on the CPU (read and write).

The offload systems (zero_offload, zero3_offload, zero_infinity, superoffload, zero_infinity_nvme) share
most of their DeepSpeed keys: ``offload_optimizer.pin_memory``, ``overlap_comm``, ``reduce_bucket_size``,
the CPU optimizer, ``sub_group_size`` and ``stage3_prefetch_bucket_size``. Each step below reads (or writes)
one of them; a system's own module (``<system>_ds.py``) composes the steps it uses, in this order, and adds
its own keys. What each key does was read in DeepSpeed 0.19's sources (see sosim/formats/dsconfig/__init__.py).

A read step returns False when it recorded an error (the caller stops, as the reader collects every problem
and raises them at once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.hardware import model as tm
from sosim.inputs.config import ModelSpec
from sosim.schedules.blocks.ds_schema import ADAM_TYPES, BF16_BYTES_PER_ELEMENT, DS_DEFAULTS, OFFLOAD_NVME_ONLY
from sosim.schedules.system_api import DELETE, OPT, PARAM, ZERO, DsReader, Emitted, ZeroView

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario

STAGE3_BUCKET_NOTE = "kept for the 'ideal' variant; sosim's stage-3 DeepSpeed paths move gradients per sub-group"


# ---------------------------------------------------------------------------------------------- reading
def pin(m: DsReader, v: ZeroView, sec: Mapping[str, Any], section: str) -> bool:
    """pin_memory of one offload section (the deprecated cpu_offload_use_pin_memory, DeepSpeed's default)."""
    path = (*ZERO, section, "pin_memory")
    if "pin_memory" in sec and not m.is_auto(path):
        return bool(m.boolean(path))
    if "cpu_offload_use_pin_memory" in v.zero:
        return bool(m.boolean((*ZERO, "cpu_offload_use_pin_memory")))
    return v.default_pin


def read_pin(m: DsReader, v: ZeroView, sched: dict[str, Any], *, with_params: bool) -> bool:
    """pin_memory: one knob in sosim. A system that also moves parameters: pageable if either side is."""
    opt_pin = pin(m, v, v.opt, "offload_optimizer")
    pin_value = opt_pin
    reason = "" if "pin_memory" in v.opt else ("DeepSpeed default (pinned; from 0.19.5, PR 8207)" if v.default_pin
                                               else "DeepSpeed default before 0.19.5 (pageable; PR 8207)")
    if with_params:
        param_pin = pin(m, v, v.param, "offload_param")
        pin_value = opt_pin and param_pin
        if opt_pin != param_pin:
            reason = "optimizer and parameter offload differ; sosim has one pin_memory knob: pageable wins"
        if "pin_memory" in v.param:
            m.mapped((*PARAM, "pin_memory"), "schedule.pin_memory", pin_value, reason)
    if "pin_memory" in v.opt:
        m.mapped((*OPT, "pin_memory"), "schedule.pin_memory", pin_value, reason)
    elif "cpu_offload_use_pin_memory" in v.zero:
        m.mapped((*ZERO, "cpu_offload_use_pin_memory"), "schedule.pin_memory", pin_value, "deprecated spelling")
    else:
        m.defaulted((*OPT, "pin_memory"), "schedule.pin_memory", pin_value, reason)
    sched["pin_memory"] = pin_value
    return True


def read_overlap(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    """overlap_comm: DeepSpeed's default depends on the stage (runtime/zero/config.py overlap_comm_valid)."""
    path, value = v.key("overlap_comm")
    default_overlap = v.stage == 3
    if m.missing(value) or m.is_auto(path):
        sched["overlap_comm"] = default_overlap
        m.defaulted(path, "schedule.overlap_comm", default_overlap,
                    f"DeepSpeed default for stage {v.stage} (true only at stage 3)")
    else:
        b = m.boolean(path)
        if b is not None:
            sched["overlap_comm"] = b
            m.mapped(path, "schedule.overlap_comm", b)
    return True


def read_bucket(m: DsReader, v: ZeroView, sched: dict[str, Any], note: str) -> bool:
    """reduce_bucket_size (elements) -> bucket_mb (MB of bf16 gradients)."""
    path, value = v.key("reduce_bucket_size")
    hidden = int(v.model["hidden"])
    if m.missing(value):
        n = DS_DEFAULTS["reduce_bucket_size"]
        m.defaulted(path, "schedule.bucket_mb", n * BF16_BYTES_PER_ELEMENT / 1e6, f"DeepSpeed default {n:.0e} elements")
    elif m.is_auto(path):
        n = hidden * hidden
        m.mapped(path, "schedule.bucket_mb", n * BF16_BYTES_PER_ELEMENT / 1e6,
                 f"\"auto\": the HF Trainer sets hidden_size^2 = {n} elements")
    else:
        got = m.number(path, integer=True, lo=0, lo_open=True)
        if got is None:
            return False
        n = int(got)
        m.mapped(path, "schedule.bucket_mb", n * BF16_BYTES_PER_ELEMENT / 1e6,
                 f"{n} elements x 2 B; {note}".rstrip("; "))
    sched["bucket_mb"] = n * BF16_BYTES_PER_ELEMENT / 1e6
    return True


def read_optimizer(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    """The Adam that runs on the CPU: DeepSpeedCPUAdam, or torch's (optimizer.params.torch_adam)."""
    del v
    opt = m.get(("optimizer",))
    force = m.get(("zero_force_ds_cpu_optimizer",))
    forced = True if m.missing(force) else bool(m.boolean(("zero_force_ds_cpu_optimizer",)))
    if m.missing(opt):
        impl = "cpu_adam" if forced else "torch"
        m.defaulted(("optimizer",), "schedule.cpu_adam", impl,
                    "no optimizer section: the client passes one (the HF Trainer: torch AdamW); with offload "
                    "DeepSpeed requires a DeepSpeedCPUAdam unless zero_force_ds_cpu_optimizer is false (engine.py)")
        sched["cpu_adam"] = impl
        if not m.missing(force):
            m.mapped(("zero_force_ds_cpu_optimizer",), "schedule.cpu_adam", impl)
        return True
    if not m.missing(force):
        m.ignored(("zero_force_ds_cpu_optimizer",), "applies to client optimizers; the config names one")
    if not isinstance(opt, dict):
        m.error(("optimizer",), "expected an object like {\"type\": \"AdamW\"}")
        return True
    sched["cpu_adam"] = _optimizer_impl(m, opt)
    m.handled.add(("optimizer",))
    ignore_optimizer_rest(m, opt)
    return True


def _optimizer_impl(m: DsReader, opt: dict[str, Any]) -> str:
    kind = opt.get("type")
    torch_adam = False
    params = opt.get("params")
    if isinstance(params, dict) and "torch_adam" in params:
        torch_adam = bool(m.boolean(("optimizer", "params", "torch_adam")))
    if isinstance(kind, str) and kind.lower() in ADAM_TYPES:
        impl = "torch" if torch_adam else "cpu_adam"
        m.mapped(("optimizer", "type"), "schedule.cpu_adam", impl,
                 "torch_adam: torch's Adam on CPU tensors" if torch_adam else
                 "offload selects DeepSpeedCPUAdam (engine.py get_optimizer_configuration)")
        if torch_adam:
            m.mapped(("optimizer", "params", "torch_adam"), "schedule.cpu_adam", impl)
        return impl
    m.ignored(("optimizer", "type"), f"sosim times Adam/AdamW on the CPU; {kind!r} would take a different "
              "time (the prediction uses DeepSpeedCPUAdam)", affects_step=True)
    return "cpu_adam"


def ignore_optimizer_rest(m: DsReader, opt: dict[str, Any]) -> None:
    for key in opt:
        if key not in ("type", "params"):
            m.ignored(("optimizer", key), "optimizer setting; no modelled effect on time")
    params = opt.get("params")
    if isinstance(params, dict):
        rest = [k for k in params if k != "torch_adam"]
        if rest:
            m.handled.update(("optimizer", "params", k) for k in rest)
            m.note("ignored", "optimizer.params", "", None,
                   "hyperparameters (learning rate, betas, ...): no effect on the step time",
                   path=("optimizer", "params"), value={k: params[k] for k in rest})


def read_sub_group(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    """sub_group_size: the optimizer's sub-group at stage 3; ignored below it."""
    path, value = v.key("sub_group_size")
    if v.stage != 3:
        if not m.missing(value):
            m.ignored(path, "used by ZeRO stage 3 only")
        return True
    if m.missing(value) or m.is_auto(path):
        n = DS_DEFAULTS["sub_group_size"]
        m.defaulted(path, "schedule.sub_group_elements", float(n), f"DeepSpeed default {n:.0e} elements")
    else:
        got = m.number(path, integer=True, lo=0, lo_open=True)
        if got is None:
            return False
        n = int(got)
        m.mapped(path, "schedule.sub_group_elements", float(n))
    sched["sub_group_elements"] = float(n)
    return True


def prefetch_layers_for(prefetch_elements: int, layer_params: int) -> int:
    """Layers DeepSpeed fetches ahead for a prefetch bucket of ``prefetch_elements``.

    DeepSpeed's PartitionedParameterCoordinator keeps issuing parameter fetches while the elements in flight
    are under the bucket size, so the last fetch crosses it: a bucket covers ceil(elements / layer) layers.
    """
    if prefetch_elements <= 0:
        return 0
    return max(1, math.ceil(prefetch_elements / layer_params))


def read_prefetch(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    """stage3_prefetch_bucket_size (elements) -> prefetch_layers, for systems that stream parameters."""
    path, value = v.key("prefetch_bucket_size", "stage3_prefetch_bucket_size")
    hidden = int(v.model["hidden"])
    layer_params = tm.layer_params(ModelSpec.model_validate(dict(v.model)))
    if m.missing(value):
        n = DS_DEFAULTS["prefetch_bucket_size"]
        how = f"DeepSpeed default {n:.0e} elements"
    elif m.is_auto(path):
        n = int(0.9 * hidden * hidden)
        how = f"\"auto\": the HF Trainer sets 0.9 x hidden_size^2 = {n} elements"
    else:
        got = m.number(path, integer=True, lo=0)
        if got is None:
            return False
        n = int(got)
        how = ""
    layers = prefetch_layers_for(n, layer_params)
    how = (how + "; " if how else "") + f"{n} elements / {layer_params} per layer -> {layers} layer(s) ahead"
    if m.missing(value):
        m.defaulted(path, "schedule.prefetch_layers", layers, how)
    else:
        m.mapped(path, "schedule.prefetch_layers", layers, how)
    sched["prefetch_layers"] = layers
    return True


def ignore_prefetch(m: DsReader, v: ZeroView, system: str) -> bool:
    """A prefetch bucket where parameters stay in HBM (gathered one unit ahead): reported, not modelled."""
    path, value = v.key("prefetch_bucket_size", "stage3_prefetch_bucket_size")
    if not m.missing(value):
        extra = " (\"auto\": 0.9 x hidden_size^2 in the HF Trainer)" if m.is_auto(path) else ""
        m.ignored(path, "prefetch depth is modelled where parameters stream from host memory or NVMe; "
                  f"{system} gathers one unit ahead{extra}", affects_step=v.stage == 3 and v.dp > 1)
    return True


def read_ratio(m: DsReader, v: ZeroView) -> float | None:
    """offload_optimizer.ratio (None: an error was recorded)."""
    ratio_path = (*OPT, "ratio")
    if "ratio" in v.opt and not m.is_auto(ratio_path):
        r = m.number(ratio_path, integer=False, lo=0, hi=1)
        return None if r is None else float(r)
    return 1.0


def read_plain_cpu_adam(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> bool:
    """Outside super_offload: DeepSpeedCPUAdam on every core; a partial ratio is not modelled."""
    ratio = read_ratio(m, v)
    if ratio is None:
        return False
    sched["cpu_adam_core_fraction"] = 1.0
    m.note("defaulted", "zero_optimization.offload_optimizer.cpuadam_cores_perc", "schedule.cpu_adam_core_fraction",
           1.0, "DeepSpeedCPUAdam runs on all the process's cores; cpuadam_cores_perc applies to super_offload only")
    ratio_path = (*OPT, "ratio")
    if "ratio" in v.opt:
        if ratio < 1.0 and v.stage < 3:
            m.error(ratio_path, "partial offload (ratio < 1) needs stage 3; DeepSpeed asserts this "
                    "(runtime/zero/config.py offload_ratio_check)")
            return False
        m.ignored(ratio_path, "partial offload of a plain ZeRO-3 optimizer is not modelled; the prediction "
                  "has every sub-group on the CPU" if ratio < 1.0 else "1.0: everything offloaded (the "
                  "default)", affects_step=ratio < 1.0)
    if "cpuadam_cores_perc" in v.opt:
        m.ignored((*OPT, "cpuadam_cores_perc"), "read by the super_offload worker only (superoffload_utils.py)")
    return True


def ignore_nvme_only(m: DsReader, v: ZeroView, reason: str = "NVMe offload only; no effect with device cpu") -> bool:
    for section, sec in (("offload_optimizer", v.opt), ("offload_param", v.param)):
        for key in sec:
            if key in OFFLOAD_NVME_ONLY and (*ZERO, section, key) not in m.handled:
                m.ignored((*ZERO, section, key), reason)
    return True


def ignore_offload_sections(m: DsReader, v: ZeroView) -> None:
    """Systems without offload: every key of an offload section (device none) has no effect."""
    for section, sec in (("offload_optimizer", v.opt), ("offload_param", v.param)):
        for key in sec:
            if (*ZERO, section, key) not in m.handled:
                m.ignored((*ZERO, section, key), "no offload: no effect")


# ---------------------------------------------------------------------------------------------- writing
def bucket_elements(bucket_mb: float) -> int:
    return round(bucket_mb * 1e6 / BF16_BYTES_PER_ELEMENT)


def prefetch_elements(sc: Scenario, prefetch_layers: int) -> int:
    return int(prefetch_layers * tm.layer_params(sc.model))


def emit_common(sc: Scenario, base: Mapping[str, Any], out: Emitted, *, stage: int) -> None:
    """The keys every offload system writes: stage, offload_optimizer cpu, pin, overlap, bucket."""
    k = sc.schedule.model_dump()
    del base
    if k["implementation"] == "ideal":
        out.note("schedule.implementation", "ideal is the paper's schedule; DeepSpeed runs its own code path "
                 "(predict it with --set schedule.implementation=deepspeed)")
    out[(*ZERO, "stage")] = stage
    out[(*OPT, "device")] = "cpu"
    out[(*OPT, "pin_memory")] = k["pin_memory"]
    out[(*ZERO, "overlap_comm")] = k["overlap_comm"]
    out[(*ZERO, "reduce_bucket_size")] = bucket_elements(k["bucket_mb"])


def emit_no_super_offload(sc: Scenario, out: Emitted) -> None:
    """Outside super_offload: its keys removed."""
    del sc
    out[(*OPT, "super_offload")] = DELETE
    out[(*OPT, "ratio")] = DELETE
    out[(*OPT, "cpuadam_cores_perc")] = DELETE


def emit_cpu_adam_notes(sc: Scenario, out: Emitted) -> None:
    k = sc.schedule.model_dump()
    cores = k["cpu_adam_core_fraction"]
    if cores != 1.0:
        out.note("schedule.cpu_adam_core_fraction", f"{cores:g}: DeepSpeedCPUAdam uses all the process's "
                 "cores outside super_offload (limit them with OMP_NUM_THREADS / taskset instead)")
    if k["cpu_adam"] == "grace_adam":
        out.note("schedule.cpu_adam", "grace_adam is not in DeepSpeed 0.19; DeepSpeed runs DeepSpeedCPUAdam")


def emit_optimizer(sc: Scenario, base: Mapping[str, Any], out: Emitted, *, torch_adam_allowed: bool = True) -> None:
    """Adam(W) on the CPU, DeepSpeed's or torch's (optimizer.params.torch_adam)."""
    k = sc.schedule.model_dump()
    base_opt = base.get("optimizer") if isinstance(base.get("optimizer"), dict) else None
    if base_opt is None or str(base_opt.get("type", "")).lower() not in ADAM_TYPES:
        out[("optimizer",)] = {"type": "AdamW"}
        if base_opt is not None:
            out.note("optimizer.type", f"{base_opt.get('type')!r} replaced by AdamW (sosim times Adam)")
    torch_adam = k["cpu_adam"] == "torch" and torch_adam_allowed
    out[("optimizer", "params", "torch_adam")] = True if torch_adam else DELETE


def emit_params_from_host(sc: Scenario, out: Emitted, device: str, prefetch_layers: int) -> None:
    """offload_param (parameters streamed from host memory or NVMe) and its prefetch bucket."""
    k = sc.schedule.model_dump()
    out[(*PARAM, "device")] = device
    out[(*PARAM, "pin_memory")] = k["pin_memory"]
    if device == "nvme":
        out[(*PARAM, "nvme_path")] = "/local_nvme"
    out[(*ZERO, "stage3_prefetch_bucket_size")] = prefetch_elements(sc, prefetch_layers)


IMPLEMENTATION_WHY = "; implementation deepspeed (DeepSpeed 0.19's code path)"


def read_offload_start(m: DsReader, v: ZeroView, sched: dict[str, Any], *, with_params: bool, bucket_note: str) -> bool:
    """The keys every offload system reads first: implementation, pin_memory, overlap_comm, bucket, optimizer."""
    sched["implementation"] = "deepspeed"
    return (read_pin(m, v, sched, with_params=with_params) and read_overlap(m, v, sched)
            and read_bucket(m, v, sched, bucket_note) and read_optimizer(m, v, sched))
