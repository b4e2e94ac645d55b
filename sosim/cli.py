"""Command line: ``sosim run|examples|profiles|maxsize|compare|sweep|ablation|validate|tune|check|calibrate``.

``main(argv) -> int`` never raises for user mistakes: they are printed to stderr, one problem per line
(``file:line: key.path: message``), with exit status 2. ``--format json`` prints exactly one JSON object on
stdout.

Adding a subcommand: write ``register_cli(subparsers)`` in its module (the parser's ``func`` is called with
the parsed arguments and returns the exit status) and list the module in ``SUBCOMMAND_MODULES``; options
every command shares (``--profiles``) are added to all of them by :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sosim.answers.stop_signals import install_stop_handlers, release_held_signals, stopped
from sosim.formats.output import (
    check_finite_result,
    format_value,
    plot_suffixes,
    print_json,
    provenance_fields,
)
from sosim.inputs.errors import ConfigError, SosimError

EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in sosim, not the input
DEBUG_ENV = "SOSIM_DEBUG"  # set to 1 to see the traceback of an internal error

# Subcommands that live beside the code they drive; each module defines register_cli(subparsers).
SUBCOMMAND_MODULES: tuple[str, ...] = ("sosim.answers.compare", "sosim.answers.sweep", "sosim.answers.ablation",
                                       "sosim.answers.validate", "sosim.answers.tune", "sosim.answers.check")

# As sosim.hardware.model.model_flops_per_step counts them: causal attention (half the score matrix), no recomputation.
MFU_DEFINITION = ("model FLOPs per step (6 x parameters x tokens + 6 x layers x hidden x seq_len x tokens: "
                  "parameters without an untied input-embedding table, which is a lookup; causal attention, "
                  "no recomputation) / step time / (GPUs x the GPU's peak dense FLOP/s in the training precision: "
                  "bf16, or fp16 on a GPU without bf16); papers "
                  "counting the full attention matrix (12 x ...) report a higher MFU at long sequences")


# -------------------------------------------------------------------------------------------- helpers


def _add_scenario_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("scenario", nargs="?" if optional else None,
                   help="scenario YAML file, or a shipped example's name (sosim examples)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario (or hardware.*) value; repeatable")
    p.add_argument("--format", choices=["table", "json"], default="table")


def _print_notes(notes: Sequence[str]) -> None:
    for note in notes:
        print(f"sosim: note: {note}", file=sys.stderr)


# --------------------------------------------------------------------------------------------- output


def _gib(x: float) -> str:
    return f"{x:,.1f}"


def usable_memory_gib(sc: Any) -> tuple[float, float]:
    """(GPU, CPU) memory the training process may use: capacity minus the profile's reserve (as check_fit)."""
    hw = sc.hardware
    return hw.gpu.hbm_gib - hw.gpu.reserved_gib, hw.cpu.mem_gib - hw.cpu.reserved_gib


def provenance_lines(sc: Any, provenance: dict[str, Any]) -> list[tuple[str, str]]:
    """What produced the numbers: system, implementation, profile, calibration (and the rest of provenance)."""
    impl = getattr(sc.schedule, "implementation", None)
    rows = [("system", str(sc.schedule.system)),
            ("implementation", str(impl) if impl is not None else "(one implementation)"),
            ("profile", f"{sc.hardware.name}: {sc.hardware.description}" if sc.hardware.description
             else sc.hardware.name)]
    cal = sc.hardware.calibration
    if cal is None:
        rows.append(("calibration", "none (analytic cost model from the profile's numbers)"))
    else:
        sha = provenance.get("calibration_sha256")
        shown_cal = ", ".join(sc.hardware.calibration_paths)
        rows.append(("calibration", shown_cal + (f" (sha256 {str(sha)[:12]})" if sha else "")))
    shown = {"system", "implementation", "profile", "calibration", "calibration_sha256"}
    rows += [(str(k), format_value(v)) for k, v in provenance.items() if k not in shown]
    return rows


