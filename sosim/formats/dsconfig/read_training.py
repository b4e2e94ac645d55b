"""DeepSpeed JSON -> the scenario's training and cluster sections: precision, batch arithmetic (with the
GPU count it implies), clipping and activation checkpointing, with DeepSpeed's and the HF Trainer's rules."""

from __future__ import annotations

from typing import Any

from sosim.formats.dsconfig.mapper import _Decided, _enabled, _Mapper
from sosim.formats.jsonio import Note
from sosim.schedules.blocks.ds_schema import ACT_CKPT_KEYS, DS_DEFAULTS, DS_KEYS, MISSING


def _ignore_precision_keys(m: _Mapper, section: str, sec: dict[str, Any]) -> None:
    schema = DS_KEYS["bf16" if section == "bfloat16" else section]
    for key in sec:
        if key == "enabled" or key not in schema:
            continue  # unknown keys are reported by the unknown-key pass
        if key in ("bf16_master_weights_and_grads", "bf16_optimizer_states", "fp16_master_weights_and_grads"):
            m.ignored((section, key), "16-bit master weights / optimizer states change host memory and CPU "
                      "Adam bytes; sosim models fp32 master weights and moments",
                      affects_step=_enabled({"enabled": m.get((section, key))}))
        elif key == "check_grad_overflow":
            m.ignored((section, key), "bf16 overflow check: part of the DeepSpeed step sosim's DeepSpeed paths "
                      "were checked against (default true)")
        else:
            m.ignored((section, key), "loss-scaling / update settings: no modelled effect on time")


def _precision_state(m: _Mapper, section: str) -> tuple[bool, bool | None]:
    """(readable, enabled) of one precision section; enabled is None when absent or "auto"."""
    sec = m.get((section,))
    if sec is MISSING:
        return True, None
    if not isinstance(sec, dict):
        m.error((section,), "expected an object like {\"enabled\": true}")
        return False, None
    path = (section, "enabled")
    state: bool | None
    if m.is_auto(path):
        # HfTrainerDeepSpeedConfig fills bf16.enabled / fp16.enabled from --bf16 / --fp16 (default false).
        state = None
        m.handled.add(path)
    elif m.get(path) is not MISSING:
        state = m.boolean(path)
    else:
        state = False
        m.handled.add(path)
    _ignore_precision_keys(m, section, sec)
    return True, state


def _precision_from_flag(m: _Mapper, out: _Decided, bf16_key: str, flag: str) -> None:
    for section in (bf16_key, "fp16"):
        if m.get((section, "enabled")) is not MISSING:
            m.mapped((section, "enabled"), "training.precision", flag, f"--precision {flag} decides")
    m.flag("--precision", "training.precision", flag, "set on the command line")
    out.training["precision"] = flag


def _read_precision(m: _Mapper, out: _Decided) -> None:
    bf16_key = "bf16" if m.get(("bf16",)) is not MISSING or m.get(("bfloat16",)) is MISSING else "bfloat16"
    states: dict[str, bool | None] = {}
    for section in (bf16_key, "fp16"):
        readable, state = _precision_state(m, section)
        if readable:
            states[section] = state
    if m.inputs.precision is not None:
        _precision_from_flag(m, out, bf16_key, m.inputs.precision)
        return
    bf16_on, fp16_on = states.get(bf16_key), states.get("fp16")
    if bf16_on and fp16_on:
        m.error(("fp16", "enabled"), "bf16 and fp16 are both enabled; DeepSpeed rejects this (runtime/config.py)")
        return
    if bf16_on or fp16_on:
        key, precision = (bf16_key, "bf16") if bf16_on else ("fp16", "fp16")
        m.mapped((key, "enabled"), "training.precision", precision)
        out.training["precision"] = precision
        return
    auto = [s for s in (bf16_key, "fp16") if m.is_auto((s, "enabled"))]
    detail = (f"{' and '.join(s + '.enabled' for s in auto)} is \"auto\" (the HF Trainer fills it from "
              "--bf16 / --fp16, default off)" if auto else "neither bf16.enabled nor fp16.enabled is true")
    m.error((auto[0], "enabled") if auto else (bf16_key,),
            f"{detail}: DeepSpeed would train in fp32, which sosim does not model; pass --precision bf16|fp16")


_BAD: Any = object()  # a value that recorded an error: the reader stops


def _batch_key(m: _Mapper, key: str) -> Any:
    """An integer batch key: its value, "auto", None (absent) or _BAD."""
    path = (key,)
    if m.get(path) is MISSING:
        return None
    if m.is_auto(path):
        return "auto"
    value = m.number(path, integer=True, lo=1)
    return int(value) if value is not None else _BAD


