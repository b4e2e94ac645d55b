"""Time load + simulate of 1,024-GPU scenarios on one core (the many-GPU speed target: < 2 s).

Two cases: 256 quad-GH200 Alps nodes (the Superchips of a node share no host resource, so one rank stands
for all) and 128 eight-GPU HGX H100 nodes (the eight ranks share two sockets' cores and DRAM, so all eight
are simulated and contended). Run: ``PYTHONPATH=$PWD python scripts/bench_1024_gpus.py`` (pin to one core
with ``taskset -c 0`` where available). Prints the best of ``--repeat`` runs per case.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from sosim import load_scenario, simulate

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "alps 256 nodes x 4 GH200, ZeRO-3 offload": (ROOT / "scenarios" / "alps_gh200x1024_zero3_offload_6.7b.yaml", []),
    "hgx 128 nodes x 8 H100, ZeRO-3 offload": (
        ROOT / "scenarios" / "alps_gh200x1024_zero3_offload_6.7b.yaml",
        ["hardware=hgx-h100x8-x86"],
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if hasattr(os, "sched_getaffinity"):
        print(f"cores available to this process: {len(os.sched_getaffinity(0))}")
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    for label, (path, sets) in CASES.items():
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = simulate(load_scenario(path, sets))
            best = min(best, time.perf_counter() - t0)
        ranks = r.provenance.get("gpus_per_node")
        print(f"{label}: {best:.3f} s (load + simulate, best of {args.repeat}); {len(r.plan.ops)} ops per rank, "
              f"{ranks} ranks per node, step {r.metrics['step_time_s']:.3f} s, "
              f"{r.metrics['tokens_per_s']:.0f} tokens/s")


if __name__ == "__main__":
    main()
