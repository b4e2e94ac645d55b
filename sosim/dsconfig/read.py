"""DeepSpeed JSON -> scenario: :func:`map_ds_config` / :func:`load_ds_mapping`, with a report on every key."""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sosim import model as tm
from sosim.config import ModelSpec
from sosim.dsconfig.schema import (
    _ACT_CKPT_KEYS,
    _MISSING,
    _TOP_IGNORED,
    _TOP_MAPPED,
    _ZERO_IGNORED,
    _ZERO_TYPES,
    DEFAULT_SEQ_LEN,
    DS_DEFAULTS,
    DS_KEYS,
    DS_KEYS_ONE_VERSION,
    SCHEMA_SOURCE,
    ZERO_ALIASES,
)
from sosim.errors import ConfigError
from sosim.hf_model import HfModel, load_hf_model
from sosim.jsonio import Note, notes_by_status, read_json
from sosim.loader import KeyPath, Located, parse_override
from sosim.schedules import registry
from sosim.schedules.offload_ds import prefetch_layers_for as prefetch_layers_for
from sosim.schedules.system_api import DeepSpeedForm, ZeroView


# --------------------------------------------------------------------------------------------------------
# DeepSpeed JSON -> scenario
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunInputs:
    """Everything besides the two files that a DeepSpeed config alone cannot say (flags of ``sosim run``).

    ``None`` means not given: the value comes from the config, from DeepSpeed's or the HF Trainer's
    defaults, or from a stated sosim default, and the report says which.
    """

    hardware: str
    gpus: int | None = None
    seq_len: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    precision: str | None = None  # bf16 | fp16
    activation_checkpointing: bool | None = None
    overrides: tuple[str, ...] = ()  # --set texts: the report says which mapped values they replace


@dataclass
class DsMapping:
    """A scenario dict (YAML-level keys) built from a DeepSpeed config and a model config, and the report."""

    scenario: dict[str, Any]
    notes: list[Note]
    model_notes: list[Note]
    ds_origin: str
    model_origin: str

    def report(self) -> dict[str, Any]:
        """The JSON form printed under ``ds_config_mapping`` by ``sosim run --format json``."""
        return {
            "ds_config": self.ds_origin, "model_config": self.model_origin,
            "semantics": "DeepSpeed 0.19 (defaults, batch arithmetic, validators) with Hugging Face Trainer "
                         "rules for 'auto'",
            **notes_by_status(self.notes),
            "model": notes_by_status(self.model_notes),
            "scenario": self.scenario,
        }

    def format(self) -> str:
        """The text report (stderr of ``sosim run``)."""
        lines = [f"sosim: DeepSpeed config {self.ds_origin} -> scenario (DeepSpeed 0.19 semantics)"]
        for status in ("mapped", "defaulted", "ignored"):
            lines += [n.line() for n in self.notes if n.status == status]
        lines.append(f"sosim: model config {self.model_origin} -> model")
        for status in ("mapped", "defaulted", "ignored"):
            lines += [n.line() for n in self.model_notes if n.status == status]
        return "\n".join(lines)