def run_table(sc: Any, metrics: dict[str, Any], provenance: dict[str, Any]) -> str:
    """The ``sosim run`` table: verdict first, then what produced it, speed, memory, where the time goes."""
    from sosim.run.result import BREAKDOWN_KEYS

    lines: list[str] = [f"# {sc.name}: {metrics['params_b']:.2f}B parameters, {sc.cluster.gpus} GPU(s)"]
    if not metrics["feasible"]:
        lines += [f"INFEASIBLE: {metrics['reason']}",
                  "  (this configuration does not fit: the timings below are what it would take if it did)"]
    else:
        lines.append("feasible: fits in GPU and CPU memory")
    gpu_usable, cpu_usable = usable_memory_gib(sc)
    step = metrics["step_time_s"]
    sections: list[tuple[str, list[tuple[str, str]]]] = [
        ("provenance", provenance_lines(sc, provenance)),
        ("speed", [
            ("step time", f"{format_value(step)} s"),
            ("tokens/s", f"{metrics['tokens_per_s']:,.0f}"),
            ("samples/s", format_value(metrics["samples_per_s"])),
            ("model TFLOPS / GPU", format_value(metrics["model_tflops"])),
            ("hardware TFLOPS / GPU", format_value(metrics["hardware_tflops"]) + "  (with recomputation)"),
            ("MFU", f"{metrics['mfu']:.1%} of {sc.hardware.gpu.peak_bf16_tflops:g} TFLOPS peak "
                    f"{sc.training.precision} x {sc.cluster.gpus} GPU(s) (defined below)"),
            ("GPU busy", f"{metrics['gpu_busy_frac']:.1%} of the step"),
        ]),
        ("memory per GPU (used / usable)", [
            ("GPU", f"{_gib(metrics['gpu_mem_peak_gib'])} / {_gib(gpu_usable)} GiB"
                    + ("" if metrics["gpu_mem_peak_gib"] <= gpu_usable else "  OVER")),
            ("CPU", f"{_gib(metrics['cpu_mem_peak_gib'])} / {_gib(cpu_usable)} GiB"
                    + ("" if metrics["cpu_mem_peak_gib"] <= cpu_usable else "  OVER")),
        ]),
        ("where the step time goes (s; sums to the step time)", [
            (k, f"{format_value(metrics[k])}" + (f"  ({metrics[k] / step:.0%})" if step > 0 else ""))
            for k in BREAKDOWN_KEYS if k in metrics]),
        ("traffic", [("CPU-GPU link", f"{format_value(metrics.get('link_gb_per_step', 0.0))} GB per step")]),
    ]
    shown = {"step_time_s", "tokens_per_s", "samples_per_s", "model_tflops", "hardware_tflops", "mfu",
             "gpu_busy_frac", "gpu_mem_peak_gib", "cpu_mem_peak_gib", "params_b", "link_gb_per_step", "feasible",
             "reason", *BREAKDOWN_KEYS}
    extra = [(k, format_value(v)) for k, v in metrics.items() if k not in shown]
    if extra:
        sections.append(("other metrics", extra))
    width = max(len(k) for _, rows in sections for k, _ in rows)
    for title, rows in sections:
        lines += ["", title]
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    lines += ["", f"MFU = {MFU_DEFINITION}"]
    return "\n".join(lines)


def _metrics_table(metrics: dict[str, Any]) -> str:
    width = max(len(k) for k in metrics)
    return "\n".join(f"{k:<{width}}  {format_value(v)}" for k, v in metrics.items() if k != "reason" or v)


