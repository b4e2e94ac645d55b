"""Scenario -> DeepSpeed JSON: :func:`ds_config_from_scenario`, :func:`write_ds_config`."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sosim.formats.dsconfig.read import RunInputs, map_ds_config
from sosim.formats.hf_model import HfModel
from sosim.inputs.config import Scenario
from sosim.inputs.ds_versions import NEWEST
from sosim.inputs.errors import ConfigError
from sosim.run.loader import KeyPath, Located
from sosim.schedules import registry
from sosim.schedules.blocks.ds_schema import MISSING
from sosim.schedules.system_api import DELETE, Emitted, Unsaid


@dataclass
class EmitResult:
    """A DeepSpeed config for a scenario, and what it cannot express: ``unsaid`` (key and reason each), and the
    same as lines ``key: reason`` (``not_expressible``)."""

    config: dict[str, Any]
    unsaid: list[Unsaid]

    @property
    def not_expressible(self) -> list[str]:
        return [str(u) for u in self.unsaid]

    def report(self, path: str | None = None) -> dict[str, Any]:
        return {"path": path, "not_expressible": self.not_expressible}


def _batch_and_precision(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    """The keys every system writes: batch arithmetic, sequence parallelism, clipping, precision."""
    t, c = sc.training, sc.cluster
    out[("train_micro_batch_size_per_gpu",)] = t.micro_batch
    out[("gradient_accumulation_steps",)] = t.grad_accum
    out[("train_batch_size",)] = t.micro_batch * t.grad_accum * c.dp
    out[("gradient_clipping",)] = t.gradient_clipping
    if c.sequence_parallel > 1 or "sequence_parallel_size" in base:
        out[("sequence_parallel_size",)] = c.sequence_parallel
    bf16_key = "bfloat16" if "bfloat16" in base and "bf16" not in base else "bf16"
    on, off = (bf16_key, "fp16") if t.precision == "bf16" else ("fp16", bf16_key)
    out[(on, "enabled")] = True
    if isinstance(base.get(off), dict):
        out[(off, "enabled")] = False
    # Deprecated spellings in the base would contradict the scenario: removed; the system writes the new ones.
    for key in ("cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "prefetch_bucket_size",
                "stage3_prefetch_bucket_size"):
        out[("zero_optimization", key)] = DELETE


def _outside_notes(sc: Scenario, out: Emitted) -> None:
    """What the run needs besides the config: the model code, the launcher, the machine."""
    t, c = sc.training, sc.cluster
    version = sc.schedule.deepspeed_version
    if version != NEWEST:
        out.note("schedule.deepspeed_version", f"{version}: a DeepSpeed config does not say which release runs it; "
                 f"install DeepSpeed {version} (sosim run --ds-config ... --ds-version {version} reads it so)")
    out.note("training.activation_checkpointing",
             ("on: enable it in the model code (HF: model.gradient_checkpointing_enable() or "
              "--gradient_checkpointing)" if t.activation_checkpointing else
              "off: make sure the model code does not checkpoint")
             + "; a DeepSpeed config cannot switch it")
    if t.loss_chunk_tokens is not None:
        out.note("training.loss_chunk_tokens", f"{t.loss_chunk_tokens} (chunked loss) lives in the model code")
    if t.stack != "eager":
        out.note("training.stack", f"{t.stack} (attention implementation and padding) lives in the model code")
    if t.clip_rate > 0:
        out.note("training.clip_rate", f"{t.clip_rate:g} describes the run (how often the norm exceeds the threshold), "
                 "not a setting")
    out.note("cluster.gpus", f"launch on {c.gpus} GPU(s) (deepspeed --num_gpus {c.gpus}); train_batch_size assumes "
             f"{c.dp} data-parallel rank(s)")
    out.note("hardware", f"{sc.hardware.name} is not part of a DeepSpeed config")


def _core_settings(sc: Scenario, base: Mapping[str, Any]) -> tuple[dict[KeyPath, Any], list[Unsaid]]:
    """Key path -> value (or DELETE) for every DeepSpeed key the scenario decides, and what it cannot say.

    The system's own keys come from its DeepSpeed form (sosim/schedules/registry.py)."""
    out = Emitted()
    _batch_and_precision(sc, base, out)
    system = sc.schedule.system
    form = registry.SYSTEMS[system].deepspeed
    if form is None:
        out.note("schedule.system", f"{system} has no DeepSpeed form; the config keeps the base's ZeRO section")
    else:
        form.emit(sc, base, out)
    _outside_notes(sc, out)
    return out.settings, out.notes


def _set(config: dict[str, Any], path: KeyPath, value: Any) -> None:
    node: dict[Any, Any] = config
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            if value is DELETE:
                return
            node[key] = {}
        node = node[key]
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)


def _get(config: Mapping[str, Any], path: KeyPath) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return MISSING
        node = node[key]
    return node