def _read_sp(m: _Mapper, out: _Decided) -> int | None:
    sp = 1
    if m.get(("sequence_parallel_size",)) is not MISSING:
        n = m.number(("sequence_parallel_size",), integer=True, lo=1)
        if n is None:
            return None
        sp = int(n)
        m.mapped(("sequence_parallel_size",), "cluster.sequence_parallel", sp,
                 "Ulysses sequence parallelism: DeepSpeed divides the world size by it (runtime/config.py)")
    out.cluster["sequence_parallel"] = sp
    return sp


def _micro_batch(m: _Mapper, mb: Any) -> Any:
    """Micro-batch: the flag, else the file, else derived later (None); "auto" needs the flag."""
    flag, path = m.inputs.micro_batch, ("train_micro_batch_size_per_gpu",)
    if flag is not None:
        if isinstance(mb, int) and mb != flag:
            m.mapped(path, "training.micro_batch", flag, f"--micro-batch {flag} replaces the file's {mb}")
        elif mb is not None:
            m.mapped(path, "training.micro_batch", flag, f"set by --micro-batch {flag}")
        else:
            m.flag("--micro-batch", "training.micro_batch", flag, "set on the command line")
        return flag
    if mb == "auto":
        m.error(path, "\"auto\" (the HF Trainer fills it from --per_device_train_batch_size): pass --micro-batch N")
        return _BAD
    if isinstance(mb, int):
        m.mapped(path, "training.micro_batch", mb)
    return mb


def _grad_accum(m: _Mapper, gas: Any) -> Any:
    """Accumulation: the flag, else the file ("auto": the HF Trainer's default 1), else derived later."""
    flag, path = m.inputs.grad_accum, ("gradient_accumulation_steps",)
    if flag is not None:
        if gas is not None:
            m.mapped(path, "training.grad_accum", flag, f"set by --grad-accum {flag}")
        else:
            m.flag("--grad-accum", "training.grad_accum", flag, "set on the command line")
        return flag
    if gas == "auto":
        m.mapped(path, "training.grad_accum", 1,
                 "\"auto\": the HF Trainer's --gradient_accumulation_steps default (1); pass --grad-accum N")
        return 1
    if isinstance(gas, int):
        m.mapped(path, "training.grad_accum", gas)
    return gas


def _gpus(m: _Mapper, tbs: Any, mb: Any, gas: Any, sp: int) -> int | None:
    """GPUs: the flag, else implied by train_batch_size when micro-batch and accumulation are known, else sp."""
    gpus = m.inputs.gpus
    if gpus is not None:
        m.flag("--gpus", "cluster.gpus", gpus, "set on the command line")
        return gpus
    if isinstance(tbs, int) and isinstance(mb, int) and isinstance(gas, int):
        world, rest = divmod(tbs, mb * gas)
        if rest or world < 1:
            m.error(("train_batch_size",), f"{tbs} is not micro-batch {mb} x accumulation {gas} x a whole number "
                    "of data-parallel ranks (DeepSpeed's _batch_assertion would fail)")
            return None
        m.mapped(("train_batch_size",), "cluster.gpus", world * sp,
                 f"{tbs} / (micro-batch {mb} x accumulation {gas}) = {world} data-parallel ranks"
                 + (f" x sequence_parallel {sp}" if sp > 1 else "") + "; pass --gpus to state it")
        return world * sp
    m.notes.append(Note("defaulted", "--gpus", "command line", None, "cluster.gpus", sp,
                        m._after_set("cluster.gpus", "not given and not implied by train_batch_size: one "
                                     "data-parallel rank")))
    return sp


def _derive_batch(m: _Mapper, tbs: Any, mb: Any, gas: Any, dp: int) -> tuple[Any, Any]:
    """DeepSpeed's _set_batch_related_parameters with world_size = data-parallel ranks (_BAD: an error)."""
    path = ("train_batch_size",)
    if not isinstance(tbs, int):
        if mb is None:
            m.error(("train_micro_batch_size_per_gpu",), "missing: DeepSpeed needs train_batch_size or "
                    "train_micro_batch_size_per_gpu (or pass --micro-batch N)")
            return _BAD, _BAD
        return mb, gas
    if isinstance(mb, int) and isinstance(gas, int):
        if tbs != mb * gas * dp:
            m.error(path, f"{tbs} != micro-batch {mb} x accumulation {gas} x {dp} data-parallel ranks; DeepSpeed "
                    "rejects this (runtime/config.py _batch_assertion)")
            return _BAD, _BAD
        if path not in m.handled:
            m.mapped(path, "", tbs, f"consistent: {mb} x {gas} x {dp} data-parallel ranks")
        return mb, gas
    if isinstance(mb, int):
        gas, rest = divmod(tbs, mb * dp)
        if rest or gas < 1:
            m.error(path, f"{tbs} is not micro-batch {mb} x {dp} ranks x a whole accumulation")
            return _BAD, _BAD
        m.mapped(path, "training.grad_accum", gas, f"DeepSpeed derives accumulation = {tbs} / ({mb} x {dp} ranks)")
        return mb, gas
    if isinstance(gas, int):
        mb, rest = divmod(tbs, gas * dp)
        if rest or mb < 1:
            m.error(path, f"{tbs} is not accumulation {gas} x {dp} ranks x a whole micro-batch")
            return _BAD, _BAD
        m.mapped(path, "training.micro_batch", mb, f"DeepSpeed derives micro-batch = {tbs} / ({gas} x {dp} ranks)")
        return mb, gas
    mb, rest = divmod(tbs, dp)
    if rest:
        m.error(path, f"{tbs} is not a multiple of the {dp} data-parallel ranks")
        return _BAD, _BAD
    m.mapped(path, "training.micro_batch", mb, f"DeepSpeed: accumulation 1, micro-batch = {tbs} / {dp} ranks")
    return mb, 1