# -------------------------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    from sosim import simulate
    from sosim.answers.bands import band_for_run, band_json
    from sosim.formats import dsconfig, safe_write

    # Outputs are checked before any work, and never replace a file sosim did not write (without --force)
    # nor an input of this run (sosim/formats/safe_write.py).
    force, inputs = getattr(args, "force", False), _run_inputs(args)
    trace = (safe_write.prepare_output(args.trace, "--trace", "trace", safe_write.TRACE, force=force, inputs=inputs)
             if args.trace is not None else None)
    plot = (safe_write.prepare_output(args.plot, "--plot", "figure", safe_write.FIGURE, force=force, inputs=inputs,
                                      suffixes=plot_suffixes()) if args.plot is not None else None)
    from sosim.formats import frameworks_cli

    frameworks_cli.check_emits(args)  # --emit-torchtitan / --emit-megatron-args, before any work
    fw_mapping = None
    if frameworks_cli.requested(args):  # --torchtitan job.toml / --megatron-args (+ --hardware, --model)
        sc, fw_mapping = frameworks_cli.scenario_for_run(args)
        ds_mapping = None
    else:
        sc, ds_mapping = dsconfig.scenario_for_run(args)  # a scenario file, or --ds-config + --model
    if args.scenario is not None:
        from sosim.run.loader import profile_notes

        _print_notes(profile_notes(args.scenario, args.overrides, getattr(args, "profiles", [])))
    result = simulate(sc, engine=args.engine)
    check_finite_result(args.scenario or args.ds_config or (fw_mapping.origin if fw_mapping else sc.name),
                        result.metrics)
    band, no_band = band_for_run(args, sc, result)  # p10/p50/p90 from component spread (sosim.answers.bands)
    ds_extra = dsconfig.finish_run(args, sc, ds_mapping)  # mapping report, --emit-ds-config
    ds_extra |= frameworks_cli.finish_run(args, sc, fw_mapping)  # --emit-torchtitan / --emit-megatron-args
    if trace is not None:
        from sosim.formats.trace import write_trace

        # The band's markers only when there is a band (keeps write_trace's two-argument form otherwise).
        safe_write.write_atomic(trace, "--trace", "trace", lambda p: write_trace(result, p, band=band.metrics())
                                if band else write_trace(result, p), safe_write.TRACE, force=force, inputs=inputs)
    if plot is not None:
        from sosim.formats.plot import plot_result

        safe_write.write_atomic(plot, "--plot", "figure", lambda p: plot_result(result, p, band=band.metrics())
                                if band else plot_result(result, p), safe_write.FIGURE, force=force, inputs=inputs)
    if args.format == "json":
        gpu_usable, cpu_usable = usable_memory_gib(sc)
        print_json({"scenario": sc.name, "system": sc.schedule.system, **provenance_fields(sc, args.engine),
                    **result.metrics,
                    "gpu_mem_usable_gib": gpu_usable, "cpu_mem_usable_gib": cpu_usable,
                    **band_json(band, no_band), "provenance": result.provenance, **ds_extra})
    else:
        print(run_table(sc, result.metrics, result.provenance))
        print(f"\nerror band: {band.line()}" if band is not None else f"\nerror band: none ({no_band})")
    return 0


def _run_inputs(args: argparse.Namespace) -> list[str]:
    """The files ``sosim run`` reads (an output must not replace one of them)."""
    from sosim.run.loader import input_files

    return input_files([getattr(args, "scenario", None), getattr(args, "ds_config", None),
                        getattr(args, "model", None)])


def cmd_examples(args: argparse.Namespace) -> int:
    from sosim.inputs.resources import example_scenarios
    from sosim.run.loader import read_yaml

    rows = []
    for name, path in example_scenarios().items():
        try:
            data = read_yaml(path).data
            desc = str(data.get("description", "")) if isinstance(data, dict) else ""
        except SosimError as exc:
            desc = f"ERROR {exc}"
        rows.append({"name": name, "path": str(path), "description": " ".join(desc.split())})
    if args.format == "json":
        print_json({"examples": rows})
    else:
        width = max((len(r["name"]) for r in rows), default=0)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description'][:100]}")
        print("\nrun one with: sosim run NAME  (sweeps: sosim sweep sweeps/NAME)")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from sosim.costs.calibration_table import declares_published
    from sosim.run.loader import load_profile, profile_files

    rows = []
    for name, files in profile_files(getattr(args, "profiles", [])).items():
        used = files[0]
        row: dict[str, Any] = {"name": name, "path": str(used.path), "origin": used.origin,
                               "shadows": [str(f.path) for f in files[1:]]}
        try:
            prof = load_profile(used.path)
        except SosimError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        rows.append({**row, "gpu": prof.gpu.name, "cpu": prof.cpu.name,
                     "link": f"{prof.link.kind} {prof.link.h2d_GBps:g}/{prof.link.d2h_GBps:g} GB/s",
                     "calibrated": prof.calibration is not None,
                     "published": bool(prof.calibration_paths) and all(declares_published(Path(c))
                                                                        for c in prof.calibration_paths),
                     "calibration": ", ".join(prof.calibration_paths) or None,
                     "description": prof.description})
    if args.format == "json":
        print_json({"profiles": rows})
    else:
        for r in rows:
            where = "" if r["origin"] == "shipped" else f"  [{r['origin']}: {r['path']}]"
            shadow = f"  (shadows {', '.join(r['shadows'])})" if r["shadows"] else ""
            if "error" in r:
                print(f"{r['name']:<22} ERROR {r['error']}{where}")
            else:
                cal = " [published values]" if r["published"] else " [calibrated]" if r["calibrated"] else ""
                print(f"{r['name']:<22} {r['gpu']} | {r['cpu']} | {r['link']}{cal}{where}{shadow}")
    return 0


