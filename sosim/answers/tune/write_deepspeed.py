"""The tuner's answer as a DeepSpeed config, checked by reading it back.

:func:`write_ds_config` writes the winner (sosim.formats.dsconfig's emitter, the user's other keys kept), then reads
the written config back exactly as ``sosim run --ds-config`` does and compares the scenario it gives with
the winner's. Every setting that differs is one the user must make outside the DeepSpeed config (the model
code's activation checkpointing, the launcher's GPU count and core binding, the sequence length of the data,
a knob DeepSpeed has no key for): each is listed with the flag of ``sosim run --ds-config`` that states it,
so that ``run_back`` (the command printed) predicts the winner's tokens/s exactly. A difference in a key the
config could have said is a bug of a system's DeepSpeed form; the property test in tests/test_tune_write.py
checks that none occurs for the shipped scenarios and DeepSpeed inputs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError, SosimError

if TYPE_CHECKING:
    from sosim.answers.tune.result import TuneResult
    from sosim.schedules.system_api import Unsaid

# Scenario keys a DeepSpeed config never holds, and what decides them in a real run.
OUTSIDE_REASONS: dict[str, str] = {
    "training.activation_checkpointing": "the model code decides (HF: gradient_checkpointing_enable() / "
                                         "--gradient_checkpointing); a DeepSpeed config cannot switch it",
    "training.seq_len": "the data pipeline's sequence length",
    "cluster.gpus": "the launcher (deepspeed --num_gpus)",
    "cluster.bind_cores_to_rank": "a launcher flag (deepspeed --bind_cores_to_rank)",
    "training.micro_batch": "the training script (HF: --per_device_train_batch_size)",
}
# Flags of ``sosim run --ds-config`` that always accompany the written config.
_FLAGS = {"training.seq_len": "--seq", "cluster.gpus": "--gpus", "training.activation_checkpointing":
          "--activation-checkpointing"}


@dataclass(frozen=True)
class OutsideChange:
    """A setting of the winner that the written DeepSpeed config does not hold."""

    key: str  # dotted scenario key
    value: Any
    flag: str  # how ``sosim run --ds-config`` is told, e.g. "--gpus 4" or "--set training.clip_rate=0.01"
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "flag": self.flag, "reason": self.reason}


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _comparable(sc: Scenario) -> dict[str, Any]:
    flat = _flat(sc.model_dump(mode="json", exclude={"name", "description"}))
    flat["cluster.data_parallel"] = sc.cluster.dp  # None (all GPUs) and the same number spelled out agree
    return flat


def _set_text(key: str, value: Any) -> str:
    return f"--set {key}={value if isinstance(value, str) else json.dumps(value)}"


def _flag(key: str, value: Any) -> str:
    if key == "training.activation_checkpointing":
        return f"--activation-checkpointing {'on' if value else 'off'}"
    if key in _FLAGS:
        return f"{_FLAGS[key]} {value}"
    return _set_text(key, value)


def _reason(key: str, unsaid: Sequence[Unsaid]) -> str:
    if key in OUTSIDE_REASONS:
        return OUTSIDE_REASONS[key]
    said = [u.reason for u in unsaid if u.key == key]
    if said:
        return said[0]
    if key.startswith("hardware."):
        return "the machine (the profile with the tuned scenario's overrides)"
    return "not a DeepSpeed config key (it describes the run or sosim's model of it)"


def read_back(config: Mapping[str, Any], winner: Scenario, overrides: list[str], *,
              profile_by_name: bool = False) -> Scenario:
    """The scenario ``sosim run --ds-config`` predicts from ``config`` with the winner's --gpus, --seq,
    --activation-checkpointing and the model, plus ``overrides`` (--set texts). The hardware is the winner's
    own, or with ``profile_by_name`` the profile its name finds (what ``--hardware NAME`` loads)."""
    from sosim.formats.dsconfig.read import RunInputs, map_ds_config
    from sosim.formats.hf_model import HfModel
    from sosim.run.loader import Located, load_scenario

    t = winner.training
    inputs = RunInputs(hardware=winner.hardware.name, gpus=winner.cluster.gpus, seq_len=t.seq_len,
                       activation_checkpointing=t.activation_checkpointing, overrides=tuple(overrides),
                       deepspeed_version=winner.schedule.deepspeed_version)
    model = HfModel(model=winner.model.model_dump(), origin="<model>")
    mapping = map_ds_config(Located(data=json.loads(json.dumps(config)), origin="<written>"), model, inputs)
    hardware = mapping.scenario["hardware"] if profile_by_name else winner.hardware.model_dump()
    return load_scenario({**mapping.scenario, "hardware": hardware}, overrides)


def _back_by_name(config: Mapping[str, Any], winner: Scenario) -> tuple[Scenario, list[OutsideChange]]:
    """The read-back with the profile ``--hardware NAME`` loads; when no profile has that name (a scenario with
    an inline machine), the winner's own machine and a line saying the profile must be saved first."""
    try:
        return read_back(config, winner, [], profile_by_name=True), []
    except ConfigError:
        name = winner.hardware.name
        return read_back(config, winner, []), [OutsideChange(
            "hardware", name, f"--hardware <{name}.yaml>",
            f"no shipped profile is named {name!r}: save the scenario's hardware section as a profile YAML")]


