"""Predict the measured FSDP2 CPU-offload steps (scripts/fsdp2_train_step.py's fsdp2_steps.csv) and report the
errors (sosim/answers/validate_fsdp2.py: each run's scenario from its own conditions, costs from the profile's
component tables only).

  python3 scripts/fsdp2_predict.py                      # every shipped calibration/*/fsdp2_steps.csv
  python3 scripts/fsdp2_predict.py path/fsdp2_steps.csv [--hardware h200-pcie-gen5-x86]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sosim.answers.validate_fsdp2 import check, read_runs, shipped_runs, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps_csv", type=Path, nargs="*")
    p.add_argument("--hardware", default="h200-pcie-gen5-x86")
    args = p.parse_args(argv)
    runs = [r for path in args.steps_csv for r in read_runs(path, args.hardware)] if args.steps_csv \
        else shipped_runs()
    checks = check(runs)
    print(f"{'run':52s} {'measured s':>10s} {'predicted':>10s} {'error':>8s}  exposed cpu-opt / h2d / d2h (s)")
    for c in checks:
        m = c.metrics
        print(f"{c.run.run_id:52s} {c.run.measured_s:10.3f} {c.predicted_s:10.3f} {c.error:+8.1%}  "
              f"{m['exposed_cpu_optimizer_s']:.3f} / {m['exposed_h2d_s']:.3f} / {m['exposed_d2h_s']:.3f}")
    if checks:
        mean, worst = summary(checks)
        print(f"\n{len(checks)} runs: mean |error| {mean:.1%}, worst |error| {worst:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
