"""Command line: ``sosim run|profiles|maxsize|compare|sweep|ablation|validate|calibrate``.

``main(argv) -> int`` never raises for user mistakes: they are printed to stderr, one problem per line,
with a non-zero exit status. ``--format json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from sosim.errors import SosimError
from sosim.output import format_value, print_json

EXIT_USAGE = 2


def _metrics_table(metrics: dict[str, Any]) -> str:
    width = max(len(k) for k in metrics)
    return "\n".join(f"{k:<{width}}  {format_value(v)}" for k, v in metrics.items() if k != "reason" or v)


def _add_scenario_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("scenario", nargs="?" if optional else None, help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario (or hardware.*) value; repeatable")
    p.add_argument("--format", choices=["table", "json"], default="table")


def cmd_run(args: argparse.Namespace) -> int:
    from sosim import dsconfig, simulate

    sc, ds_mapping = dsconfig.scenario_for_run(args)  # a scenario file, or --ds-config + --model
    result = simulate(sc)
    ds_extra = dsconfig.finish_run(args, sc, ds_mapping)  # mapping report, --emit-ds-config
    if args.trace:
        from sosim.trace import write_trace

        write_trace(result, args.trace)
    if args.plot:
        from sosim.plot import plot_result

        plot_result(result, args.plot)
    if args.format == "json":
        print_json({"scenario": sc.name, "system": sc.schedule.system, **result.metrics,
                     "provenance": result.provenance, **ds_extra})
    else:
        print(f"# {sc.name}: {sc.schedule.system} on {sc.hardware.name}, {result.metrics['params_b']:.2f}B params")
        print(_metrics_table(result.metrics))
        if not result.metrics["feasible"]:
            print(f"\nINFEASIBLE: {result.metrics['reason']}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from sosim.loader import available_profiles, load_profile

    rows = []
    for name, path in available_profiles().items():
        try:
            prof = load_profile(path)
        except SosimError as exc:
            rows.append({"name": name, "path": str(path), "error": str(exc)})
            continue
        rows.append({"name": name, "path": str(path), "gpu": prof.gpu.name, "cpu": prof.cpu.name,
                     "link": f"{prof.link.kind} {prof.link.h2d_GBps:g}/{prof.link.d2h_GBps:g} GB/s",
                     "calibrated": prof.calibration is not None, "description": prof.description})
    if args.format == "json":
        print_json({"profiles": rows})
    else:
        for r in rows:
            if "error" in r:
                print(f"{r['name']:<22} ERROR {r['error']}")
            else:
                cal = " [calibrated]" if r["calibrated"] else ""
                print(f"{r['name']:<22} {r['gpu']} | {r['cpu']} | {r['link']}{cal}")
    return 0


def cmd_maxsize(args: argparse.Namespace) -> int:
    from sosim import load_scenario, simulate
    from sosim.maxsize import find_max_size

    sc = load_scenario(args.scenario, args.overrides)
    found = find_max_size(sc, args.grow)
    result = simulate(found.scenario)
    m = found.model
    out = {
        "scenario": sc.name, "system": sc.schedule.system, "hardware": sc.hardware.name, "grow": args.grow,
        "max_params_b": found.params_b, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "model_name": m.name, "next_size_fails_because": found.next_fit.reason,
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
    return calibrate_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sosim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="simulate one scenario")
    _add_scenario_args(p, optional=True)
    from sosim.dsconfig import add_arguments as add_ds_arguments

    add_ds_arguments(p)
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    p.add_argument("--plot", metavar="OUT.png", help="write a timeline + breakdown figure")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("profiles", help="list hardware profiles")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser("maxsize", help="largest model of a family that fits")
    _add_scenario_args(p)
    p.add_argument("--grow", choices=["layers", "width", "paper"], default="layers",
                   help="grow the layer count, the hidden size, or walk the SuperOffload paper's GPT sizes")
    p.set_defaults(func=cmd_maxsize)

    p = sub.add_parser("calibrate", help="time kernels, copies and CPU Adam on this machine (needs torch + GPU)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_calibrate)

    for module_name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # a real missing dependency inside the module: surface it
                raise
            continue
        module.register_cli(sub)
    return parser


# Subcommands that live beside the code they drive; each module defines register_cli(subparsers).
_SUBCOMMAND_MODULES = ("sosim.compare", "sosim.sweep", "sosim.ablation", "sosim.validate")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["calibrate"]:
        # argparse's REMAINDER drops '--options' inside a sub-parser: hand the rest over untouched.
        return cmd_calibrate(argparse.Namespace(rest=args_list[1:]))
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return int(args.func(args))
    except SosimError as exc:
        for line in str(exc).splitlines():
            print(f"sosim: {line}" if not line.startswith(("/", ".")) else line, file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
