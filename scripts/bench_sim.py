"""Simulation speed benchmark: full simulations per second on one core.

    python scripts/bench_sim.py [--seconds 5] [--scenario scenarios/...yaml]

The default workload is the issue's target: a 32-layer, 3-iteration zero_offload scenario. It times
``simulate`` alone (scenario validated once), and ``load_scenario + simulate`` (what a sweep point costs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from sosim import load_scenario, simulate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "scenarios" / "gh200_zero_offload_4b.yaml"


def _rate(fn, seconds: float) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm caches and imports
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--scenario", default=str(DEFAULT))
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    overrides = [f"model.layers={args.layers}", "training.iterations=3"]
    sc = load_scenario(args.scenario, overrides)
    result = simulate(sc)
    out = {
        "scenario": sc.name, "system": sc.schedule.system, "layers": sc.model.layers,
        "ops_per_sim": len(result.plan.ops),
        "simulate_per_s": round(_rate(lambda: simulate(sc), args.seconds), 1),
        "load_and_simulate_per_s": round(_rate(lambda: simulate(load_scenario(args.scenario, overrides)),
                                               args.seconds), 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