def _dotted(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Mapper:
    """Reads one DeepSpeed config; every read key leaves a note; problems are collected, then raised at once."""

    def __init__(self, loc: Located, inputs: RunInputs) -> None:
        self.loc = loc
        self.inputs = inputs
        self.notes: list[Note] = []
        self.problems: list[str] = []
        self.handled: set[KeyPath] = set()
        self.override_paths = {_dotted(parse_override(o)[0]): o for o in inputs.overrides}
        self.dp = 1  # data-parallel ranks, known once the batch keys are read

    # ---- access --------------------------------------------------------------------------------------
    def get(self, path: KeyPath) -> Any:
        node: Any = self.loc.data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return _MISSING
            node = node[key]
        return node

    def where(self, path: KeyPath) -> str:
        return self.loc.where(path)

    def error(self, path: KeyPath, message: str) -> None:
        self.handled.add(path)
        self.problems.append(f"{self.where(path)}: {_dotted(path) or '(top level)'}: {message}")

    def _after_set(self, to: str, reason: str) -> str:
        text = self.override_paths.get(to)
        if text is None:
            return reason
        return f"{reason}; then replaced by --set {text}" if reason else f"replaced by --set {text}"

    def mapped(self, path: KeyPath, to: str, as_value: Any, reason: str = "") -> None:
        self.handled.add(path)
        self.notes.append(Note("mapped", _dotted(path), self.where(path), self.get(path), to, as_value,
                               self._after_set(to, reason)))

    def defaulted(self, path: KeyPath, to: str, as_value: Any, reason: str) -> None:
        self.handled.add(path)
        self.notes.append(Note("defaulted", _dotted(path), self.loc.origin, None, to, as_value,
                               self._after_set(to, reason)))

    def flag(self, flag: str, to: str, as_value: Any, reason: str, status: str = "mapped") -> None:
        note_status: Any = status
        self.notes.append(Note(note_status, flag, "command line", as_value if status == "mapped" else None, to,
                               as_value, self._after_set(to, reason)))

    def ignored(self, path: KeyPath, reason: str, affects_step: bool = False) -> None:
        self.handled.add(path)
        self.notes.append(Note("ignored", _dotted(path), self.where(path), self.get(path), reason=reason,
                               affects_step=affects_step))

    def note(self, status: str, key: str, to: str, as_value: Any, reason: str, *, path: KeyPath | None = None,
             value: Any = None) -> None:
        """A note that marks nothing handled: a value derived from other keys (where: ``path``, else the file)."""
        kind: Any = status
        where = self.where(path) if path is not None else self.loc.origin
        self.notes.append(Note(kind, key, where, value, to, as_value, reason))

    @staticmethod
    def missing(value: Any) -> bool:
        return value is _MISSING

    # ---- typed reads: DeepSpeed's pydantic rules (lax: 1e8 for an int is fine, a fraction is not) -------
    def number(self, path: KeyPath, *, integer: bool, lo: float | None = None, lo_open: bool = False,
               hi: float | None = None) -> float | int | None:
        """The value at ``path``; None (and an error) when it is not a number in range."""
        value = self.get(path)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                self.error(path, f"expected a number, got {json.dumps(self.get(path))}")
                return None
        if not _is_number(value) or not math.isfinite(value):
            self.error(path, f"expected a number, got {json.dumps(self.get(path))}")
            return None
        if integer:
            if float(value) != int(value):
                self.error(path, f"expected a whole number, got {value}")
                return None
            value = int(value)
        if lo is not None and (value < lo or (lo_open and value == lo)):
            self.error(path, f"must be {'>' if lo_open else '>='} {lo:g}, got {value}")
            return None
        if hi is not None and value > hi:
            self.error(path, f"must be <= {hi:g}, got {value}")
            return None
        return value

    def boolean(self, path: KeyPath) -> bool | None:
        value = self.get(path)
        if isinstance(value, bool):
            return value
        if value in (0, 1) and not isinstance(value, float):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.error(path, f"expected true or false, got {json.dumps(value)}")
        return None

    def is_auto(self, path: KeyPath) -> bool:
        return self.get(path) == "auto"


def _enabled(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value.get("enabled", False))
    return bool(value)


@dataclass
class _Decided:
    """Values decided while reading, before the scenario dict is assembled."""

    training: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)


