"""Benchmarks of the user-facing paths (issue 3 targets):

1. a 10,000-point sweep of a 32-layer scenario (``scenarios/sweeps/gh200_zero_offload_10k.yaml``) on the local
   process pool, written incrementally to a CSV file exactly as ``sosim sweep --out`` does (target: under 60 s
   on 2 cores); with ``--scheduler tcp://host:port`` the same sweep on a Dask cluster;
2. the Chrome trace and the timeline figure of an 80-layer scenario (target: under 2 s together).

    python scripts/bench_sweep.py [--workers N] [--chunk-size N] [--scheduler tcp://host:port]

Prints one JSON object. Timings are wall-clock and include process-pool start-up and matplotlib's first import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

from sosim import load_scenario, simulate
from sosim.answers.sweep import load_sweep, run_sweep

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "scenarios" / "sweeps" / "gh200_zero_offload_10k.yaml"
TRACE_BASE = ROOT / "scenarios" / "gh200_zero_offload_4b.yaml"


def bench_sweep(executor: Executor, chunk_size: int | None) -> dict[str, object]:
    t0 = time.perf_counter()
    spec = load_sweep(SWEEP)  # validation (one probe simulation) is part of what a user waits for
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.csv"
        summary = run_sweep(spec, out, executor=executor, chunk_size=chunk_size, progress=False)
        elapsed = time.perf_counter() - t0
        size_mb = out.stat().st_size / 1e6
    n = len(spec.points)
    return {"sweep_points": n, "sweep_s": round(elapsed, 2), "sweep_points_per_s": round(n / elapsed, 1),
            "sweep_errors": summary["errors"], "sweep_infeasible": summary["infeasible"],
            "sweep_csv_mb": round(size_mb, 2)}


def bench_trace_plot(layers: int) -> dict[str, object]:
    from sosim.formats.plot import plot_result
    from sosim.formats.trace import write_trace

    result = simulate(load_scenario(TRACE_BASE, [f"model.layers={layers}"]))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        trace = write_trace(result, Path(tmp) / "trace.json")
        t1 = time.perf_counter()
        plot_result(result, Path(tmp) / "timeline.png")
        t2 = time.perf_counter()
        trace_mb = trace.stat().st_size / 1e6
    return {"trace_layers": layers, "trace_ops": len(result.plan.ops), "trace_s": round(t1 - t0, 3),
            "trace_mb": round(trace_mb, 2), "plot_s_incl_matplotlib_import": round(t2 - t1, 3),
            "trace_plus_plot_s": round(t2 - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--scheduler", default=None, help="Dask scheduler address instead of the local pool")
    ap.add_argument("--layers", type=int, default=80, help="layers of the trace/plot scenario")
    args = ap.parse_args()
    out: dict[str, object] = {}
    out.update(bench_trace_plot(args.layers))  # first, so that it pays matplotlib's cold import
    if args.scheduler:
        from distributed import Client

        with Client(args.scheduler) as client:
            executor = client.get_executor()
            executor._max_workers = sum(client.nthreads().values())  # type: ignore[attr-defined]
            out["sweep_executor"] = f"dask {args.scheduler} ({executor._max_workers} threads)"  # type: ignore[attr-defined]
            out.update(bench_sweep(executor, args.chunk_size))
    else:
        out["sweep_executor"] = f"ProcessPoolExecutor({args.workers})"
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            out.update(bench_sweep(pool, args.chunk_size))
    out["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
