"""``sosim tune`` on the command line: the arguments (with their sanity bounds, docs/limits.md), the base
scenario from a scenario file or the user's own DeepSpeed config, the search, the report and the written config.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

from sosim.answers.tune.result import TuneOptions
from sosim.answers.tune.search import Tuner
from sosim.answers.tune.write_frameworks import write_winner
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError
from sosim.run.loader import load_scenario

EXIT_INTERRUPTED = 130  # the shell's convention for a run stopped by SIGINT

DEFAULT_OUT = "ds_config.tuned.json"


def _positive_float(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


# Sanity bounds of the search options (docs/limits.md). The largest published pretraining batches are ~16k
# sequences (60M tokens); 10M sequences leaves a wide margin while keeping the batch splits enumerable.
MAX_GLOBAL_BATCH = 10_000_000
# Simulations per search: the default is ~10k; 1e7 is a day of CPU time, past any useful search.
MAX_BUDGET = 10_000_000
MAX_JOBS_PER_CORE = 4  # as sosim sweep --workers: a simulation is CPU-bound, more processes gain nothing


def _bounded_int(limit: int, why: str) -> Callable[[str], int]:
    """argparse type: a whole number from 1 to ``limit`` (``why``: the reason for the limit, in the message)."""
    import argparse

    def parse(text: str) -> int:
        shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text):,} characters)"
        try:
            value = int(text) if len(text) <= 40 else 0
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {shown!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {shown!r}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"{value:,} is more than {limit:,} ({why}; docs/limits.md)")
        return value

    return parse


def add_tune_parser(subparsers: Any) -> None:
    """Register ``sosim tune`` on the CLI's sub-parsers."""
    from sosim.formats.dsconfig.cli import positive_int as _positive_int
    from sosim.inputs.bounds import MAX_GPUS

    cores = os.cpu_count() or 1
    gpus_int = _bounded_int(MAX_GPUS, "ten times the largest training clusters")
    batch_int = _bounded_int(MAX_GLOBAL_BATCH, "far past any published pretraining batch")
    budget_int = _bounded_int(MAX_BUDGET, "about a day of simulations")
    jobs_int = _bounded_int(MAX_JOBS_PER_CORE * cores, f"{MAX_JOBS_PER_CORE} per core, {cores} cores here: a "
                                                       "simulation is CPU-bound")

    p = subparsers.add_parser(
        "tune", help="search the fastest configuration that fits; write it as a DeepSpeed config",
        description="Search system, knobs, checkpointing, micro-batch x accumulation at a fixed global batch and "
                    "the parallel split; rank what fits in memory; write the winner as a DeepSpeed config.")
    p.add_argument("scenario", nargs="?", help="scenario YAML file (or use --ds-config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario (or hardware.*) value before tuning; repeatable")
    g = p.add_argument_group("your own DeepSpeed config (instead of a scenario file)")
    g.add_argument("--ds-config", metavar="DS.json", help="a DeepSpeed config (JSON) to start from")
    g.add_argument("--model", metavar="CONFIG.json", help="Hugging Face config.json (or its folder) of the model")
    g.add_argument("--hardware", metavar="PROFILE", help="hardware profile name or path (see sosim profiles)")
    g.add_argument("--seq", type=_positive_int, help="training sequence length (default 2048)")
    g.add_argument("--micro-batch", type=_positive_int, help="micro-batch per GPU where the config says auto")
    g.add_argument("--grad-accum", type=_positive_int, help="gradient accumulation where the config says auto")
    g.add_argument("--precision", choices=["bf16", "fp16"], help="when the config leaves it to the HF Trainer")
    f = p.add_argument_group("a torchtitan or Megatron-LM run (instead of a scenario file; with --hardware)")
    f.add_argument("--torchtitan", metavar="JOB.toml", help="a torchtitan job config with enable_cpu_offload")
    f.add_argument("--megatron-args", metavar="ARGS", help="Megatron-LM arguments: a file, or a quoted string")
    s = p.add_argument_group("search")
    s.add_argument("--gpus", type=gpus_int, help="GPUs (default: the scenario's / implied by the config)")
    s.add_argument("--global-batch", type=batch_int, metavar="B",
                   help="sequences per optimizer step, kept fixed (default: the base's micro x accum x dp)")
    s.add_argument("--objective", choices=["tokens_per_s", "time_to_tokens"], default="tokens_per_s")
    s.add_argument("--token-budget", type=_positive_float, metavar="T", help="tokens to train (time_to_tokens)")
    s.add_argument("--systems", metavar="A,B", help="systems to search (default: all)")
    s.add_argument("--implementation", choices=["ideal", "deepspeed"],
                   help="implementation of the offload systems (default: the base's)")
    s.add_argument("--budget", type=budget_int, default=TuneOptions.budget, metavar="N",
                   help=f"simulations at most (default {TuneOptions.budget})")
    s.add_argument("--jobs", type=jobs_int, default=None,
                   help="worker processes for large batches (default: CPU count, at most 8)")
    s.add_argument("--max-host-ram", type=_positive_float, metavar="GIB",
                   help="host memory per GPU the run may use (a cap below the profile's usable memory)")
    s.add_argument("--max-hbm", type=_positive_float, metavar="GIB", help="HBM per GPU the run may use")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=_positive_int, default=5, metavar="K", help="configurations shown (default 5)")
    o.add_argument("--out", metavar="DS.json", default=DEFAULT_OUT,
                   help=f"where the winner's DeepSpeed config goes (default ./{DEFAULT_OUT}; a config sosim wrote "
                        "is replaced and the output says so; any other file needs --force)")
    o.add_argument("--no-write", action="store_true", help="do not write a DeepSpeed config")
    o.add_argument("--format", choices=["table", "json"], default="table")
    o.add_argument("--progress", action=argparse_bool(), default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=run_tune)


