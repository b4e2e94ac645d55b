"""DeepSpeed JSON -> scenario: :func:`map_ds_config` / :func:`load_ds_mapping`, with a report on every key."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sosim.formats.dsconfig.mapper import RunInputs as RunInputs
from sosim.formats.dsconfig.mapper import _Decided, _enabled, _Mapper
from sosim.formats.dsconfig.read_training import _read_batch, _read_ckpt, _read_clipping, _read_precision
from sosim.formats.hf_model import HfModel, load_hf_model
from sosim.formats.jsonio import Note, notes_by_status, read_json
from sosim.hardware import model as tm
from sosim.inputs.config import ModelSpec
from sosim.inputs.ds_versions import NEWEST
from sosim.inputs.ds_versions import check as check_version
from sosim.inputs.ds_versions import parse as parse_version
from sosim.inputs.errors import ConfigError
from sosim.run.loader import KeyPath, Located
from sosim.schedules import registry
from sosim.schedules.blocks.ds_schema import (
    _ZERO_IGNORED,
    _ZERO_TYPES,
    DEFAULT_SEQ_LEN,
    DS_DEFAULTS,
    DS_KEYS,
    DS_KEYS_ONE_VERSION,
    MISSING,
    SCHEMA_SOURCE,
    TOP_IGNORED,
    TOP_MAPPED,
    ZERO_ALIASES,
)
from sosim.schedules.blocks.ds_version import DsBehaviour, behaviour_of
from sosim.schedules.blocks.offload_ds import prefetch_layers_for as prefetch_layers_for
from sosim.schedules.system_api import DeepSpeedForm, ZeroView


@dataclass
class DsMapping:
    """A scenario dict (YAML-level keys) built from a DeepSpeed config and a model config, and the report."""

    scenario: dict[str, Any]
    notes: list[Note]
    model_notes: list[Note]
    ds_origin: str
    model_origin: str

    def version(self) -> str:
        """The DeepSpeed release the mapping assumed (--ds-version, else the newest modelled)."""
        sched = self.scenario.get("schedule")
        return str(sched.get("deepspeed_version", NEWEST)) if isinstance(sched, dict) else NEWEST

    def report(self) -> dict[str, Any]:
        """The JSON form printed under ``ds_config_mapping`` by ``sosim run --format json``."""
        return {
            "ds_config": self.ds_origin, "model_config": self.model_origin,
            "semantics": f"DeepSpeed {self.version()} (defaults, batch arithmetic, validators) with Hugging Face "
                         "Trainer rules for 'auto'",
            **notes_by_status(self.notes),
            "model": notes_by_status(self.model_notes),
            "scenario": self.scenario,
        }

    def format(self) -> str:
        """The text report (stderr of ``sosim run``)."""
        lines = [f"sosim: DeepSpeed config {self.ds_origin} -> scenario (DeepSpeed {self.version()} semantics)"]
        for status in ("mapped", "defaulted", "ignored"):
            lines += [n.line() for n in self.notes if n.status == status]
        lines.append(f"sosim: model config {self.model_origin} -> model")
        for status in ("mapped", "defaulted", "ignored"):
            lines += [n.line() for n in self.model_notes if n.status == status]
        return "\n".join(lines)


def _zero_section(m: _Mapper) -> tuple[dict[str, Any], int] | None:
    """The zero_optimization section ({} when absent or a boolean) and its stage; None after an error."""
    z = ("zero_optimization",)
    zero = m.get(z)
    if zero is MISSING or zero is None:
        return {}, 0  # the note names the system that claims stage 0 (_report_system)
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
    sec: Any = zero.get(section, MISSING)
    if sec is None:
        m.handled.add((*z, section))
        sec = MISSING
    if sec is not MISSING and not isinstance(sec, dict):
        m.error((*z, section), "expected an object like {\"device\": \"cpu\"}")
        return "none", {}
    if deprecated in zero and _deprecated_device(m, zero, section, deprecated, sec is not MISSING) == "cpu":
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
                    is_super=is_super, dp=dp, model=model, default_pin=_behaviour(m).default_pin_memory)


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
    if m.get(z) in (MISSING, None):
        m.defaulted((*z, "stage"), "schedule.system", system, "no zero_optimization: ZeRO disabled (stage 0)")
    elif "stage" in v.zero:
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


def _refuse_expert_parallel(m: _Mapper) -> None:
    """DeepSpeed 0.19's AutoEP (``expert_parallel``: runtime/config.py get_expert_parallel_config,
    module_inject/auto_ep_config.py) shards the experts over ranks and moves tokens by all-to-all: outside
    sosim's scope (docs/scenarios.md, "Mixture of experts"), so an enabled section is an error, not a guess."""
    node = m.get(("expert_parallel",))
    if not isinstance(node, dict) or not _enabled(node):
        return
    size = node.get("autoep_size", 1)
    m.error(("expert_parallel", "enabled"), f"expert parallelism (autoep_size {size!r}) is not modelled by sosim: "
            "every rank holds every expert (remove expert_parallel, or set enabled: false; docs/scenarios.md)")
    if "use_data_before_expert_parallelism" in m.loc.data:
        m.handled.add(("use_data_before_expert_parallelism",))


