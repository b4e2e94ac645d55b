"""The DeepSpeed-version check on measured twins (issue 21): runs measured on 0.18.8 and 0.19.8 with the same
shape and config (run ids ``X`` and ``X-ds0.18.8``, scripts/ds_run_all.py), each predicted with its own release's
code path (sosim/schedules/blocks/ds_version.py; the run's deepspeed_version column), and the two ratios side by side.

    PYTHONPATH=. python scripts/ds_version_twins.py DEVICE_RESULTS_FOLDER [--profile h200-pcie-gen5-x86]

The folder holds deepspeed_steps.csv and the runs' DeepSpeed configs, as a calibration folder does
(sosim/answers/validate_measured.py read_runs). Prints one line per twin: measured 0.18.8 / 0.19.8 step ratio,
predicted ratio, and each prediction's error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sosim.answers.validate_measured import MeasuredRun, predict, profile_for, read_runs

SUFFIX = "-ds0.18.8"


def twins(runs: list[MeasuredRun]) -> list[tuple[MeasuredRun, MeasuredRun]]:
    """(0.19.8 run, 0.18.8 run) pairs with the same id but for the suffix."""
    by_id = {r.run_id: r for r in runs}
    return [(by_id[r.run_id.removesuffix(SUFFIX)], r) for r in runs
            if r.run_id.endswith(SUFFIX) and r.run_id.removesuffix(SUFFIX) in by_id]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--profile", default=None, help="hardware profile (default: by the folder's machine name)")
    args = ap.parse_args(argv)
    runs, skipped = read_runs(args.folder)
    for s in skipped:
        print(f"skipped {s.run_id}: {s.reason}", file=sys.stderr)
    pairs = twins(runs)
    if not pairs:
        print(f"{args.folder}: no 0.18.8 / 0.19.8 twins (run ids X and X{SUFFIX})", file=sys.stderr)
        return 2
    print(f"{'run':<44} {'system':<13} {'meas 18/19':>10} {'pred 18/19':>10} {'err 0.19.8':>10} {'err 0.18.8':>10}")
    for new, old in pairs:
        profile = args.profile or profile_for(new.machine) or "h200-pcie-gen5-x86"
        p_new, p_old = predict(new, profile), predict(old, profile)
        meas = old.step.median / new.step.median
        pred = p_old.predicted_s / p_new.predicted_s
        print(f"{new.run_id:<44} {new.config:<13} {meas:>10.3f} {pred:>10.3f} {p_new.error:>+10.1%} "
              f"{p_old.error:>+10.1%}  (versions {new.deepspeed_version} / {old.deepspeed_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
