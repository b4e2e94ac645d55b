"""Scenario -> DeepSpeed JSON: :func:`ds_config_from_scenario`, :func:`write_ds_config`."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sosim import model as tm
from sosim.config import Scenario
from sosim.dsconfig.read import RunInputs, map_ds_config
from sosim.dsconfig.schema import _ADAM_TYPES, _MISSING, BF16_BYTES_PER_ELEMENT
from sosim.errors import ConfigError
from sosim.hf_model import HfModel
from sosim.loader import KeyPath, Located

_DELETE = object()


@dataclass
class EmitResult:
    """A DeepSpeed config for a scenario, and what it cannot express (one line each, naming the scenario key)."""

    config: dict[str, Any]
    not_expressible: list[str]

    def report(self, path: str | None = None) -> dict[str, Any]:
        return {"path": path, "not_expressible": self.not_expressible}


def _core_settings(sc: Scenario, base: Mapping[str, Any]) -> tuple[dict[KeyPath, Any], list[str]]:
    """Key path -> value (or _DELETE) for every DeepSpeed key the scenario decides, and what it cannot say."""
    t, c = sc.training, sc.cluster
    # The knobs as YAML-level keys: the emitter reads names, whatever class each system's knobs are.
    k: dict[str, Any] = sc.schedule.model_dump()
    dp = c.dp
    notes: list[str] = []
    out: dict[KeyPath, Any] = {
        ("train_micro_batch_size_per_gpu",): t.micro_batch,
        ("gradient_accumulation_steps",): t.grad_accum,
        ("train_batch_size",): t.micro_batch * t.grad_accum * dp,
        ("gradient_clipping",): t.gradient_clipping,
    }
    if c.sequence_parallel > 1 or "sequence_parallel_size" in base:
        out[("sequence_parallel_size",)] = c.sequence_parallel
    bf16_key = "bfloat16" if "bfloat16" in base and "bf16" not in base else "bf16"
    on, off = (bf16_key, "fp16") if t.precision == "bf16" else ("fp16", bf16_key)
    out[(on, "enabled")] = True
    if isinstance(base.get(off), dict):
        out[(off, "enabled")] = False
    z = ("zero_optimization",)
    o, p = (*z, "offload_optimizer"), (*z, "offload_param")
    zero_base = base.get("zero_optimization") if isinstance(base.get("zero_optimization"), dict) else {}
    assert isinstance(zero_base, dict)
    system = k["system"]
    # Keys of the base that would contradict the scenario are removed; the new spellings are written.
    for key in ("cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory", "prefetch_bucket_size",
                "stage3_prefetch_bucket_size"):
        out[(*z, key)] = _DELETE
    if system in ("gpu_only", "zero3"):
        out[o] = _DELETE
    nvme_params = system == "zero_infinity_nvme" and k.get("offload_param", "none") != "none"
    if (system not in ("zero_infinity", "superoffload") or (system == "superoffload" and not _superoffload_flow(sc))) \
            and not nvme_params:
        out[p] = _DELETE
    if system == "zero3":
        out[(*z, "stage")] = 3
        out[(*z, "reduce_bucket_size")] = round(k["bucket_mb"] * 1e6 / BF16_BYTES_PER_ELEMENT)
        for key in ("zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients"):
            out[(*z, key)] = k[key]
    elif system == "gpu_only":
        state = k["state_bytes_per_param"]
        per_stage = {0: 16.0, 1: 4.0 + 12.0 / dp, 2: 2.0 + 14.0 / dp, 3: 16.0 / dp}
        base_stage = zero_base.get("stage")
        stages = [k for k, v in per_stage.items() if math.isclose(v, state, rel_tol=1e-9)]
        if base_stage in stages:
            stage = int(base_stage)
        elif stages:
            stage = stages[0]
        else:
            stage = 0
            notes.append(f"schedule.state_bytes_per_param: {state:g} B/param matches no ZeRO stage on {dp} "
                         "data-parallel ranks (0: 16, 1: 4+12/dp, 2: 2+14/dp, 3: 16/dp); written as stage 0")
        out[(*z, "stage")] = stage
    else:
        impl = k["implementation"]
        if impl == "ideal":
            notes.append("schedule.implementation: ideal is the paper's schedule; DeepSpeed runs its own code path "
                         "(predict it with --set schedule.implementation=deepspeed)")
        out[(*z, "stage")] = 2 if system == "zero_offload" and zero_base.get("stage") != 1 else (
            1 if system == "zero_offload" else 3)
        out[(*o, "device")] = "cpu"
        out[(*o, "pin_memory")] = k["pin_memory"]
        out[(*z, "overlap_comm")] = k["overlap_comm"]
        out[(*z, "reduce_bucket_size")] = round(k["bucket_mb"] * 1e6 / BF16_BYTES_PER_ELEMENT)
        if system != "zero_offload":
            out[(*z, "sub_group_size")] = round(k["sub_group_elements"])
        cpu_adam = k["cpu_adam"]
        cores = k["cpu_adam_core_fraction"]
        if system == "superoffload":
            out[(*o, "super_offload")] = True
            out[(*o, "ratio")] = round(1.0 - k["gpu_optimizer_fraction"], 12)
            out[(*o, "cpuadam_cores_perc")] = cores
            if _superoffload_flow(sc):
                out[(*p, "device")] = "cpu"
                out[(*p, "pin_memory")] = k["pin_memory"]
            if impl == "ideal":
                if k["cast"] == "gpu":
                    notes.append("schedule.cast: gpu (fp32 over the link, cast on the GPU) is the paper's; "
                                 "DeepSpeed casts on the CPU")
                notes.append(f"schedule.bucket_mb: {k['bucket_mb']:g} MB transfer buckets are the paper's; DeepSpeed's "
                             "SuperOffload moves gradients per sub-group (sub_group_size)")
            if not k["speculation"] and t.gradient_clipping == 0:
                notes.append("schedule.speculation: false has no DeepSpeed switch (its SuperOffload speculates "
                             "whenever gradient_clipping is 0)")
            if cpu_adam != "cpu_adam":
                notes.append(f"schedule.cpu_adam: {cpu_adam}: DeepSpeed's SuperOffload worker always runs "
                             "DeepSpeedCPUAdam")
        else:
            out[(*o, "super_offload")] = _DELETE
            out[(*o, "ratio")] = _DELETE
            out[(*o, "cpuadam_cores_perc")] = _DELETE
            if system == "zero_infinity_nvme":
                # ZeRO-Infinity's NVMe tier (sosim/schedules/zero_infinity_nvme.py); the path is the user's.
                out[(*o, "device")] = "nvme"
                out[(*o, "nvme_path")] = "/local_nvme"
                out[(*o, "pipeline_read")] = k["pipeline_read"]
                out[(*o, "pipeline_write")] = k["pipeline_write"]
                if nvme_params:
                    out[(*p, "device")] = k["offload_param"]
                    out[(*p, "pin_memory")] = k["pin_memory"]
                    if k["offload_param"] == "nvme":  # type: ignore[union-attr]
                        out[(*p, "nvme_path")] = "/local_nvme"
                    layer = tm.layer_params(sc.model)
                    out[(*z, "stage3_prefetch_bucket_size")] = int(k["prefetch_layers"] * layer)  # type: ignore[union-attr]
                out[("aio", "block_size")] = k["aio_block_size"]
                out[("aio", "queue_depth")] = k["aio_queue_depth"]
                out[("aio", "intra_op_parallelism")] = k["aio_intra_op_parallelism"]
                notes.append("nvme_path: /local_nvme is a placeholder; point it at the node's NVMe volume")
            if system == "zero_infinity":
                out[(*p, "device")] = "cpu"
                out[(*p, "pin_memory")] = k["pin_memory"]
                layer = tm.layer_params(sc.model)
                out[(*z, "stage3_prefetch_bucket_size")] = int(k["prefetch_layers"] * layer)
            if cores != 1.0:
                notes.append(f"schedule.cpu_adam_core_fraction: {cores:g}: DeepSpeedCPUAdam uses all the process's "
                             "cores outside super_offload (limit them with OMP_NUM_THREADS / taskset instead)")
            if cpu_adam == "grace_adam":
                notes.append("schedule.cpu_adam: grace_adam is not in DeepSpeed 0.19; DeepSpeed runs DeepSpeedCPUAdam")
            if system == "zero_offload" and k["dpu"]:
                notes.append("schedule.dpu: delayed parameter update has no DeepSpeed 0.19 config key")
        # The optimizer: Adam(W) on the CPU, DeepSpeed's or torch's (optimizer.params.torch_adam).
        base_opt = base.get("optimizer") if isinstance(base.get("optimizer"), dict) else None
        if base_opt is None or str(base_opt.get("type", "")).lower() not in _ADAM_TYPES:
            out[("optimizer",)] = {"type": "AdamW"}
            if base_opt is not None:
                notes.append(f"optimizer.type: {base_opt.get('type')!r} replaced by AdamW (sosim times Adam)")
        torch_adam = cpu_adam == "torch" and system != "superoffload"
        out[("optimizer", "params", "torch_adam")] = True if torch_adam else _DELETE
    if system in ("gpu_only", "zero3") and not isinstance(base.get("optimizer"), dict):
        out[("optimizer",)] = {"type": "AdamW"}
    notes.append("training.activation_checkpointing: "
                 + ("on: enable it in the model code (HF: model.gradient_checkpointing_enable() or "
                    "--gradient_checkpointing)" if t.activation_checkpointing else
                    "off: make sure the model code does not checkpoint")
                 + "; a DeepSpeed config cannot switch it")
    if t.loss_chunk_tokens is not None:
        notes.append(f"training.loss_chunk_tokens: {t.loss_chunk_tokens} (chunked loss) lives in the model code")
    if t.clip_rate > 0:
        notes.append(f"training.clip_rate: {t.clip_rate:g} describes the run (how often the norm exceeds the "
                     "threshold), not a setting")
    notes.append(f"cluster.gpus: launch on {c.gpus} GPU(s) (deepspeed --num_gpus {c.gpus}); train_batch_size "
                 f"assumes {dp} data-parallel rank(s)")
    notes.append(f"hardware: {sc.hardware.name} is not part of a DeepSpeed config")
    return out, notes


def _superoffload_flow(sc: Scenario) -> bool:
    from sosim.schedules import superoffload  # the placement rule lives with the schedule

    assert isinstance(sc.schedule, superoffload.SuperOffloadKnobs)
    return superoffload.placement(sc, sc.schedule)[0]


def _set(config: dict[str, Any], path: KeyPath, value: Any) -> None:
    node: dict[Any, Any] = config
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            if value is _DELETE:
                return
            node[key] = {}
        node = node[key]
    if value is _DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)


def _get(config: Mapping[str, Any], path: KeyPath) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
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
    return EmitResult(config=config, not_expressible=notes)


def _scenario_core(ds: dict[str, Any], sc: Scenario) -> dict[str, Any] | None:
    """The scenario sections a DeepSpeed dict maps to, in the context of ``sc`` (None if it does not map)."""
    # Only what a DeepSpeed config cannot say comes from the scenario; batch and precision must come from
    # the dict itself, so that "auto" is kept only where the Trainer's default resolves to the same value.
    inputs = RunInputs(hardware=sc.hardware.name, gpus=sc.cluster.gpus, seq_len=sc.training.seq_len,
                       activation_checkpointing=sc.training.activation_checkpointing)
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
        if current == base_value or (base_value is _MISSING and current is _MISSING):
            continue
        trial = copy.deepcopy(config)
        # Absent from the base: leave it absent when DeepSpeed's default already gives the scenario's value.
        _set(trial, path, _DELETE if base_value is _MISSING else base_value)
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
