"""Command line (``sosim run``): the ``--ds-config`` arguments, and the two hooks cmd_run calls."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sosim.formats.dsconfig.emit import ds_config_from_scenario, write_ds_config
from sosim.formats.dsconfig.read import DsMapping, RunInputs, load_ds_mapping
from sosim.formats.jsonio import read_json
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError
from sosim.schedules.blocks.ds_schema import DEFAULT_SEQ_LEN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("your own DeepSpeed config (instead of a scenario file)")
    g.add_argument("--ds-config", metavar="DS.json", help="a DeepSpeed config (JSON) to predict")
    g.add_argument("--model", metavar="CONFIG.json", help="Hugging Face config.json (or its folder) of the model")
    g.add_argument("--hardware", metavar="PROFILE", help="hardware profile name or path (see sosim profiles)")
    g.add_argument("--gpus", type=positive_int, help="GPUs (default: implied by train_batch_size, else 1)")
    g.add_argument("--seq", type=positive_int, help=f"training sequence length (default {DEFAULT_SEQ_LEN})")
    g.add_argument("--micro-batch", type=positive_int, help="micro-batch per GPU (needed when the config says auto)")
    g.add_argument("--grad-accum", type=positive_int, help="gradient accumulation steps")
    g.add_argument("--precision", choices=["bf16", "fp16"], help="when the config leaves it to the HF Trainer")
    g.add_argument("--activation-checkpointing", choices=["on", "off"],
                   help="whether the model code checkpoints activations (default on)")
    g.add_argument("--ds-version", metavar="X.Y.Z",
                   help="the DeepSpeed release that runs the config (default: the newest modelled; "
                        "sosim/inputs/ds_versions.py lists them)")
    parser.add_argument("--emit-ds-config", metavar="OUT.json",
                        help="write the scenario as a DeepSpeed config (with --ds-config: its other keys kept)")


def positive_int(text: str) -> int:
    """argparse type of a count flag (``sosim run`` and ``sosim tune``): a clear message, not a traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


_DS_ONLY = ("model", "hardware", "gpus", "seq", "micro_batch", "grad_accum", "precision", "activation_checkpointing")


def _inputs_from_args(args: argparse.Namespace) -> RunInputs:
    ckpt = getattr(args, "activation_checkpointing", None)
    return RunInputs(
        hardware=args.hardware, gpus=args.gpus, seq_len=args.seq, micro_batch=args.micro_batch,
        grad_accum=args.grad_accum, precision=args.precision,
        activation_checkpointing=None if ckpt is None else ckpt == "on",
        deepspeed_version=getattr(args, "ds_version", None),
        overrides=tuple(getattr(args, "overrides", []) or []),
    )


def mapping_from_args(args: argparse.Namespace) -> DsMapping:
    """``--ds-config`` + ``--model`` + ``--hardware`` (+ flags) -> mapping; usage mistakes are ConfigErrors."""
    missing = [f"--{n}" for n in ("model", "hardware") if not getattr(args, n, None)]
    if missing:
        raise ConfigError([f"--ds-config needs {' and '.join(missing)}"])
    return load_ds_mapping(args.ds_config, args.model, _inputs_from_args(args))


def scenario_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario dict (YAML-level keys, hardware by name) that ``--ds-config ...`` describes."""
    return mapping_from_args(args).scenario


def _inputs_read(args: argparse.Namespace) -> list[str]:
    from sosim.run.loader import input_files

    return input_files([getattr(args, n, None) for n in ("scenario", "ds_config", "model")])


def scenario_for_run(args: argparse.Namespace) -> tuple[Scenario, DsMapping | None]:
    """What ``sosim run`` simulates: the scenario file, or the DeepSpeed config + model; --set applies last."""
    from sosim.formats import safe_write
    from sosim.run.loader import load_scenario

    emit = getattr(args, "emit_ds_config", None)
    if emit is not None:  # before any work; never over the --ds-config being read (sosim/formats/safe_write.py)
        safe_write.prepare_output(emit, "--emit-ds-config", "DeepSpeed config", safe_write.DS_CONFIG,
                                  force=getattr(args, "force", False), inputs=_inputs_read(args), suffixes=["json"])
    ds = getattr(args, "ds_config", None)
    scenario_file = getattr(args, "scenario", None)
    if ds is None:
        used = [f"--{n.replace('_', '-')}" for n in _DS_ONLY if getattr(args, n, None) is not None]
        if used:
            raise ConfigError([f"{', '.join(used)}: only with --ds-config"])
        if scenario_file is None:
            raise ConfigError(["give a scenario file, or --ds-config DS.json --model CONFIG.json --hardware PROFILE"])
        return load_scenario(scenario_file, args.overrides), None
    if scenario_file is not None:
        raise ConfigError([f"{scenario_file}: give either a scenario file or --ds-config, not both"])
    mapping = mapping_from_args(args)
    try:
        sc = load_scenario(mapping.scenario, args.overrides)
    except ConfigError as exc:
        where = f"{mapping.ds_origin} (+ {mapping.model_origin})"
        raise ConfigError([p.replace("<dict>:1", where, 1) for p in exc.problems]) from None
    return sc, mapping


def finish_run(args: argparse.Namespace, sc: Scenario, mapping: DsMapping | None) -> dict[str, Any]:
    """After the run: the mapping report (stderr for tables) and ``--emit-ds-config``; returns JSON extras."""
    import sys

    extra: dict[str, Any] = {}
    as_json = getattr(args, "format", "table") == "json"
    if mapping is not None:
        if as_json:
            extra["ds_config_mapping"] = mapping.report()
        else:
            print(mapping.format(), file=sys.stderr)
    out = getattr(args, "emit_ds_config", None)
    if out:
        base = read_json(mapping.ds_origin).data if mapping is not None else None
        result = ds_config_from_scenario(sc, base)
        from sosim.formats import safe_write

        safe_write.write_atomic(Path(out), "--emit-ds-config", "DeepSpeed config", lambda p: write_ds_config(result, p),
                                safe_write.DS_CONFIG, force=getattr(args, "force", False), inputs=_inputs_read(args))
        if as_json:
            extra["ds_config_emitted"] = result.report(str(out))
        else:
            lines = [f"sosim: wrote DeepSpeed config {out}; not expressible in it:"]
            lines += [f"  {n}" for n in result.not_expressible]
            print("\n".join(lines), file=sys.stderr)
    return extra

