"""The tuner's answer in the winner's own framework's format, checked by reading it back.

A DeepSpeed winner goes to a DeepSpeed config (sosim/answers/tune/write_deepspeed.py). An ``fsdp2_offload`` winner is
written as a torchtitan TOML and a ``megatron_offload`` winner as Megatron-LM arguments
(sosim/formats/frameworks_cli.py), next to ``--out`` with the framework's suffix (``ds_config.tuned.json`` ->
``ds_config.tuned.toml`` / ``ds_config.tuned.megatron_args.txt``). The written file is read back as
``sosim run --torchtitan`` / ``--megatron-args`` reads it, on the winner's machine, and every setting that
differs is listed with the ``--set`` that states it, so that the printed command predicts the winner exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sosim.answers.tune.write_deepspeed import OutsideChange, _comparable, _reason, _set_text, write_ds_config
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError, SosimError
from sosim.schedules.system_api import Unsaid

if TYPE_CHECKING:
    from sosim.answers.tune.result import TuneResult

FORMATS = {"fsdp2_offload": ("torchtitan TOML", ".toml", "--torchtitan"),
           "megatron_offload": ("Megatron-LM arguments", ".megatron_args.txt", "--megatron-args")}
# Keys the read-back takes from the command line, not from the file.
_FLAG_KEYS = {"cluster.gpus": "--gpus"}


def framework_path(out: str | Path, system: str) -> Path:
    path = Path(out)
    return path.with_name(path.name.removesuffix(".json") + FORMATS[system][1])


def read_back(path: Path, winner: Scenario) -> Scenario:
    """What ``sosim run --torchtitan / --megatron-args path --hardware <winner's> --gpus N --model <winner's>``
    predicts (the model given as the winner's own shape, the machine the winner's own)."""
    from sosim.formats.megatron_args import load_megatron
    from sosim.formats.torchtitan import read_torchtitan
    from sosim.run.loader import load_scenario

    gpus, hardware = winner.cluster.gpus, winner.hardware.name
    if winner.schedule.system == "fsdp2_offload":
        # The TOML holds the shape when it is a llama3 flavor; otherwise --model gives it (the winner's own).
        model = None if 'flavor = "' in path.read_text(encoding="utf-8") else winner.model.model_dump()
        mapping = read_torchtitan(str(path), hardware, gpus, model)
    else:
        mapping = load_megatron(str(path), hardware, gpus, None)  # the arguments hold the whole shape
    return load_scenario({**mapping.scenario, "hardware": winner.hardware.model_dump()})


def outside_changes(path: Path, winner: Scenario, not_expressible: list[str]) -> list[OutsideChange]:
    changes = [OutsideChange("cluster.gpus", winner.cluster.gpus, f"--gpus {winner.cluster.gpus}",
                             "the launcher (torchrun --nproc-per-node / the job's GPU count)")]
    back, want = _comparable(read_back(path, winner)), _comparable(winner)
    for key in sorted(set(want) | set(back)):
        if key in _FLAG_KEYS or key == "model.name" or want.get(key) == back.get(key):
            continue
        unsaid = [Unsaid(*line.split(": ", 1)) for line in not_expressible if ": " in line]
        changes.append(OutsideChange(key, want.get(key), _set_text(key, want.get(key)), _reason(key, unsaid)))
    return changes


def write_winner(result: TuneResult, out: str | Path, base_ds: Mapping[str, Any] | None = None,
                 model_path: str | None = None, *, force: bool = False, inputs: Sequence[str] = ()) -> dict[str, Any]:
    """The winner in its own framework's format (a DeepSpeed config for DeepSpeed's systems); never over a file
    sosim did not write without ``force``, nor over one of ``inputs`` (sosim/formats/safe_write.py)."""
    best = result.best
    if best is None or best.scenario is None or best.scenario.schedule.system not in FORMATS:
        return {**write_ds_config(result, out, base_ds, model_path, force=force, inputs=inputs),
                "format": "DeepSpeed config"}
    from sosim.formats.frameworks_cli import write_framework_config

    sc = best.scenario
    what, _, flag = FORMATS[sc.schedule.system]
    path = framework_path(out, sc.schedule.system)
    overwrote = path.exists()
    from sosim.formats import safe_write

    cannot: list[str] = []
    safe_write.write_atomic(path, "--out", what, lambda p: cannot.extend(write_framework_config(sc, p)),
                            safe_write.FRAMEWORK_CONFIG, force=force, inputs=inputs)
    try:
        changes = outside_changes(path, sc, cannot)
    except SosimError as exc:
        raise ConfigError([f"--out {path}: the winner's {what} does not read back: {exc}"]) from None
    needs_model = sc.schedule.system == "fsdp2_offload" and any(n.startswith("model:") for n in cannot)
    model = f" --model {model_path or f'<config.json of {sc.model.name or chr(39) + chr(39)}>'}" if needs_model else ""
    flags = " ".join(ch.flag for ch in changes)
    return {"path": str(path), "overwrote": overwrote, "format": what, "not_expressible": cannot,
            "outside_config": [ch.as_dict() for ch in changes],
            "run_back": f"sosim run {flag} {path}{model} --hardware {sc.hardware.name} {flags}".strip()}