def _read_precision(m: _Mapper, out: _Decided) -> None:
    bf16_key = "bf16" if m.get(("bf16",)) is not _MISSING or m.get(("bfloat16",)) is _MISSING else "bfloat16"
    states: dict[str, bool | None] = {}
    for section in (bf16_key, "fp16"):
        sec = m.get((section,))
        if sec is _MISSING:
            states[section] = None
            continue
        if not isinstance(sec, dict):
            m.error((section,), "expected an object like {\"enabled\": true}")
            continue
        schema = DS_KEYS["bf16" if section == "bfloat16" else section]
        path = (section, "enabled")
        if m.is_auto(path):
            # HfTrainerDeepSpeedConfig fills bf16.enabled / fp16.enabled from --bf16 / --fp16 (default false).
            states[section] = None
            m.handled.add(path)
        elif m.get(path) is not _MISSING:
            states[section] = m.boolean(path)
        else:
            states[section] = False
            m.handled.add(path)
        for key in sec:
            if key == "enabled":
                continue
            if key not in schema:
                continue  # reported by the unknown-key pass
            if key in ("bf16_master_weights_and_grads", "bf16_optimizer_states", "fp16_master_weights_and_grads"):
                m.ignored((section, key), "16-bit master weights / optimizer states change host memory and CPU "
                          "Adam bytes; sosim models fp32 master weights and moments",
                          affects_step=_enabled({"enabled": m.get((section, key))}))
            elif key == "check_grad_overflow":
                m.ignored((section, key), "bf16 overflow check: part of the DeepSpeed step sosim's DeepSpeed paths "
                          "were checked against (default true)")
            else:
                m.ignored((section, key), "loss-scaling / update settings: no modelled effect on time")
    bf16_on, fp16_on = states.get(bf16_key), states.get("fp16")
    flag = m.inputs.precision
    if flag is not None:
        for section in (bf16_key, "fp16"):
            if m.get((section, "enabled")) is not _MISSING:
                m.mapped((section, "enabled"), "training.precision", flag, f"--precision {flag} decides")
        m.flag("--precision", "training.precision", flag, "set on the command line")
        out.training["precision"] = flag
        return
    if bf16_on and fp16_on:
        m.error(("fp16", "enabled"), "bf16 and fp16 are both enabled; DeepSpeed rejects this (runtime/config.py)")
        return
    if bf16_on:
        m.mapped((bf16_key, "enabled"), "training.precision", "bf16")
        out.training["precision"] = "bf16"
    elif fp16_on:
        m.mapped(("fp16", "enabled"), "training.precision", "fp16")
        out.training["precision"] = "fp16"
    else:
        auto = [s for s in (bf16_key, "fp16") if m.is_auto((s, "enabled"))]
        detail = (f"{' and '.join(s + '.enabled' for s in auto)} is \"auto\" (the HF Trainer fills it from "
                  "--bf16 / --fp16, default off)" if auto else "neither bf16.enabled nor fp16.enabled is true")
        m.error((auto[0], "enabled") if auto else (bf16_key,),
                f"{detail}: DeepSpeed would train in fp32, which sosim does not model; "
                "pass --precision bf16|fp16")


