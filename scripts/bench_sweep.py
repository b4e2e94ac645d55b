"""Benchmarks of the user-facing paths (issue 3 targets):

1. a 10,000-point sweep of a 32-layer scenario on the local process pool (target: under 60 s on 2 cores),
   written incrementally to a CSV file exactly as ``sosim sweep --out`` does;
2. the Chrome trace and the timeline figure of an 80-layer scenario (target: under 2 s together).

    python scripts/bench_sweep.py [--points 10000] [--workers N] [--chunk-size N]

Prints one JSON object. Timings are wall-clock, including process-pool start-up and matplotlib's import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sosim import load_scenario, simulate
from sosim.sweep import SweepSpec, expand_grid, load_sweep, run_sweep

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "gh200_zero_offload_4b.yaml"


def bench_grid(n_points: int) -> dict[str, list[object]]:
    """About ``n_points`` distinct points over four knobs of a 32-layer model (10^4 for the default)."""
    side = max(1, round(n_points ** 0.25))
    return {
        "schedule.bucket_mb": [50.0 * (i + 1) for i in range(side)],
        "schedule.cpu_adam_core_fraction": [round((i + 1) / side, 4) for i in range(side)],
        "training.micro_batch": [1 + i for i in range(side)],
        "hardware.link.h2d_GBps": [50.0 + 40.0 * i for i in range(side)],
    }


def bench_sweep(n_points: int, workers: int, chunk_size: int | None) -> dict[str, object]:
    sweep_file_spec = load_sweep(ROOT / "scenarios" / "sweeps" / "gh200_zero_offload_buckets.yaml")
    points = expand_grid(bench_grid(n_points))
    spec = SweepSpec(path=None, base=sweep_file_spec.base, fixed={"model.layers": 32, "training.iterations": 3},
                     points=points, keys=list(points[0]), metric_keys=sweep_file_spec.metric_keys)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.csv"
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=workers) as pool:
            summary = run_sweep(spec, out, executor=pool, chunk_size=chunk_size, progress=False)
        elapsed = time.perf_counter() - t0
        size_mb = out.stat().st_size / 1e6
    return {"sweep_points": len(points), "sweep_workers": workers, "sweep_s": round(elapsed, 2),
            "sweep_points_per_s": round(len(points) / elapsed, 1), "sweep_errors": summary["errors"],
            "sweep_infeasible": summary["infeasible"], "sweep_csv_mb": round(size_mb, 2)}


def bench_trace_plot(layers: int) -> dict[str, object]:
    from sosim.plot import plot_result
    from sosim.trace import write_trace

    result = simulate(load_scenario(BASE, [f"model.layers={layers}"]))
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
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--layers", type=int, default=80, help="layers of the trace/plot scenario")
    args = ap.parse_args()
    out: dict[str, object] = {}
    out.update(bench_trace_plot(args.layers))  # first: it must include matplotlib's cold import
    out.update(bench_sweep(args.points, args.workers, args.chunk_size))
    out["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