def argparse_bool() -> Any:
    import argparse

    return argparse.BooleanOptionalAction


register_cli = add_tune_parser  # the hook sosim.cli's sub-command registry calls


def _base_from_args(args: Any) -> tuple[Scenario, dict[str, Any] | None]:
    """The scenario to tune and, for --ds-config, the user's DeepSpeed config (kept keys in the output)."""
    from sosim.formats import frameworks_cli

    if frameworks_cli.requested(args):  # --torchtitan / --megatron-args (+ --hardware, --model, --gpus)
        return frameworks_cli.scenario_for_run(args)[0], None
    ds_only = {"model": args.model, "hardware": args.hardware, "seq": args.seq, "micro-batch": args.micro_batch,
               "grad-accum": args.grad_accum, "precision": args.precision}
    if args.ds_config is None:
        used = [f"--{k}" for k, v in ds_only.items() if v is not None]
        if used:
            raise ConfigError([f"{', '.join(used)}: only with --ds-config"])
        if args.scenario is None:
            raise ConfigError(["give a scenario file, or --ds-config DS.json --model CONFIG.json --hardware PROFILE"])
        return load_scenario(args.scenario, args.overrides), None
    if args.scenario is not None:
        raise ConfigError([f"{args.scenario}: give either a scenario file or --ds-config, not both"])
    from sosim.formats import dsconfig
    from sosim.formats.jsonio import read_json

    missing = [f"--{n}" for n in ("model", "hardware") if not getattr(args, n)]
    if missing:
        raise ConfigError([f"--ds-config needs {' and '.join(missing)}"])
    inputs = dsconfig.RunInputs(hardware=args.hardware, gpus=args.gpus, seq_len=args.seq,
                                micro_batch=args.micro_batch, grad_accum=args.grad_accum, precision=args.precision,
                                overrides=tuple(args.overrides))
    mapping = dsconfig.load_ds_mapping(args.ds_config, args.model, inputs)
    try:
        sc = load_scenario(mapping.scenario, args.overrides)
    except ConfigError as exc:
        where = f"{mapping.ds_origin} (+ {mapping.model_origin})"
        raise ConfigError([p.replace("<dict>:1", where, 1) for p in exc.problems]) from None
    base_ds = read_json(args.ds_config).data
    return sc, base_ds if isinstance(base_ds, dict) else None


def run_tune(args: Any) -> int:
    """``sosim tune``: 0 when a configuration was found, 1 when none fits, 130 when interrupted."""
    import time

    from sosim.answers.tune.report import format_text, to_json
    from sosim.formats.output import print_json

    force = getattr(args, "force", False)
    from sosim.run.loader import input_files

    inputs = input_files([args.scenario, args.ds_config, args.model])
    if not args.no_write:
        from sosim.formats import safe_write

        # Before the search: an unwritable path, or a file sosim must not replace (sosim/formats/safe_write.py).
        safe_write.prepare_output(args.out, "--out", "DeepSpeed config", safe_write.DS_CONFIG, force=force,
                                  inputs=inputs, suffixes=["json"])
    sc, base_ds = _base_from_args(args)
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip()) if args.systems else None
    jobs = args.jobs if args.jobs is not None else max(1, min(8, os.cpu_count() or 1))
    options = TuneOptions(
        global_batch=args.global_batch, gpus=args.gpus if args.ds_config is None else None,
        objective=args.objective, token_budget=args.token_budget, systems=systems,
        implementation=args.implementation, budget=args.budget, max_host_ram_gib=args.max_host_ram,
        max_hbm_gib=args.max_hbm, jobs=jobs, progress=args.progress)
    from sosim.answers.workers import EXIT_TERMINATED, interrupted_exit, signals_interrupt

    start = time.perf_counter()
    with signals_interrupt() as signals:  # SIGTERM stops the search (and ends its workers) as Ctrl-C does
        try:
            result = Tuner(sc, options).run()
        except KeyboardInterrupt as exc:  # before the search had anything to show
            code, what = interrupted_exit(exc)
            print(f"sosim tune: {what}; nothing was written", file=sys.stderr)
            return code
    elapsed = time.perf_counter() - start
    written = ({"path": None, "skipped": "--no-write"} if args.no_write
               else write_winner(result, args.out, base_ds, args.model, force=force, inputs=inputs))
    if args.format == "json":
        print_json({"scenario": sc.name, "hardware": sc.hardware.name, **to_json(result, args.top, written, elapsed)})
    else:
        print(format_text(result, args.top, sc.name, sc.hardware.name, written, elapsed))
    if result.interrupted:
        if signals.terminated:
            print("sosim tune: terminated (SIGTERM): the best configuration found so far is shown"
                  + (f" and written to {written['path']}" if written.get("path") else ""), file=sys.stderr)
            return EXIT_TERMINATED
        return EXIT_INTERRUPTED
    return 0 if result.ranked else 1


__all__ = ["DEFAULT_OUT", "EXIT_INTERRUPTED", "add_tune_parser", "register_cli", "run_tune"]