def _read_batch(m: _Mapper, out: _Decided) -> None:
    """train_batch_size = micro x accumulation x data-parallel ranks, as runtime/config.py derives it."""
    inp = m.inputs

    def read(key: str) -> int | str | None:
        path = (key,)
        if m.get(path) is _MISSING:
            return None
        if m.is_auto(path):
            return "auto"
        value = m.number(path, integer=True, lo=1)
        return int(value) if value is not None else "bad"

    tbs, mb, gas = read("train_batch_size"), read("train_micro_batch_size_per_gpu"), read("gradient_accumulation_steps")
    if "bad" in (tbs, mb, gas):
        return
    sp_val = m.get(("sequence_parallel_size",))
    sp = 1
    if sp_val is not _MISSING:
        n = m.number(("sequence_parallel_size",), integer=True, lo=1)
        if n is None:
            return
        sp = int(n)
        m.mapped(("sequence_parallel_size",), "cluster.sequence_parallel", sp,
                 "Ulysses sequence parallelism: DeepSpeed divides the world size by it (runtime/config.py)")
    out.cluster["sequence_parallel"] = sp

    # Micro-batch: flag, else the file, else derived (below); "auto" needs the flag.
    if inp.micro_batch is not None:
        if isinstance(mb, int) and mb != inp.micro_batch:
            m.mapped(("train_micro_batch_size_per_gpu",), "training.micro_batch", inp.micro_batch,
                     f"--micro-batch {inp.micro_batch} replaces the file's {mb}")
        elif mb is not None:
            m.mapped(("train_micro_batch_size_per_gpu",), "training.micro_batch", inp.micro_batch,
                     f"set by --micro-batch {inp.micro_batch}")
        else:
            m.flag("--micro-batch", "training.micro_batch", inp.micro_batch, "set on the command line")
        mb = inp.micro_batch
    elif mb == "auto":
        m.error(("train_micro_batch_size_per_gpu",), "\"auto\" (the HF Trainer fills it from "
                "--per_device_train_batch_size): pass --micro-batch N")
        return
    elif isinstance(mb, int):
        m.mapped(("train_micro_batch_size_per_gpu",), "training.micro_batch", mb)
    if inp.grad_accum is not None:
        if gas is not None:
            m.mapped(("gradient_accumulation_steps",), "training.grad_accum", inp.grad_accum,
                     f"set by --grad-accum {inp.grad_accum}")
        else:
            m.flag("--grad-accum", "training.grad_accum", inp.grad_accum, "set on the command line")
        gas = inp.grad_accum
    elif gas == "auto":
        gas = 1
        m.mapped(("gradient_accumulation_steps",), "training.grad_accum", 1,
                 "\"auto\": the HF Trainer's --gradient_accumulation_steps default (1); pass --grad-accum N")
    elif isinstance(gas, int):
        m.mapped(("gradient_accumulation_steps",), "training.grad_accum", gas)
    if tbs == "auto":
        m.ignored(("train_batch_size",), "the HF Trainer computes it as micro-batch x accumulation x world size")
        tbs = None

    # GPUs: flag, else implied by train_batch_size when micro-batch and accumulation are known, else 1.
    gpus = inp.gpus
    if gpus is not None:
        m.flag("--gpus", "cluster.gpus", gpus, "set on the command line")
    elif isinstance(tbs, int) and isinstance(mb, int) and isinstance(gas, int):
        world, rest = divmod(tbs, mb * gas)
        if rest or world < 1:
            m.error(("train_batch_size",), f"{tbs} is not micro-batch {mb} x accumulation {gas} x a whole number "
                    "of data-parallel ranks (DeepSpeed's _batch_assertion would fail)")
            return
        gpus = world * sp
        m.mapped(("train_batch_size",), "cluster.gpus", gpus,
                 f"{tbs} / (micro-batch {mb} x accumulation {gas}) = {world} data-parallel ranks"
                 + (f" x sequence_parallel {sp}" if sp > 1 else "") + "; pass --gpus to state it")
    else:
        gpus = sp
        m.notes.append(Note("defaulted", "--gpus", "command line", None, "cluster.gpus", gpus,
                            m._after_set("cluster.gpus", "not given and not implied by train_batch_size: one "
                                         "data-parallel rank")))
    if gpus % sp:
        m.error(("sequence_parallel_size",), f"{sp} does not divide the {gpus} GPUs")
        return
    dp = gpus // sp
    m.dp = dp
    out.cluster["gpus"] = gpus

    # DeepSpeed's _set_batch_related_parameters with world_size = data-parallel ranks.
    if isinstance(tbs, int) and isinstance(mb, int) and isinstance(gas, int):
        if tbs != mb * gas * dp:
            m.error(("train_batch_size",), f"{tbs} != micro-batch {mb} x accumulation {gas} x {dp} data-parallel "
                    "ranks; DeepSpeed rejects this (runtime/config.py _batch_assertion)")
            return
        if ("train_batch_size",) not in m.handled:
            m.mapped(("train_batch_size",), "", tbs, f"consistent: {mb} x {gas} x {dp} data-parallel ranks")
    elif isinstance(tbs, int) and isinstance(mb, int):
        gas, rest = divmod(tbs, mb * dp)
        if rest or gas < 1:
            m.error(("train_batch_size",), f"{tbs} is not micro-batch {mb} x {dp} ranks x a whole accumulation")
            return
        m.mapped(("train_batch_size",), "training.grad_accum", gas,
                 f"DeepSpeed derives accumulation = {tbs} / ({mb} x {dp} ranks)")
    elif isinstance(tbs, int) and isinstance(gas, int):
        mb, rest = divmod(tbs, gas * dp)
        if rest or mb < 1:
            m.error(("train_batch_size",), f"{tbs} is not accumulation {gas} x {dp} ranks x a whole micro-batch")
            return
        m.mapped(("train_batch_size",), "training.micro_batch", mb,
                 f"DeepSpeed derives micro-batch = {tbs} / ({gas} x {dp} ranks)")
    elif isinstance(tbs, int):
        mb, rest = divmod(tbs, dp)
        if rest:
            m.error(("train_batch_size",), f"{tbs} is not a multiple of the {dp} data-parallel ranks")
            return
        gas = 1
        m.mapped(("train_batch_size",), "training.micro_batch", mb,
                 f"DeepSpeed: accumulation 1, micro-batch = {tbs} / {dp} ranks")
    elif mb is None:
        m.error(("train_micro_batch_size_per_gpu",), "missing: DeepSpeed needs train_batch_size or "
                "train_micro_batch_size_per_gpu (or pass --micro-batch N)")
        return
    if gas is None:
        gas = DS_DEFAULTS["gradient_accumulation_steps"]
        m.defaulted(("gradient_accumulation_steps",), "training.grad_accum", gas, "DeepSpeed default")
    out.training["micro_batch"] = mb
    out.training["grad_accum"] = gas