def outside_changes(config: Mapping[str, Any], winner: Scenario, unsaid: Sequence[Unsaid]) -> list[OutsideChange]:
    """What the winner needs besides ``config``: the always-given flags, then every key that reads back
    differently (as --set). Raises ConfigError when the config does not read back."""
    t, c = winner.training, winner.cluster
    changes = [OutsideChange(k, v, _flag(k, v), OUTSIDE_REASONS[k]) for k, v in (
        ("cluster.gpus", c.gpus), ("training.seq_len", t.seq_len),
        ("training.activation_checkpointing", t.activation_checkpointing))]
    back_sc, machine = _back_by_name(config, winner)
    changes += machine
    back = _comparable(back_sc)
    want = _comparable(winner)
    for key in sorted(set(want) | set(back)):
        if key in _FLAGS or want.get(key) == back.get(key):
            continue
        changes.append(OutsideChange(key, want.get(key), _set_text(key, want.get(key)), _reason(key, unsaid)))
    return changes


def run_back_command(path: str, winner: Scenario, changes: list[OutsideChange], model_path: str | None = None) -> str:
    """The ``sosim run`` command that predicts the written config as the winner."""
    flags = " ".join(ch.flag for ch in changes if ch.key != "hardware")
    model = model_path or f"<config.json of {winner.model.name or 'the model'}>"
    hardware = next((ch.flag for ch in changes if ch.key == "hardware"), f"--hardware {winner.hardware.name}")
    return f"sosim run --ds-config {path} --model {model} {hardware} {flags}"


def write_ds_config(result: TuneResult, out: str | Path, base_ds: Mapping[str, Any] | None = None,
                    model_path: str | None = None, *, force: bool = False,
                    inputs: Sequence[str] = ()) -> dict[str, Any]:
    """Write the winner as a DeepSpeed config (the user's own config's other keys kept); say if a file was
    replaced, and what the run needs besides the config. Returns: path, overwrote, not_expressible,
    outside_config (a list of {key, value, flag, reason}) and run_back (the command that predicts it)."""
    from sosim.formats import dsconfig

    best = result.best
    if best is None or best.scenario is None:
        return {"path": None, "skipped": "no configuration fits"}
    emitted = dsconfig.ds_config_from_scenario(best.scenario, base_ds)
    try:
        changes = outside_changes(emitted.config, best.scenario, emitted.unsaid)
    except SosimError as exc:  # a system's DeepSpeed form writes what it cannot read: say so, write nothing
        raise ConfigError([f"--out {out}: the winner's DeepSpeed config does not read back: {exc}"]) from None
    path = Path(out)
    overwrote = path.exists()
    from sosim.formats import safe_write

    # Atomic, and never over a file sosim did not write (without --force) nor an input (safe_write.py).
    safe_write.write_atomic(path, "--out", "DeepSpeed config", lambda p: dsconfig.write_ds_config(emitted, p),
                            safe_write.DS_CONFIG, force=force, inputs=inputs)
    return {"path": str(path), "overwrote": overwrote, "not_expressible": list(emitted.not_expressible),
            "outside_config": [ch.as_dict() for ch in changes],
            "run_back": run_back_command(str(path), best.scenario, changes, model_path)}
