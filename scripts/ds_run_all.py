"""Run a list of scripts/ds_train_step.py jobs, each in its own process, inside one wall-clock budget.

Why one process per job: DeepSpeed engines (pinned host buffers, SuperOffload's worker process, NCCL
groups) do not tear down cleanly enough to measure the next configuration in the same process.
Why a deadline: a lent GPU machine gives each command a hard limit; jobs are ordered by priority and the
ones that no longer fit are skipped (and listed), never half-run.

Job syntax: SIZE:SEQ:MICRO_BATCH:CONFIG[:clip=X][:ratio=X][:steps=N], e.g. 1.1b:2048:4:superoffload:clip=1.0
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def job_argv(job: str, out: Path) -> list[str]:
    size, seq, micro_batch, config, *options = job.split(":")
    argv = [
        sys.executable,
        str(HERE / "ds_train_step.py"),
        "--config",
        config,
        "--size",
        size,
        "--seq",
        seq,
        "--micro-batch",
        micro_batch,
        "--out",
        str(out),
    ]
    for option in options:
        key, _, value = option.partition("=")
        flag = {
            "clip": "--clip",
            "ratio": "--ratio",
            "steps": "--steps",
            "warmup": "--warmup",
            "cores": "--cores-perc",
            "subgroup": "--sub-group-size",
        }[key]
        argv += [flag, value]
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, required=True, help="wall-clock budget for all jobs")
    parser.add_argument("--job-timeout-s", type=float, default=150.0)
    parser.add_argument(
        "--min-start-s",
        type=float,
        default=45.0,
        help="do not start a job with less than this left (it would only be killed)",
    )
    parser.add_argument("jobs", nargs="+")
    args = parser.parse_args(argv)
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    end_s = time.monotonic() + args.deadline_s
    failed, skipped = [], []
    for job in args.jobs:
        left_s = end_s - time.monotonic()
        if left_s < args.min_start_s:
            skipped.append(job)
            continue
        log_path = logs / (job.replace(":", "_").replace("=", "") + ".log")
        started_s = time.monotonic()
        with log_path.open("w") as log:
            try:
                code = subprocess.run(
                    job_argv(job, args.out),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=min(args.job_timeout_s, left_s - 5),
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired:
                code = 124
        took_s = time.monotonic() - started_s
        tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("[ds]")]
        print(f"[run_all] {job}: exit {code} in {took_s:.0f} s", flush=True)
        for line in tail:
            print("   ", line, flush=True)
        if code != 0:
            failed.append(job)
            lines = log_path.read_text(errors="replace").splitlines()
            print("    last log lines:", *lines[-8:], sep="\n      ", flush=True)
    print(f"[run_all] failed: {failed or 'none'}; skipped for time: {skipped or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