def ds_config_from_scenario(sc: Scenario, base: Mapping[str, Any] | None = None) -> EmitResult:
    """A DeepSpeed 0.19 config for ``sc``; keys of ``base`` the scenario does not decide are kept.

    Where ``base`` spells a decided key differently but equivalently (``"auto"`` that resolves to the same
    value, 5e7 vs 92e6 prefetch elements that both mean one layer ahead), the base's spelling is kept: a
    key is replaced only when the scenario read from the result would change.
    """
    base_dict: dict[str, Any] = copy.deepcopy(dict(base)) if base is not None else {}
    settings, notes = _core_settings(sc, base_dict)
    config = copy.deepcopy(base_dict)
    for path, value in settings.items():
        _set(config, path, value)
    # Empty offload sections left behind by deletions are removed.
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        for key in ("offload_optimizer", "offload_param"):
            if zero.get(key) == {}:
                zero.pop(key)
        params = _get(config, ("optimizer", "params"))
        if params == {} and base_dict.get("optimizer", {}).get("params") is None:
            config["optimizer"].pop("params", None)
    if base is not None:
        config = _keep_base_spellings(sc, base_dict, config, settings)
        notes += _replaced_autos(base_dict, config, settings)
    return EmitResult(config=config, unsaid=notes)


# The HF Trainer argument that fills an "auto" key (transformers/integrations/deepspeed.py trainer_config_process):
# a number in the config must then equal the argument, or the Trainer refuses the config.
_HF_ARGUMENT: dict[KeyPath, str] = {
    ("train_micro_batch_size_per_gpu",): "--per_device_train_batch_size",
    ("gradient_accumulation_steps",): "--gradient_accumulation_steps",
    ("gradient_clipping",): "--max_grad_norm",
    ("bf16", "enabled"): "--bf16",
    ("fp16", "enabled"): "--fp16",
}


def _replaced_autos(base: dict[str, Any], config: dict[str, Any], settings: dict[KeyPath, Any]) -> list[Unsaid]:
    """Keys of the user's config that said "auto" and now hold a number: the HF Trainer argument that fills
    them must say the same (micro-batch, accumulation, ...), which is a change outside the config."""
    notes: list[Unsaid] = []
    for path in settings:
        value = _get(config, path)
        if _get(base, path) != "auto" or value is MISSING or value == "auto":
            continue
        arg = _HF_ARGUMENT.get(path)
        if arg is None:
            how = "the HF Trainer no longer fills it"
        elif isinstance(value, bool):
            how = f"{'pass' if value else 'do not pass'} {arg} to the HF Trainer"
        else:
            how = f"pass {arg} {json.dumps(value)} to the HF Trainer"
        key = ".".join(str(p) for p in path)
        notes.append(Unsaid(key, f"\"auto\" in your config is now {json.dumps(value)}; {how}"))
    return notes


def _scenario_core(ds: dict[str, Any], sc: Scenario) -> dict[str, Any] | None:
    """The scenario sections a DeepSpeed dict maps to, in the context of ``sc`` (None if it does not map)."""
    # Only what a DeepSpeed config cannot say comes from the scenario; batch and precision must come from
    # the dict itself, so that "auto" is kept only where the Trainer's default resolves to the same value.
    inputs = RunInputs(hardware=sc.hardware.name, gpus=sc.cluster.gpus, seq_len=sc.training.seq_len,
                       activation_checkpointing=sc.training.activation_checkpointing,
                       deepspeed_version=sc.schedule.deepspeed_version)
    model = HfModel(model=sc.model.model_dump(), origin="<scenario>")
    try:
        mapped = map_ds_config(Located(data=ds, origin="<emitted>"), model, inputs)
    except ConfigError:
        return None
    s = mapped.scenario
    return {"training": s["training"], "schedule": s["schedule"], "cluster": s["cluster"]}


def _keep_base_spellings(sc: Scenario, base: dict[str, Any], config: dict[str, Any],
                         settings: dict[KeyPath, Any]) -> dict[str, Any]:
    target = _scenario_core(config, sc)
    if target is None:
        return config
    for path in settings:
        base_value = _get(base, path)
        current = _get(config, path)
        if current == base_value or (base_value is MISSING and current is MISSING):
            continue
        trial = copy.deepcopy(config)
        # Absent from the base: leave it absent when DeepSpeed's default already gives the scenario's value.
        _set(trial, path, DELETE if base_value is MISSING else base_value)
        if _scenario_core(trial, sc) == target:
            config = trial
    return config


def write_ds_config(result: EmitResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.config, indent=2) + "\n")


# --------------------------------------------------------------------------------------------------------


def emitted_zero_keys(config: Mapping[str, Any]) -> set[str]:
    """Dotted names of every key under zero_optimization (for checks against :data:`DS_KEYS`)."""
    keys: set[str] = set()
    zero = config.get("zero_optimization", {})
    for key, value in zero.items():
        keys.add(f"zero_optimization.{key}")
        if isinstance(value, dict):
            keys.update(f"zero_optimization.{key}.{k}" for k in value)
    return keys