def _read_clipping(m: _Mapper, out: _Decided) -> None:
    path = ("gradient_clipping",)
    if m.get(path) is _MISSING:
        out.training["gradient_clipping"] = DS_DEFAULTS["gradient_clipping"]
        m.defaulted(path, "training.gradient_clipping", 0.0, "DeepSpeed default: no clipping (runtime/constants.py)")
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
            reason, affects = _ACT_CKPT_KEYS.get(key, ("not a DeepSpeed 0.19 activation-checkpointing key", False))
            on = _enabled({"enabled": section[key]}) if isinstance(section[key], bool) else bool(section[key])
            m.ignored(("activation_checkpointing", key), reason, affects_step=affects and on)
        m.handled.add(("activation_checkpointing",))
    elif section is not _MISSING:
        m.error(("activation_checkpointing",), "expected an object")
    if flag is not None:
        out.training["activation_checkpointing"] = flag
        m.flag("--activation-checkpointing", "training.activation_checkpointing", flag,
               "set on the command line")
        return
    out.training["activation_checkpointing"] = True
    why = ("the model code decides (HF: gradient_checkpointing_enable() / --gradient_checkpointing; "
           "DeepSpeed: deepspeed.checkpointing.checkpoint)")
    if section is not _MISSING:
        why = "this section configures deepspeed.checkpointing, which the model code must call; " + why
    m.notes.append(Note("defaulted", "--activation-checkpointing", "command line", None,
                        "training.activation_checkpointing", True,
                        m._after_set("training.activation_checkpointing",
                                     f"{why}: sosim assumes on; pass --activation-checkpointing off otherwise")))


def _zero_section(m: _Mapper) -> tuple[dict[str, Any], int] | None:
    """The zero_optimization section ({} when absent or a boolean) and its stage; None after an error."""
    z = ("zero_optimization",)
    zero = m.get(z)
    if zero is _MISSING or zero is None:
        m.defaulted((*z, "stage"), "schedule.system", "gpu_only", "no zero_optimization: ZeRO disabled (stage 0)")
        return {}, 0
    if isinstance(zero, bool):
        # runtime/zero/config.py read_zero_config_deprecated: true means stage 1.
        m.handled.add(z)
        return {}, 1 if zero else 0
    if not isinstance(zero, dict):
        m.error(z, "expected an object")
        return None
    m.handled.add(z)
    stage = 0
    if "stage" in zero:
        if m.is_auto((*z, "stage")):
            m.ignored((*z, "stage"), "\"auto\" is dropped by DeepSpeedConfigModel: stage 0")
        else:
            s = m.number((*z, "stage"), integer=True, lo=0, hi=3)
            if s is None:
                return None
            stage = int(s)
    return zero, stage


def _check_zero_values(m: _Mapper, zero: dict[str, Any]) -> None:
    """Aliases given twice, then value types of every field (DeepSpeed rejects a bad value whether or not it
    matters for speed)."""
    z = ("zero_optimization",)
    for alias, name in ZERO_ALIASES.items():
        if alias in zero and name in zero:
            m.error((*z, alias), f"given twice, as {alias} and {name}")
    for key, value in zero.items():
        kind = _ZERO_TYPES.get(ZERO_ALIASES.get(key, key))
        if kind is not None and value != "auto":
            if kind == "bool":
                m.boolean((*z, key))
            else:
                m.number((*z, key), integer=True, lo=0)
            m.handled.discard((*z, key))  # checked, not yet accounted for in the report


def _deprecated_device(m: _Mapper, zero: dict[str, Any], section: str, deprecated: str,
                       given: bool) -> str | None:
    """The device a deprecated boolean (cpu_offload, cpu_offload_param) gives, when it decides one."""
    z = ("zero_optimization",)
    on = m.boolean((*z, deprecated))
    if given:
        m.error((*z, deprecated), f"deprecated; cannot be given together with {section} (DeepSpeed asserts this in "
                "config_utils.py)")
        return None
    if on:
        m.mapped((*z, deprecated), f"{section}.device", "cpu", f"deprecated spelling of {section}: {{device: cpu}}")
        return "cpu"
    m.mapped((*z, deprecated), f"{section}.device", "none", "deprecated; false means no offload")
    return None


