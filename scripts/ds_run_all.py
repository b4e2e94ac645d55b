"""Run a list of scripts/ds_train_step.py jobs, each in its own process, inside one wall-clock budget.

Why one process per job: DeepSpeed engines (pinned host buffers, SuperOffload's worker process, NCCL
groups) do not tear down cleanly enough to measure the next configuration in the same process.
Why a deadline: a lent GPU machine gives each command a hard limit; jobs are ordered by priority and the
ones that no longer fit are skipped (and listed), never half-run.

Job syntax: SIZE:SEQ:MICRO_BATCH:CONFIG[:option=value...], e.g. 1.1b:2048:4:superoffload:clip=1.0; SIZE is a
named size or L<layers>h<hidden>a<heads>kv<kv_heads>f<ffn> (scripts/ds_train_step.py). $SOSIM_LEASE, if set, is
recorded in every row (column lease).
Options: clip, ratio, cores (cpuadam_cores_perc), subgroup (sub_group_size), steps, phased, warmup,
ckpt=0 (activation checkpointing off), param=cpu (zero3 with offload_param cpu: ZeRO-Infinity),
gpus=N (N ranks through DeepSpeed's launcher on this host),
timeout=S (this job's limit instead of --job-timeout-s),
hooks=1 (time ZeRO-3's module hooks, fetch and release per step: sosim/calibrate/z3_hooks.py),
moe=auto|hf|own (M... sizes: transformers' Qwen3MoeForCausalLM or the own MoE module),
ds=VERSION (run this job with another DeepSpeed: the wheel installed with pip --target DS_SITES/site-dsVERSION,
put first on PYTHONPATH, with its own TORCH_EXTENSIONS_DIR DS_SITES/torch_ext-dsVERSION; the row fails unless
deepspeed.__version__ is VERSION). SIZE may also be G<layers>h<hidden>a<heads>f<ffn> (GPT-2 family) or
M<layers>h<hidden>a<heads>kv<kv>e<experts>k<top_k>f<ffn> (Qwen3-MoE-shaped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


FLAGS: dict[str, str] = {
    "clip": "--clip",
    "ratio": "--ratio",
    "steps": "--steps",
    "phased": "--phased-steps",
    "warmup": "--warmup",
    "cores": "--cores-perc",
    "subgroup": "--sub-group-size",
}


def parse_job(job: str) -> tuple[list[str], dict[str, str]]:
    """(SIZE, SEQ, MICRO_BATCH, CONFIG) and the options; a malformed job is a clear ValueError."""
    size, seq, micro_batch, config, *options = job.split(":")
    parsed: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in {*FLAGS, "ckpt", "gpus", "timeout", "param", "hooks", "moe", "ds"}:
            raise ValueError(f"job {job!r}: unknown option {option!r}")
        parsed[key] = value
    return [size, seq, micro_batch, config], parsed


def job_timeout_s(job: str, default_s: float) -> float:
    return float(parse_job(job)[1].get("timeout", default_s))


def job_argv(job: str, out: Path) -> list[str]:
    (size, seq, micro_batch, config), options = parse_job(job)
    gpus = int(options.get("gpus", "1"))
    launcher: list[str] = [sys.executable]
    if gpus > 1:
        # DeepSpeed's own launcher, as users start data-parallel runs: one process per GPU, RANK/LOCAL_RANK/
        # WORLD_SIZE set, OMP_NUM_THREADS left alone (0.19.8 sets it only with --bind_cores_to_rank).
        launcher = [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            "--num_gpus",
            str(gpus),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(random.randint(29500, 29999)),
        ]
    argv = [
        *launcher,
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
    for key, value in options.items():
        if key in FLAGS:
            argv += [FLAGS[key], value]
        elif key == "ckpt" and value in ("0", "false", "off"):
            argv.append("--no-ckpt")
        elif key == "param" and value == "cpu":
            argv.append("--offload-param")
        elif key == "hooks" and value in ("1", "true", "on"):
            argv.append("--hook-timers")
        elif key == "moe":
            argv += ["--moe-impl", value]
        elif key == "ds":
            argv += ["--expect-ds", value]
    return argv


def job_env(job: str, ds_sites: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ds=VERSION puts DS_SITES/site-dsVERSION first on PYTHONPATH and gives it its own
    TORCH_EXTENSIONS_DIR (a CPUAdam built against another version's sources is never reused)."""
    env = dict(os.environ if base is None else base)
    version = parse_job(job)[1].get("ds", "")
    if version:
        site = ds_sites / f"site-ds{version}"
        env["PYTHONPATH"] = os.pathsep.join([str(site), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        env["TORCH_EXTENSIONS_DIR"] = str(ds_sites / f"torch_ext-ds{version}")
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument(
        "--ds-sites", type=Path, default=Path("/tmp"), help="folder of the site-dsVERSION installs (job option ds=)"
    )
    parser.add_argument("--plan-only", action="store_true", help="print each job's command line and exit")
    parser.add_argument(
        "--skip-done",
        action="store_true",
        help="skip jobs that an earlier call into the same --out finished (OUT/done_jobs.txt): a second call on "
        "the same warm machine picks up where the first stopped",
    )
    args = parser.parse_args(argv)
    try:
        commands = {job: job_argv(job, args.out) for job in args.jobs}
    except ValueError as error:
        print(f"ds_run_all: {error}", file=sys.stderr)
        return 2
    if args.plan_only:
        for job, command in commands.items():
            env = job_env(job, args.ds_sites, {})
            prefix = " ".join(f"{k}={v}" for k, v in env.items())
            print(job, "->", (prefix + " " if prefix else "") + " ".join(command))
        return 0
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (args.out / "jobs.json").write_text(json.dumps(commands, indent=1) + "\n")
    end_s = time.monotonic() + args.deadline_s
    failed, skipped = [], []
    done_file = args.out / "done_jobs.txt"
    done = set(done_file.read_text().split()) if args.skip_done and done_file.exists() else set()
    for job in args.jobs:
        if job in done:
            print(f"[run_all] {job}: done in an earlier call, skipped", flush=True)
            continue
        left_s = end_s - time.monotonic()
        if left_s < args.min_start_s:
            skipped.append(job)
            continue
        log_path = logs / (job.replace(":", "_").replace("=", "") + ".log")
        started_s = time.monotonic()
        with log_path.open("w") as log:
            try:
                code = subprocess.run(
                    commands[job],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=min(job_timeout_s(job, args.job_timeout_s), left_s - 5),
                    check=False,
                    env=job_env(job, args.ds_sites),
                ).returncode
            except subprocess.TimeoutExpired:
                code = 124
        took_s = time.monotonic() - started_s
        tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("[ds]")]
        print(f"[run_all] {job}: exit {code} in {took_s:.0f} s", flush=True)
        for line in tail:
            print("   ", line, flush=True)
        if code == 0:
            with done_file.open("a") as handle:
                handle.write(job + "\n")
        if code != 0:
            failed.append(job)
            lines = log_path.read_text(errors="replace").splitlines()
            print("    last log lines:", *lines[-8:], sep="\n      ", flush=True)
    print(f"[run_all] failed: {failed or 'none'}; skipped for time: {skipped or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
