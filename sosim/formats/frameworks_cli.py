"""``sosim run --torchtitan job.toml`` / ``--megatron-args args.txt``: a torchtitan or Megatron-LM run as input
(sosim/formats/torchtitan.py, sosim/formats/megatron_args.py), and ``--emit-torchtitan`` /
``--emit-megatron-args`` as output. ``--model``, ``--hardware`` and ``--gpus`` are the ``--ds-config`` group's
flags (sosim/formats/dsconfig/cli.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sosim.formats.megatron_args import load_megatron, megatron_args
from sosim.formats.torchtitan import FrameworkMapping, read_torchtitan, torchtitan_toml
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("a torchtitan or Megatron-LM run (instead of a scenario file)")
    g.add_argument("--torchtitan", metavar="JOB.toml", help="a torchtitan job config with enable_cpu_offload")
    g.add_argument("--megatron-args", metavar="ARGS", help="Megatron-LM arguments: a file, or a quoted string")
    parser.add_argument("--emit-torchtitan", metavar="OUT.toml", help="write an fsdp2_offload scenario as TOML")
    parser.add_argument("--emit-megatron-args", metavar="OUT.txt",
                        help="write a megatron_offload scenario as Megatron-LM arguments")


def requested(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "torchtitan", None) or getattr(args, "megatron_args", None))


def _model(args: argparse.Namespace) -> dict[str, Any] | None:
    ref = getattr(args, "model", None)
    if ref is None:
        return None
    from sosim.formats.hf_model import load_hf_model

    return load_hf_model(ref).model


def mapping_from_args(args: argparse.Namespace) -> FrameworkMapping:
    tt, mg = getattr(args, "torchtitan", None), getattr(args, "megatron_args", None)
    if tt and mg:
        raise ConfigError(["give --torchtitan or --megatron-args, not both"])
    if getattr(args, "scenario", None) is not None or getattr(args, "ds_config", None) is not None:
        raise ConfigError(["--torchtitan / --megatron-args replace the scenario file and --ds-config"])
    hardware, gpus = getattr(args, "hardware", None) or "", getattr(args, "gpus", None)
    if tt:
        return read_torchtitan(tt, hardware, gpus, _model(args))
    return load_megatron(str(mg), hardware, gpus, _model(args))


def scenario_for_run(args: argparse.Namespace) -> tuple[Scenario, FrameworkMapping]:
    from sosim.run.loader import load_scenario

    mapping = mapping_from_args(args)
    try:
        sc = load_scenario(mapping.scenario, getattr(args, "overrides", []) or [])
    except ConfigError as exc:
        raise ConfigError([p.replace("<dict>:1", mapping.origin, 1) for p in exc.problems]) from None
    return sc, mapping


def write_framework_config(sc: Scenario, path: Path) -> list[str]:
    """The scenario in its own framework's format at ``path``; returns what that format cannot express."""
    system = sc.schedule.system
    if system == "fsdp2_offload":
        text, cannot = torchtitan_toml(sc)
    elif system == "megatron_offload":
        text, cannot = megatron_args(sc)
    else:
        raise ConfigError([f"{path}: {system} is not a torchtitan or Megatron system"])
    path.write_text(text, encoding="utf-8")
    return cannot


_EMITS = {"emit_torchtitan": "torchtitan job", "emit_megatron_args": "Megatron-LM arguments"}


def _inputs_read(args: argparse.Namespace) -> list[str]:
    from sosim.run.loader import input_files

    return input_files([getattr(args, n, None) for n in ("scenario", "torchtitan", "megatron_args", "model")])


def check_emits(args: argparse.Namespace) -> None:
    """``--emit-torchtitan`` / ``--emit-megatron-args`` refused before any work when sosim must not write there
    (sosim/formats/safe_write.py)."""
    from sosim.formats import safe_write

    for flag, what in _EMITS.items():
        out = getattr(args, flag, None)
        if out is not None:
            safe_write.prepare_output(out, f"--{flag.replace('_', '-')}", what, safe_write.FRAMEWORK_CONFIG,
                                      force=getattr(args, "force", False), inputs=_inputs_read(args))


def finish_run(args: argparse.Namespace, sc: Scenario, mapping: FrameworkMapping | None) -> dict[str, Any]:
    from sosim.formats import safe_write

    extra: dict[str, Any] = {}
    as_json = getattr(args, "format", "table") == "json"
    if mapping is not None:
        what = "torchtitan job" if getattr(args, "torchtitan", None) else "Megatron-LM arguments"
        if as_json:
            extra["framework_mapping"] = {"origin": mapping.origin, "notes": mapping.notes}
        else:
            print(mapping.format(what), file=sys.stderr)
    for flag, system in (("emit_torchtitan", "fsdp2_offload"), ("emit_megatron_args", "megatron_offload")):
        out = getattr(args, flag, None)
        if not out:
            continue
        if sc.schedule.system != system:
            raise ConfigError([f"--{flag.replace('_', '-')}: the scenario's system is {sc.schedule.system}, "
                               f"not {system}"])
        cannot: list[str] = []

        def write(p: Path, into: list[str] = cannot) -> None:
            into.extend(write_framework_config(sc, p))

        safe_write.write_atomic(Path(out), f"--{flag.replace('_', '-')}", _EMITS[flag], write,
                                safe_write.FRAMEWORK_CONFIG, force=getattr(args, "force", False),
                                inputs=_inputs_read(args))
        if as_json:
            extra[flag] = {"path": str(out), "not_expressible": cannot}
        else:
            print("\n".join([f"sosim: wrote {out}; not expressible in it:", *(f"  {c}" for c in cannot)]),
                  file=sys.stderr)
    return extra