def cmd_maxsize(args: argparse.Namespace) -> int:
    from sosim import load_scenario, simulate
    from sosim.answers.maxsize import find_max_size
    from sosim.hardware.model import active_flop_params

    notes: list[str] = []
    sc = load_scenario(args.scenario, args.overrides, notes=notes)
    _print_notes(notes)
    found = find_max_size(sc, args.grow)
    result = simulate(found.scenario)
    check_finite_result(args.scenario, result.metrics)
    m = found.model
    out = {
        "scenario": sc.name, "system": sc.schedule.system, "hardware": sc.hardware.name, **provenance_fields(sc),
        "grow": args.grow,
        "max_params_b": found.params_b, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "model_name": m.name, "experts": m.experts, "active_params_b": active_flop_params(m) / 1e9,
        "next_size_fails_because": found.next_fit.reason,
        "gpu_mem_peak_gib": result.metrics["gpu_mem_peak_gib"], "cpu_mem_peak_gib": result.metrics["cpu_mem_peak_gib"],
        "tokens_per_s": result.metrics["tokens_per_s"], "model_tflops": result.metrics["model_tflops"],
    }
    if args.format == "json":
        print_json(out)
    else:
        print(_metrics_table(out))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        from sosim.calibrate.cli import main as calibrate_main
    except ImportError as exc:
        print(f"sosim calibrate: the calibration harness is not available ({exc})", file=sys.stderr)
        return EXIT_USAGE
    from sosim.answers.calibration_check import run_check  # --check predicts with the simulator

    return calibrate_main(args.rest, run_check=run_check)


# --------------------------------------------------------------------------------------------- parser


