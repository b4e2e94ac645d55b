"""Simulation speed (issue 11 §4): simulations per CPU-second of the 32-layer cases, a 10,000-scenario sweep on
a process pool, and a peer's rate measured in the same run.

    python scripts/bench_sim.py [--seconds 2] [--repeats 3] [--sweep-points 10000] [--workers 2] [--tune-budget N]
                                [--calculon DIR] [--no-sweep] [--no-trace] [--write docs/performance.md]

Cases (32 layers, 3 iterations, each scenario validated once): ZeRO-Offload as DeepSpeed runs it
(``gh200_zero_offload_4b``, the issue's case) and as the paper describes it, SuperOffload as the paper
describes it (``gh200_superoffload_8b``) and as DeepSpeed runs it (``gh200_superoffload_deepspeed_8b``), and
the latter on a PCIe host whose link directions contend (``x86_h100_superoffload_deepspeed_4b``).
For each: ``simulate()`` with its default engine (named in the output), and ``simulate(sc, engine="simpy")``,
the reference engine: the same plan, run by SimPy, with the same metrics. Rates are per CPU-second of this process
(``time.process_time``), because the machine may be shared: wall-clock rates are given too, with the load
average. Each rate is measured ``--repeats`` times: the output gives [min, max].

The sweep: ``--sweep-points`` distinct scenarios (a grid over bucket size, micro-batch, link bandwidth and GPU
peak around the ZeRO-Offload case) through :func:`sosim.answers.sweep.sweep` on a pool of ``--workers`` processes,
wall-clock from the first point to the last row (pool start-up included).

Peer: Calculon (calculon-ai/calculon, not on PyPI: the ``calculon`` package there is another project), one
``Llm.compile`` + ``Llm.run`` per configuration as its ``llm-optimal-execution`` search does, GPT-3 175B on
its H100 system with its example execution. Give a checkout with ``--calculon DIR`` (or $CALCULON_DIR);
without one the issue's quoted figure is printed as quoted, not measured.

``--write PAGE`` also writes the results as a markdown page (docs/performance.md): the machine, the date, and
per case the [min, max] of the paired measurements (fast path and SimPy engine measured alternately, their
ratio per pair) against the targets of issue 11, each marked met or missed. The page is generated: rerun the
command rather than editing it. The JSON on stdout is unchanged.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import sosim
from sosim import load_scenario, simulate
from sosim.engine.contention import node_plan
from sosim.engine.fast import way_taken
from sosim.hardware.machine import Machine
from sosim.inputs.config import Scenario

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "zero_offload_deepspeed": ("gh200_zero_offload_4b", []),
    "zero_offload_paper": ("gh200_zero_offload_4b", ["schedule.implementation=ideal"]),
    "superoffload_paper": ("gh200_superoffload_8b", []),
    "superoffload_deepspeed": ("gh200_superoffload_deepspeed_8b", []),
    # A PCIe host whose link directions contend (bidirectional total below the sum): the fast engine's event loop.
    "superoffload_deepspeed_pcie": ("x86_h100_superoffload_deepspeed_4b", []),
}
# Issue 11 §4: Calculon's configurations per CPU-second on this project's machine (quoted, when not measured).
CALCULON_QUOTED_PER_S = 530.0
# Issue 11 §4's targets: simulate() of the 32-layer cases per CPU-second; the 10,000-scenario sweep and the
# 10,000-simulation tune in wall seconds on 2 cores; trace + plot of an 80-layer scenario in seconds.
TARGET_PER_CPU_S = {"zero_offload_deepspeed": 1000.0, "zero_offload_paper": 1000.0, "superoffload_paper": 1000.0,
                    "superoffload_deepspeed": 1000.0}
# Issue 25 item 5: every case at least this many times Calculon's configurations per CPU-second (paired).
TARGET_VS_CALCULON = 2.0
TARGET_SWEEP_WALL_S = 10.0
TARGET_TUNE_WALL_S = 10.0
TARGET_TRACE_PLOT_S = 2.0
TRACE_LAYERS = 80


def _rate(fn: Callable[[], object], seconds: float, clock: Callable[[], float]) -> float:
    fn()  # warm caches and imports
    n, t0 = 0, clock()
    while clock() - t0 < seconds:
        fn()
        n += 1
    return n / (clock() - t0)


def _rates(fn: Callable[[], object], seconds: float, repeats: int) -> dict[str, list[float]]:
    cpu = [_rate(fn, seconds, time.process_time) for _ in range(repeats)]
    wall = [_rate(fn, seconds, time.perf_counter) for _ in range(repeats)]
    return {"per_cpu_s": [round(min(cpu), 1), round(max(cpu), 1)],
            "per_wall_s": [round(min(wall), 1), round(max(wall), 1)]}


def _paired(fast: Callable[[], object], ref: Callable[[], object], seconds: float,
            repeats: int) -> dict[str, list[float]]:
    """``fast`` and ``ref`` measured alternately (fast, ref, fast, ref, ...), so both see the same load; per pair
    the ratio fast / ref. [min, max] of each over the pairs."""
    pairs = [(_rate(fast, seconds, time.process_time), _rate(ref, seconds, time.process_time))
             for _ in range(repeats)]
    ratios = [a / b for a, b in pairs]
    return {"per_cpu_s": [round(min(a for a, _ in pairs), 1), round(max(a for a, _ in pairs), 1)],
            "ref_per_cpu_s": [round(min(b for _, b in pairs), 1), round(max(b for _, b in pairs), 1)],
            "ratio": [round(min(ratios), 2), round(max(ratios), 2)]}


def simpy_simulate(sc: Scenario) -> object:
    """simulate() with the reference engine (SimPy) in place of the default: same plan, same metrics."""
    return simulate(sc, engine="simpy")


def bench_case(name: str, seconds: float, repeats: int, layers: int,
               calculon: Callable[[], None] | None = None) -> dict[str, Any]:
    stem, extra = CASES[name]
    path = ROOT / "scenarios" / f"{stem}.yaml"
    overrides = [f"model.layers={layers}", "training.iterations=3", *extra]
    sc = load_scenario(path, overrides)
    result = simulate(sc)
    plan = result.plan
    machine = Machine.from_scenario(sc)
    node, contention, _ranks = node_plan(machine, plan)
    path_taken = way_taken(node, contention)
    out = {
        "case": name, "scenario": stem, "overrides": overrides, "system": sc.schedule.system,
        "implementation": str(getattr(sc.schedule, "implementation", "n/a")), "ops": len(plan.ops),
        "timeline_from": path_taken, "default_engine": result.provenance["engine"],
        "simulate_vs_simpy": _paired(lambda: simulate(sc), lambda: simpy_simulate(sc), seconds, repeats),
        "load_and_simulate_vs_simulate": _paired(lambda: simulate(load_scenario(path, overrides)),
                                                 lambda: simulate(sc), seconds, repeats),
    }
    if calculon is not None:
        # Issue 25 item 5: simulate() against Calculon's standard example, measured alternately in this process.
        out["simulate_vs_calculon"] = _paired(lambda: simulate(sc), calculon, seconds, repeats)
    return out


def bench_trace_plot(repeats: int) -> dict[str, Any]:
    """Wall seconds of a Perfetto trace, and of trace + timeline figure (matplotlib imported in the first run),
    of an ``TRACE_LAYERS``-layer SuperOffload scenario."""
    import tempfile

    from sosim.formats.plot import plot_result
    from sosim.formats.trace import write_trace

    sc = load_scenario(ROOT / "scenarios" / "gh200_superoffload_8b.yaml", [f"model.layers={TRACE_LAYERS}"])
    result = simulate(sc)
    trace, both = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            t0 = time.perf_counter()
            write_trace(result, Path(tmp) / f"t{i}.json")
            t1 = time.perf_counter()
            plot_result(result, Path(tmp) / f"p{i}.png")
            t2 = time.perf_counter()
            trace.append(t1 - t0)
            both.append(t2 - t0)
    return {"layers": TRACE_LAYERS, "ops": len(result.plan.ops),
            "trace_s": [round(min(trace), 3), round(max(trace), 3)],
            "trace_and_plot_s": [round(min(both), 2), round(max(both), 2)]}


def sweep_points(n: int) -> list[dict[str, Any]]:
    """``n`` distinct points around the ZeRO-Offload case (DeepSpeed defaults; every point valid)."""
    grid = {
        "schedule.bucket_mb": [100 * (i + 1) for i in range(10)],
        "training.micro_batch": list(range(1, 11)),
        "hardware.link.h2d_GBps": [50 + 40 * i for i in range(10)],
        "hardware.gpu.peak_bf16_tflops": [500 + 50 * i for i in range(10)],
    }
    keys = list(grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*grid.values())]
    return points[:n]


def bench_sweep(n_points: int, workers: int, layers: int) -> dict[str, Any]:
    from sosim.answers.sweep import sweep

    base = load_scenario(ROOT / "scenarios" / "gh200_zero_offload_4b.yaml",
                         [f"model.layers={layers}", "training.iterations=3"])
    points = sweep_points(n_points)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        frame = sweep(base, points, executor=pool)
    wall = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
    errors = int(frame["error"].notna().sum()) if "error" in frame else 0
    return {"points": len(points), "workers": workers, "wall_s": round(wall, 2),
            "points_per_wall_s": round(len(points) / wall, 1), "worker_cpu_s": round(worker_cpu, 2),
            "points_per_worker_cpu_s": round(len(points) / worker_cpu, 1) if worker_cpu > 0 else None,
            "errors": errors}


def bench_tune(budget: int, workers: int, layers: int) -> dict[str, Any]:
    """``sosim tune`` of the ZeRO-Offload case on 8 GPUs at a global batch of 256, every system, searched
    exhaustively (not staged) up to ``budget`` simulations: a search that really simulates that many."""
    from sosim.answers.tune import TuneOptions, tune

    base = load_scenario(ROOT / "scenarios" / "gh200_zero_offload_4b.yaml", [f"model.layers={layers}"])
    options = TuneOptions(gpus=8, global_batch=256, budget=budget, exhaustive_limit=10**6, jobs=workers)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    self_before = time.process_time()
    t0 = time.perf_counter()
    result = tune(base, options)
    wall = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
    return {"budget": budget, "simulated": result.simulated, "reused": result.reused,
            "candidates": len(result.evaluations),
            "memory_rejected": result.memory_rejected, "workers": workers, "wall_s": round(wall, 2),
            "parent_cpu_s": round(time.process_time() - self_before, 2), "worker_cpu_s": round(worker_cpu, 2)}


def calculon_config(directory: str | None) -> Callable[[], None] | None:
    """One Calculon configuration (``Llm.compile`` + ``Llm.run``, as its ``llm-optimal-execution`` search runs
    each), GPT-3 175B on its H100 system with its example execution; None without a checkout."""
    if not directory or not (Path(directory) / "calculon" / "llm").is_dir():
        return None
    import logging

    sys.path.insert(0, directory)
    import calculon  # type: ignore[import-not-found]
    from calculon.llm import Llm  # type: ignore[import-not-found]
    from calculon.system import System  # type: ignore[import-not-found]

    root = Path(directory)
    app = Llm.Application(calculon.io.read_json_file(str(root / "models" / "gpt3-175B.json")))
    exe_json = calculon.io.read_json_file(str(root / "examples" / "3072_t4_p64_d12_mbs4_full.json"))
    system = System(calculon.io.read_json_file(str(root / "systems" / "h100_80g_nvl8.json")))
    log = logging.getLogger("calculon")

    def one() -> None:
        model = Llm(app, log)
        model.compile(system, Llm.Execution.from_json(exe_json))
        model.run(system)

    return one


def bench_calculon(one: Callable[[], None] | None, seconds: float, repeats: int) -> dict[str, Any]:
    if one is None:
        return {"configs_per_cpu_s": CALCULON_QUOTED_PER_S, "measured": False,
                "note": "quoted from issue 11 (no Calculon checkout given: --calculon DIR)"}
    cpu = [_rate(one, seconds, time.process_time) for _ in range(repeats)]
    return {"configs_per_cpu_s": [round(min(cpu), 1), round(max(cpu), 1)], "measured": True,
            "what": "gpt3-175B, examples/3072_t4_p64_d12_mbs4_full.json, systems/h100_80g_nvl8.json"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--sweep-points", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--tune-budget", type=int, default=0,
                    help="also time an exhaustive sosim tune of this many simulations (10000: ~40 s on 2 cores)")
    ap.add_argument("--calculon", default=os.environ.get("CALCULON_DIR"))
    ap.add_argument("--no-trace", action="store_true", help="skip the trace + plot timing")
    ap.add_argument("--write", metavar="PAGE", help="also write the results as a markdown page (docs/performance.md)")
    ap.add_argument("--render", metavar="JSON", help="measure nothing: write --write's page from this JSON, the "
                    "stdout of an earlier run")
    args = ap.parse_args()
    if args.render:
        if not args.write:
            ap.error("--render needs --write PAGE")
        Path(args.write).write_text(render_page(json.loads(Path(args.render).read_text())))
        print(f"wrote {args.write} from {args.render}", file=sys.stderr)
        return
    calculon = calculon_config(args.calculon)
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "cpu": _cpu_model(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "sosim": sosim.__version__,
        "settings": {"seconds": args.seconds, "repeats": args.repeats, "layers": args.layers},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "calculon": bench_calculon(calculon, args.seconds, args.repeats),
        "cases": [bench_case(c, args.seconds, args.repeats, args.layers, calculon) for c in args.cases],
    }
    if not args.no_sweep:
        out["sweep"] = bench_sweep(args.sweep_points, args.workers, args.layers)
    if args.tune_budget:
        out["tune"] = bench_tune(args.tune_budget, args.workers, args.layers)
    if not args.no_trace:
        out["trace"] = bench_trace_plot(args.repeats)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))
    if args.write:
        Path(args.write).write_text(render_page(out))
        print(f"wrote {args.write}", file=sys.stderr)


def _cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _span(pair: list[float], fmt: str = "{:,.0f}") -> str:
    lo, hi = (fmt.format(v) for v in pair)
    return lo if lo == hi else f"{lo}-{hi}"


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "**missed**")


def _wall_verdict(wall_s: float, cpu_s: float, workers: int, target_s: float) -> str:
    """A wall-clock target on shared cores: met, missed, or not judged when the wall time missed it but the
    work itself (worker CPU-seconds over the workers: the least wall time idle cores could take) fits."""
    if wall_s < target_s:
        return "met"
    if cpu_s / workers < target_s:
        return f"not judged: cores shared (worker CPU-s / {workers} = {cpu_s / workers:.1f} s)"
    return "**missed**"


def render_page(out: dict[str, Any]) -> str:
    """docs/performance.md from one run's results: what was measured, how, and against which target."""
    st = out["settings"]
    loads = out["load_average_before"][:1] + out["load_average_after"][:1]
    lines = [
        "# How fast sosim runs",
        "",
        "<!-- Generated by `python scripts/bench_sim.py --write docs/performance.md`; rerun it, do not edit. -->",
        "",
        f"Measured on {out['date']} (UTC) with sosim {out['sosim']} on {out['machine']} ({out['cpu']}). The cores "
        f"were shared with other jobs (1-minute load average {min(loads):.1f}-{max(loads):.1f} during the run), "
        "so rates are per CPU-second of the benchmarking process, and each comparison is made from paired "
        f"measurements: the two sides measured alternately, {st['repeats']} pairs of {st['seconds']:g} CPU-s each; "
        "a cell gives the [min-max] over the pairs. Regenerate on your machine with "
        "`python scripts/bench_sim.py --tune-budget 10000 --write docs/performance.md`.",
        "",
        f"## One simulation ({st['layers']} layers, 3 iterations)",
        "",
        "`simulate()` runs the default engine (`fast`, docs/engines.md), which gives the same result as the "
        "reference SimPy engine, run on the same plan in the same pairs. The fast engine's way (path): the list "
        "schedule where nothing can contend; the list schedule where something could but a full-speed check "
        "proves nothing does; else the event loop with the fluid model.",
        "",
        "| case | ops | path | `simulate()` per CPU-s | SimPy engine per CPU-s | ratio (pairs) | target | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in out["cases"]:
        p = c["simulate_vs_simpy"]
        target = TARGET_PER_CPU_S.get(c["case"])
        ok = None if target is None else p["per_cpu_s"][0] >= target
        lines.append(f"| {c['case']} (`{c['scenario']}`) | {c['ops']:,} | {c['timeline_from']} | "
                     f"{_span(p['per_cpu_s'])} | {_span(p['ref_per_cpu_s'])} | {_span(p['ratio'], '{:.2f}')}x | "
                     f"{'>= ' + format(target, ',.0f') if target else ''} | {_verdict(ok)} |")
    lines += ["", "A target is met when the slowest of the pairs reaches it."]
    if any("simulate_vs_calculon" in c for c in out["cases"]):
        lines += ["", "`simulate()` paired with Calculon's standard example (one configuration, "
                  "`calculon_config`; the two measured alternately in this process; issue 25's target: "
                  f">= {TARGET_VS_CALCULON:g}x in every case):", "",
                  "| case | `simulate()` per CPU-s | Calculon per CPU-s | ratio (pairs) | target | |",
                  "|---|---|---|---|---|---|"]
        for c in out["cases"]:
            p = c.get("simulate_vs_calculon")
            if p is None:
                continue
            lines.append(f"| {c['case']} | {_span(p['per_cpu_s'])} | {_span(p['ref_per_cpu_s'])} | "
                         f"{_span(p['ratio'], '{:.2f}')}x | >= {TARGET_VS_CALCULON:g}x | "
                         f"{_verdict(p['ratio'][0] >= TARGET_VS_CALCULON)} |")
    lines += ["",
              "Loading the scenario from YAML as well (`load_scenario` + `simulate`), paired with `simulate()` alone:",
              "", "| case | load + simulate per CPU-s | ratio to simulate() alone (pairs) |", "|---|---|---|"]
    for c in out["cases"]:
        p = c["load_and_simulate_vs_simulate"]
        lines.append(f"| {c['case']} | {_span(p['per_cpu_s'])} | {_span(p['ratio'], '{:.2f}')}x |")
    lines += ["", "## Many simulations", "", "| what | measured | target | |", "|---|---|---|---|"]
    if "sweep" in out:
        sw = out["sweep"]
        lines.append(f"| {sw['points']:,}-scenario sweep ({st['layers']}-layer ZeRO-Offload grid), local pool of "
                     f"{sw['workers']} | {sw['wall_s']:.1f} s wall, {sw['worker_cpu_s']:.1f} worker CPU-s, "
                     f"{sw['errors']} errors | < {TARGET_SWEEP_WALL_S:g} s | "
                     + (_wall_verdict(sw['wall_s'], sw['worker_cpu_s'], sw['workers'], TARGET_SWEEP_WALL_S)
                        if sw['points'] >= 10_000 else "") + " |")
    if "tune" in out:
        tu = out["tune"]
        lines.append(f"| `sosim tune` on 8 GPUs, global batch 256, exhaustive up to {tu['budget']:,} simulations "
                     f"({tu['candidates']:,} candidates; {tu['reused']:,} results reused from identical earlier "
                     f"simulations), pool of {tu['workers']} | {tu['wall_s']:.1f} s wall, {tu['worker_cpu_s']:.1f} "
                     f"worker + {tu['parent_cpu_s']:.1f} parent CPU-s | < {TARGET_TUNE_WALL_S:g} s | "
                     + _wall_verdict(tu['wall_s'], tu['worker_cpu_s'] + tu['parent_cpu_s'], tu['workers'],
                                     TARGET_TUNE_WALL_S) + " |")
    if "trace" in out:
        tr = out["trace"]
        lines.append(f"| Perfetto trace + timeline figure of an {tr['layers']}-layer scenario ({tr['ops']:,} ops; "
                     f"matplotlib's import in the first) | {_span(tr['trace_and_plot_s'], '{:.2f}')} s (trace alone "
                     f"{_span(tr['trace_s'], '{:.3f}')} s) | < {TARGET_TRACE_PLOT_S:g} s | "
                     f"{_verdict(tr['trace_and_plot_s'][1] < TARGET_TRACE_PLOT_S)} |")
    cal = out["calculon"]
    if cal.get("measured"):
        lines += ["", f"Peer, same run: Calculon (calculon-ai/calculon), {cal['what']}: "
                  f"{_span(cal['configs_per_cpu_s'])} configurations per CPU-s."]
    lines += ["", "Past measurements, with the commits they were taken on, are in `docs/history/performance.md`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