def _read_batch(m: _Mapper, out: _Decided) -> None:
    """train_batch_size = micro x accumulation x data-parallel ranks, as runtime/config.py derives it."""
    tbs, mb, gas = (_batch_key(m, k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                 "gradient_accumulation_steps"))
    if _BAD in (tbs, mb, gas):
        return
    sp = _read_sp(m, out)
    if sp is None:
        return
    mb = _micro_batch(m, mb)
    if mb is _BAD:
        return
    gas = _grad_accum(m, gas)
    if tbs == "auto":
        m.ignored(("train_batch_size",), "the HF Trainer computes it as micro-batch x accumulation x world size")
        tbs = None
    gpus = _gpus(m, tbs, mb, gas, sp)
    if gpus is None:
        return
    if gpus % sp:
        m.error(("sequence_parallel_size",), f"{sp} does not divide the {gpus} GPUs")
        return
    m.dp = gpus // sp
    out.cluster["gpus"] = gpus
    mb, gas = _derive_batch(m, tbs, mb, gas, m.dp)
    if mb is _BAD:
        return
    if gas is None:
        gas = DS_DEFAULTS["gradient_accumulation_steps"]
        m.defaulted(("gradient_accumulation_steps",), "training.grad_accum", gas, "DeepSpeed default")
    out.training["micro_batch"] = mb
    out.training["grad_accum"] = gas


def _read_clipping(m: _Mapper, out: _Decided, default: float) -> None:
    """``default``: the release's GRADIENT_CLIPPING_DEFAULT (runtime/constants.py): 0.0 before 0.19.3, 1.0 from
    PR 8068 (sosim/schedules/blocks/ds_version.py)."""
    path = ("gradient_clipping",)
    if m.get(path) is MISSING:
        out.training["gradient_clipping"] = default
        m.defaulted(path, "training.gradient_clipping", default,
                    "DeepSpeed default (runtime/constants.py; 0 before 0.19.3, 1.0 from PR 8068)")
    elif m.is_auto(path):
        out.training["gradient_clipping"] = 1.0
        m.mapped(path, "training.gradient_clipping", 1.0, "\"auto\": the HF Trainer's --max_grad_norm default (1.0)")
    else:
        value = m.number(path, integer=False, lo=0)
        if value is not None:
            out.training["gradient_clipping"] = float(value)
            m.mapped(path, "training.gradient_clipping", float(value))


def _read_ckpt(m: _Mapper, out: _Decided) -> None:
    section = m.get(("activation_checkpointing",))
    flag = m.inputs.activation_checkpointing
    if isinstance(section, dict):
        for key in section:
            reason, affects = ACT_CKPT_KEYS.get(key, ("not a DeepSpeed 0.19 activation-checkpointing key", False))
            on = _enabled({"enabled": section[key]}) if isinstance(section[key], bool) else bool(section[key])
            m.ignored(("activation_checkpointing", key), reason, affects_step=affects and on)
        m.handled.add(("activation_checkpointing",))
    elif section is not MISSING:
        m.error(("activation_checkpointing",), "expected an object")
    if flag is not None:
        out.training["activation_checkpointing"] = flag
        m.flag("--activation-checkpointing", "training.activation_checkpointing", flag,
               "set on the command line")
        return
    out.training["activation_checkpointing"] = True
    why = ("the model code decides (HF: gradient_checkpointing_enable() / --gradient_checkpointing; "
           "DeepSpeed: deepspeed.checkpointing.checkpoint)")
    if section is not MISSING:
        why = "this section configures deepspeed.checkpointing, which the model code must call; " + why
    m.notes.append(Note("defaulted", "--activation-checkpointing", "command line", None,
                        "training.activation_checkpointing", True,
                        m._after_set("training.activation_checkpointing",
                                     f"{why}: sosim assumes on; pass --activation-checkpointing off otherwise")))