def _offload_device(m: _Mapper, zero: dict[str, Any], section: str, deprecated: str) -> tuple[str, dict[str, Any]]:
    """Offload device and section, including the deprecated booleans (cpu_offload -> offload_optimizer cpu)."""
    z = ("zero_optimization",)
    sec: Any = zero.get(section, _MISSING)
    if sec is None:
        m.handled.add((*z, section))
        sec = _MISSING
    if sec is not _MISSING and not isinstance(sec, dict):
        m.error((*z, section), "expected an object like {\"device\": \"cpu\"}")
        return "none", {}
    if deprecated in zero and _deprecated_device(m, zero, section, deprecated, sec is not _MISSING) == "cpu":
        return "cpu", {}
    if not isinstance(sec, dict):
        return "none", {}
    m.handled.add((*z, section))
    dev_path = (*z, section, "device")
    dev = sec.get("device", "none")
    if m.is_auto(dev_path):
        dev = "none"
    if dev not in ("none", "cpu", "nvme"):
        m.error(dev_path, f"expected \"none\", \"cpu\" or \"nvme\", got {json.dumps(dev)}")
        return "none", sec
    m.handled.add(dev_path)
    return dev, sec


def _zero_view(m: _Mapper, out: _Decided, model: dict[str, Any]) -> ZeroView | None:
    """The ZeRO section parsed into what chooses a system (None after an error)."""
    parsed = _zero_section(m)
    if parsed is None:
        return None
    zero, stage = parsed
    _check_zero_values(m, zero)
    if m.problems:
        return None
    opt_dev, opt = _offload_device(m, zero, "offload_optimizer", "cpu_offload")
    param_dev, param = _offload_device(m, zero, "offload_param", "cpu_offload_param")
    if m.problems:
        return None
    super_path = ("zero_optimization", "offload_optimizer", "super_offload")
    is_super = "super_offload" in opt and not m.is_auto(super_path) and bool(m.boolean(super_path))
    dp = out.cluster.get("gpus", 1) // out.cluster.get("sequence_parallel", 1)
    return ZeroView(zero=zero, stage=stage, opt_dev=opt_dev, opt=opt, param_dev=param_dev, param=param,
                    is_super=is_super, dp=dp, model=model)


def _unmodelled(v: ZeroView) -> tuple[KeyPath, str]:
    """Why no system reads a ZeRO configuration (DeepSpeed's own rules first)."""
    z = ("zero_optimization",)
    if v.opt_dev == "cpu" and v.stage == 0:
        return (*z, "offload_optimizer"), "optimizer offload needs ZeRO stage 1, 2 or 3 (stage is 0)"
    if "nvme" in (v.opt_dev, v.param_dev):
        return (*z, "offload_optimizer", "device"), (
            "NVMe offload is modelled for ZeRO stage 3 with offload_optimizer: {device: nvme}; offload_param may be "
            "nvme, cpu or none")
    if v.param_dev == "cpu" and v.opt_dev == "none" and v.stage == 3:
        return (*z, "offload_param"), ("parameter offload without optimizer offload is not modelled by sosim (add "
                                       "offload_optimizer: {device: cpu})")
    return z, (f"no system of sosim models stage {v.stage} with offload_optimizer {v.opt_dev} and offload_param "
               f"{v.param_dev}")


def _choose_system(m: _Mapper, v: ZeroView) -> tuple[str, DeepSpeedForm, str] | None:
    """The one registered system whose DeepSpeed form claims this configuration (and why)."""
    claims = [(name, s.deepspeed, why) for name, s in registry.SYSTEMS.items() if s.deepspeed is not None
              for why in [s.deepspeed.claims(v)] if why is not None]
    if not claims:
        m.error(*_unmodelled(v))
        return None
    if len(claims) > 1:
        m.error(("zero_optimization",), "systems " + " and ".join(c[0] for c in claims) + " both read this "
                "configuration (a registry error: each system's DeepSpeed form must claim its own)")
        return None
    return claims[0]