def _register_builtin(sub: Any) -> None:
    p = sub.add_parser("run", help="simulate one scenario")
    _add_scenario_args(p, optional=True)
    from sosim.formats.dsconfig import add_arguments as add_ds_arguments

    add_ds_arguments(p)
    from sosim.formats.frameworks_cli import add_arguments as add_framework_arguments

    add_framework_arguments(p)
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--plot", metavar="OUT.png", help="write a timeline + breakdown figure (.png, .svg, .pdf...)")
    from sosim.run.simulate import DEFAULT_ENGINE, ENGINES

    p.add_argument("--engine", choices=list(ENGINES), default=DEFAULT_ENGINE,
                   help="simpy: the reference SimPy engine; fast: the same timeline without SimPy "
                        f"(default {DEFAULT_ENGINE}; docs/engines.md)")
    from sosim.answers.bands import add_arguments as add_band_arguments

    add_band_arguments(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("examples", help="list the shipped example scenarios and sweeps")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_examples)

    p = sub.add_parser("profiles", help="list hardware profiles (--profiles folders, $SOSIM_PROFILES, shipped)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser("maxsize", help="largest model of a family that fits")
    _add_scenario_args(p)
    p.add_argument("--grow", choices=["layers", "width", "paper", "experts"], default="layers",
                   help="grow the layer count, the hidden size, the routed experts of an MoE model, or walk the "
                        "SuperOffload paper's GPT sizes")
    p.set_defaults(func=cmd_maxsize)

    p = sub.add_parser("calibrate", help="time kernels, copies and CPU Adam on this machine (needs torch + GPU)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_calibrate)


def _add_common_options(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--profiles", metavar="DIR", action="append", default=default,
                   help="folder of hardware profiles searched by name before $SOSIM_PROFILES and the shipped "
                        "ones; repeatable")
    p.add_argument("--force", action="store_true", default=argparse.SUPPRESS if default is argparse.SUPPRESS
                   else False, help="let an output replace an existing file that sosim did not write (never a "
                                    "link, FIFO, device or an input of the command)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sosim", description=(__doc__ or "sosim").splitlines()[0])
    _add_common_options(parser, [])
    sub = parser.add_subparsers(dest="command", required=True)
    _register_builtin(sub)
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # a real missing dependency inside the module: surface it
                raise
            continue
        module.register_cli(sub)
    for name, p in sub.choices.items():
        if name != "calibrate":
            # SUPPRESS: a sub-command without the option keeps what was given before the sub-command.
            _add_common_options(p, argparse.SUPPRESS)
    return parser


@contextlib.contextmanager
def _profile_folders(dirs: Sequence[str]) -> Iterator[None]:
    """``--profiles`` for the duration of one command: prepended to $SOSIM_PROFILES, which every loader
    call (and every local sweep worker, started inside this block) reads."""
    from sosim.run.loader import PROFILES_ENV

    if not dirs:
        yield
        return
    from sosim.inputs.safe_read import is_dir, path_problem, shown_path

    for d in dirs:
        problem = path_problem(d)
        if problem is not None:
            raise SosimError(f"--profiles {shown_path(d)}: {problem}")
        if not is_dir(d):
            raise SosimError(f"--profiles {shown_path(d)}: not a folder")
    old = os.environ.get(PROFILES_ENV)
    os.environ[PROFILES_ENV] = os.pathsep.join([*(str(Path(d).resolve()) for d in dirs), *([old] if old else [])])
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PROFILES_ENV, None)
        else:
            os.environ[PROFILES_ENV] = old


# Problems printed for one error: a file of 100,000 unknown keys printed 100,000 lines; the first ones say what
# is wrong and the count says how much.
MAX_SHOWN_PROBLEMS = 50


def report_error(exc: SosimError) -> None:
    """Problems in files are printed as they are (``file:line: key: message``); others after ``sosim:``. At most
    MAX_SHOWN_PROBLEMS lines, then how many more there are."""
    lines = exc.problems if isinstance(exc, ConfigError) else str(exc).splitlines()
    for line in lines[:MAX_SHOWN_PROBLEMS]:
        print(line if isinstance(exc, ConfigError) else f"sosim: {line}", file=sys.stderr)
    if len(lines) > MAX_SHOWN_PROBLEMS:
        print(f"sosim: ... and {len(lines) - MAX_SHOWN_PROBLEMS:,} more problem(s) (the first {MAX_SHOWN_PROBLEMS} are "
              "shown)", file=sys.stderr)


def _robust_streams() -> None:
    # A name or path with bytes that are not valid in the terminal's encoding must not crash the output.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):
                reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    previous = install_stop_handlers()  # first: a signal while the parser imports the commands (pandas...) too
    try:
        release_held_signals()
        return _main(argv)
    except KeyboardInterrupt as exc:  # a signal while the parser was being built, or outside a command
        return stopped(exc)
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    _robust_streams()
    try:
        if args_list[:1] == ["calibrate"]:
            # argparse's REMAINDER drops '--options' inside a sub-parser: hand the rest over untouched.
            return cmd_calibrate(argparse.Namespace(rest=args_list[1:]))
        parser = build_parser()
        args = parser.parse_args(args_list)
        with _profile_folders(args.profiles):
            return int(args.func(args))
    except SosimError as exc:
        report_error(exc)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        return stopped(exc)
    except BrokenPipeError:
        # The reader went away (sosim ... | head): not an error. Point stdout at devnull so the interpreter's
        # final flush does not complain either.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return _internal(exc)
        # A name the file system refuses, met by a check that does not use sosim/inputs/safe_read.py: the
        # input's fault, not sosim's.
        from sosim.inputs.safe_read import shown_path

        print(f"sosim: {shown_path(exc.filename or '')}: the name is longer than the file system allows",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug, not the input: one line, the traceback only on request
        return _internal(exc)


def _internal(exc: Exception) -> int:
    if os.environ.get(DEBUG_ENV):
        raise exc
    print(f"sosim: internal error: {type(exc).__name__}: {exc} (a bug in sosim; rerun with {DEBUG_ENV}=1 "
          "for the traceback and please report it)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