def _unknown_keys(m: _Mapper) -> None:
    """Keys DeepSpeed's pydantic sections would reject, and top-level keys sosim has no entry for."""
    data = m.loc.data
    for section, known in DS_KEYS.items():
        path = tuple(section.split("."))
        node = m.get(path)
        if section == "bf16" and node is MISSING:
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
        if key in TOP_MAPPED:
            if (key,) not in m.handled and not any(h[:1] == (key,) for h in m.handled):
                m.ignored((key,), "no effect for this configuration")
            continue
        if key in TOP_IGNORED:
            reason, when = TOP_IGNORED[key]
            value = data[key]
            dp = m.dp  # collective-only keys matter only with data parallelism
            affects = (when is True or (when == "enabled" and _enabled(value)) or (when == "true" and value is True)
                       or (when == "dp" and dp > 1) or (when == "sp" and m.get(("sequence_parallel_size",)) not in
                                                         (MISSING, 1)))
            m.ignored((key,), reason, affects_step=affects)
        else:
            m.ignored((key,), "not a DeepSpeed 0.19 top-level key in sosim's table (DeepSpeed ignores unknown "
                      "top-level keys too)")


def _behaviour(m: _Mapper) -> DsBehaviour:
    """What the run's DeepSpeed release does (--ds-version, checked in map_ds_config; default the newest)."""
    return behaviour_of(parse_version(m.inputs.deepspeed_version or NEWEST))


def _check_version(inputs: RunInputs) -> None:
    if inputs.deepspeed_version is not None:
        try:
            check_version(inputs.deepspeed_version)
        except ValueError as exc:
            raise ConfigError([f"--ds-version: {exc}"]) from None


def map_ds_config(ds: Located, model: HfModel, inputs: RunInputs, name: str = "") -> DsMapping:
    """A parsed DeepSpeed config + a model -> scenario dict and report. Raises ConfigError listing every problem."""
    if not isinstance(ds.data, dict):
        raise ConfigError([f"{ds.origin}:1: a DeepSpeed config must be a JSON object"])
    _check_version(inputs)
    m = _Mapper(ds, inputs)
    out = _Decided()
    _read_precision(m, out)
    _read_batch(m, out)
    _read_clipping(m, out, _behaviour(m).default_gradient_clipping)
    _read_ckpt(m, out)
    if not m.problems:
        _read_zero(m, out, model.model)
    _refuse_expert_parallel(m)
    if not m.problems and out.schedule:
        version = check_version(inputs.deepspeed_version or NEWEST)
        if inputs.deepspeed_version is not None:  # else the scenario's default, the same release
            out.schedule["deepspeed_version"] = version
        how = "command line" if inputs.deepspeed_version else "the newest modelled release"
        version_note = Note("mapped" if inputs.deepspeed_version else "defaulted", "--ds-version", how,
                                  inputs.deepspeed_version, "schedule.deepspeed_version", version,
                                  "which DeepSpeed runs the config (sosim/schedules/blocks/ds_version.py)")
        m.notes.append(version_note)
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