def _report_system(m: _Mapper, v: ZeroView, system: str, why: str) -> None:
    """The notes of the keys that chose the system."""
    z = ("zero_optimization",)
    super_path = (*z, "offload_optimizer", "super_offload")
    if "stage" in v.zero:
        m.mapped((*z, "stage"), "schedule.system", system, why)
    elif v.zero:
        m.defaulted((*z, "stage"), "schedule.system", system, "DeepSpeed default stage 0; " + why)
    for section, dev, sec in (("offload_optimizer", v.opt_dev, v.opt), ("offload_param", v.param_dev, v.param)):
        if "device" in sec and (dev == "none" or not (section == "offload_param" and v.stage < 3)):
            m.mapped((*z, section, "device"), "schedule.system", system)
    if "super_offload" in v.opt and v.stage == 3 and v.opt_dev == "cpu":
        m.mapped(super_path, "schedule.system", system)
    if v.param_dev == "cpu" and v.stage < 3:
        m.ignored((*z, "offload_param"), "read only at stage 3 (engine.py); no effect here")
    if v.stage < 3 and v.is_super:
        m.ignored(super_path, "read only at stage 3 (engine.py _configure_zero_optimizer); no effect here",
                  affects_step=False)


def _read_zero(m: _Mapper, out: _Decided, model: dict[str, Any]) -> None:
    """zero_optimization -> the system (the one whose DeepSpeed form claims it) and its knobs."""
    v = _zero_view(m, out, model)
    if v is None:
        return
    chosen = _choose_system(m, v)
    if chosen is None:
        return
    system, form, why = chosen
    out.schedule["system"] = system
    _report_system(m, v, system, why)
    form.read(m, v, out.schedule)
    _ignore_rest_of_zero(m, dict(v.zero), v.stage, v.dp, model, out.schedule, form.checks_max_live)


def _ignore_rest_of_zero(m: _Mapper, zero: dict[str, Any], stage: int, dp: int, model: dict[str, Any],
                         sched: dict[str, Any], checks_max_live: bool) -> None:
    z = ("zero_optimization",)
    for key in zero:
        path = (*z, key)
        if path in m.handled or key in ("offload_optimizer", "offload_param"):
            continue
        name = ZERO_ALIASES.get(key, key)
        if name in _ZERO_IGNORED:
            reason, when = _ZERO_IGNORED[name]
            value = zero[key]
            active = value not in (False, None, 0, 1, "auto") if name == "zero_hpz_partition_size" else \
                value not in (False, None, "auto")
            affects = (when is True) or (when == "dp" and dp > 1) or (when == "stage3" and stage == 3)
            if name in ("zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
                        "zero_hpz_partition_size", "zenflow", "enable_sanity_checks", "legacy_stage1"):
                affects = affects and active
                if active and dp == 1 and when == "dp":
                    reason += "; with one data-parallel rank there is nothing to quantize or split"
            if name == "max_live_parameters" and checks_max_live:
                _check_max_live(m, path, value, model, sched)
                continue
            if value == "auto" and name == "param_persistence_threshold":
                reason = f"\"auto\": the HF Trainer sets 10 x hidden_size = {10 * int(model['hidden'])}; " + reason
            m.ignored(path, reason, affects_step=affects)
        elif key in DS_KEYS["zero_optimization"] or key in DS_KEYS_ONE_VERSION["zero_optimization"]:
            m.ignored(path, "known to DeepSpeed; no modelled effect")  # pragma: no cover - table covers all


def _check_max_live(m: _Mapper, path: KeyPath, value: Any, model: dict[str, Any], sched: dict[str, Any]) -> None:
    v = m.number(path, integer=True, lo=0) if value != "auto" else DS_DEFAULTS["max_live_parameters"]
    if v is None:
        return
    layer = tm.layer_params(ModelSpec.model_validate(model))
    working = (1 + int(sched.get("prefetch_layers", 1))) * layer
    if v < working:
        m.ignored(path, f"{int(v)} is below sosim's working set of {working} gathered parameters (the layer in use "
                  "and the prefetched one): DeepSpeed would release and re-fetch earlier; not modelled",
                  affects_step=True)
    else:
        m.ignored(path, f"a cap above sosim's working set ({working} parameters): it does not bind")


