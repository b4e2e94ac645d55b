"""Simulation speed (issue 11 §4): simulations per CPU-second of the 32-layer cases, a 10,000-scenario sweep on
a process pool, and a peer's rate measured in the same run.

    python scripts/bench_sim.py [--seconds 2] [--repeats 3] [--sweep-points 10000] [--workers 2] [--tune-budget N]
                                [--calculon DIR] [--no-sweep]

Cases (32 layers, 3 iterations, each scenario validated once): ZeRO-Offload as DeepSpeed runs it
(``gh200_zero_offload_4b``, the issue's case) and as the paper describes it, SuperOffload as the paper
describes it (``gh200_superoffload_8b``) and as DeepSpeed runs it (``gh200_superoffload_deepspeed_8b``), and
the latter on a PCIe host whose link directions contend (``x86_h100_superoffload_deepspeed_4b``).
For each: ``simulate()`` with its default engine (named in the output), and ``simulate(sc, engine="simpy")``,
the reference engine: the same plan, run by SimPy, with the same metrics. Rates are per CPU-second of this process
(``time.process_time``), because the machine may be shared: wall-clock rates are given too, with the load
average. Each rate is measured ``--repeats`` times: the output gives [min, max].

The sweep: ``--sweep-points`` distinct scenarios (a grid over bucket size, micro-batch, link bandwidth and GPU
peak around the ZeRO-Offload case) through :func:`sosim.sweep.sweep` on a pool of ``--workers`` processes,
wall-clock from the first point to the last row (pool start-up included).

Peer: Calculon (calculon-ai/calculon, not on PyPI: the ``calculon`` package there is another project), one
``Llm.compile`` + ``Llm.run`` per configuration as its ``llm-optimal-execution`` search does, GPT-3 175B on
its H100 system with its example execution. Give a checkout with ``--calculon DIR`` (or $CALCULON_DIR);
without one the issue's quoted figure is printed as quoted, not measured.
"""

from __future__ import annotations

import argparse
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

from sosim import load_scenario, simulate
from sosim.config import Scenario
from sosim.contention import node_plan
from sosim.fluid import effective_contention
from sosim.machine import Machine

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


def simpy_simulate(sc: Scenario) -> object:
    """simulate() with the reference engine (SimPy) in place of the default: same plan, same metrics."""
    return simulate(sc, engine="simpy")


def bench_case(name: str, seconds: float, repeats: int, layers: int) -> dict[str, Any]:
    stem, extra = CASES[name]
    path = ROOT / "scenarios" / f"{stem}.yaml"
    overrides = [f"model.layers={layers}", "training.iterations=3", *extra]
    sc = load_scenario(path, overrides)
    result = simulate(sc)
    plan = result.plan
    machine = Machine.from_scenario(sc)
    node, contention, _ranks = node_plan(sc, machine, plan)
    path_taken = "list" if effective_contention(node, contention) is None else "event_loop"
    return {
        "case": name, "scenario": stem, "overrides": overrides, "system": sc.schedule.system,
        "implementation": str(getattr(sc.schedule, "implementation", "n/a")), "ops": len(plan.ops),
        "timeline_from": path_taken, "default_engine": result.provenance["engine"],
        "simulate": _rates(lambda: simulate(sc), seconds, repeats),
        "simpy_engine": _rates(lambda: simpy_simulate(sc), seconds, repeats),
        "load_and_simulate": _rates(lambda: simulate(load_scenario(path, overrides)), seconds, 1),
    }


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
    from sosim.sweep import sweep

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
    from sosim.tune import TuneOptions, tune

    base = load_scenario(ROOT / "scenarios" / "gh200_zero_offload_4b.yaml", [f"model.layers={layers}"])
    options = TuneOptions(gpus=8, global_batch=256, budget=budget, exhaustive_limit=10**6, jobs=workers)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    self_before = time.process_time()
    t0 = time.perf_counter()
    result = tune(base, options)
    wall = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
    return {"simulated": result.simulated, "reused": result.reused, "candidates": len(result.evaluations),
            "memory_rejected": result.memory_rejected, "workers": workers, "wall_s": round(wall, 2),
            "parent_cpu_s": round(time.process_time() - self_before, 2), "worker_cpu_s": round(worker_cpu, 2)}


def bench_calculon(directory: str | None, seconds: float, repeats: int) -> dict[str, Any]:
    if not directory or not (Path(directory) / "calculon" / "llm").is_dir():
        return {"configs_per_cpu_s": CALCULON_QUOTED_PER_S, "measured": False,
                "note": "quoted from issue 11 (no Calculon checkout given: --calculon DIR)"}
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
    args = ap.parse_args()
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "calculon": bench_calculon(args.calculon, args.seconds, args.repeats),
        "cases": [bench_case(c, args.seconds, args.repeats, args.layers) for c in args.cases],
    }
    if not args.no_sweep:
        out["sweep"] = bench_sweep(args.sweep_points, args.workers, args.layers)
    if args.tune_budget:
        out["tune"] = bench_tune(args.tune_budget, args.workers, args.layers)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