def _unknown_keys(m: _Mapper) -> None:
    """Keys DeepSpeed's pydantic sections would reject, and top-level keys sosim has no entry for."""
    data = m.loc.data
    for section, known in DS_KEYS.items():
        path = tuple(section.split("."))
        node = m.get(path)
        if section == "bf16" and node is _MISSING:
            path, node = ("bfloat16",), m.get(("bfloat16",))
        if not isinstance(node, dict):
            continue
        allowed = known | DS_KEYS_ONE_VERSION.get(section, frozenset())
        for key in node:
            if key not in allowed:
                near = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                m.error((*path, key), f"unknown key{hint}: DeepSpeed 0.19 rejects it ({section} forbids extra keys; "
                        f"{SCHEMA_SOURCE.split(': ')[0]})")
            elif (*path, key) not in m.handled and section.startswith("zero_optimization.") and key != "device":
                m.ignored((*path, key), "no effect for this system")
    for key in data:
        if key in _TOP_MAPPED:
            if (key,) not in m.handled and not any(h[:1] == (key,) for h in m.handled):
                m.ignored((key,), "no effect for this configuration")
            continue
        if key in _TOP_IGNORED:
            reason, when = _TOP_IGNORED[key]
            value = data[key]
            dp = m.dp  # collective-only keys matter only with data parallelism
            affects = (when is True or (when == "enabled" and _enabled(value)) or (when == "true" and value is True)
                       or (when == "dp" and dp > 1) or (when == "sp" and m.get(("sequence_parallel_size",)) not in
                                                         (_MISSING, 1)))
            m.ignored((key,), reason, affects_step=affects)
        else:
            m.ignored((key,), "not a DeepSpeed 0.19 top-level key in sosim's table (DeepSpeed ignores unknown "
                      "top-level keys too)")


def map_ds_config(ds: Located, model: HfModel, inputs: RunInputs, name: str = "") -> DsMapping:
    """A parsed DeepSpeed config + a model -> scenario dict and report. Raises ConfigError listing every problem."""
    if not isinstance(ds.data, dict):
        raise ConfigError([f"{ds.origin}:1: a DeepSpeed config must be a JSON object"])
    m = _Mapper(ds, inputs)
    out = _Decided()
    _read_precision(m, out)
    _read_batch(m, out)
    _read_clipping(m, out)
    _read_ckpt(m, out)
    if not m.problems:
        _read_zero(m, out, model.model)
    if not m.problems:
        _unknown_keys(m)
    if m.problems:
        raise ConfigError(list(dict.fromkeys(m.problems)))

    seq = inputs.seq_len
    model_notes = list(model.notes)
    if seq is None:
        seq = DEFAULT_SEQ_LEN
        model_notes.append(Note("defaulted", "--seq", "command line", None, "training.seq_len", seq,
                                "no --seq given: sosim's stated default (the measured runs' sequence)"))
    else:
        model_notes.append(Note("mapped", "--seq", "command line", seq, "training.seq_len", seq))
    if model.max_positions is not None and seq > model.max_positions:
        model_notes.append(Note("ignored", "max_position_embeddings", model.origin, model.max_positions,
                                reason=f"--seq {seq} is longer than the model's context window; the prediction is "
                                "for the sequence given"))
    if model.sliding_window is not None and seq > model.sliding_window:
        model_notes.append(Note("ignored", "sliding_window", model.origin, model.sliding_window,
                                reason=f"attention is modelled over all {seq} tokens; a {model.sliding_window}-token "
                                "window does less work", affects_step=True))
    training = {"seq_len": seq, **out.training}
    stem = Path(ds.origin).name.removesuffix(".json").removesuffix(".ds_config")
    scenario = {
        "name": name or f"{stem}+{model.model['name']}",
        "description": f"from DeepSpeed config {ds.origin} and model config {model.origin}",
        "hardware": inputs.hardware,
        "model": dict(model.model),
        "training": training,
        "schedule": out.schedule,
        "cluster": out.cluster,
    }
    return DsMapping(scenario=scenario, notes=m.notes, model_notes=model_notes, ds_origin=ds.origin,
                     model_origin=model.origin)


def load_ds_mapping(ds_path: str | Path, model_path: str | Path, inputs: RunInputs, name: str = "") -> DsMapping:
    """Read both files (local, no network) and map them; every problem of the DeepSpeed file at once."""
    model = load_hf_model(model_path)
    return map_ds_config(read_json(ds_path), model, inputs, name)


# --------------------------------------------------------------------------------------------------------
