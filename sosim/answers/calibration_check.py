"""``sosim calibrate --check --profile NAME``: a few short real DeepSpeed steps on this machine, predicted vs
measured with the profile ``NAME`` (the user's own validation of a calibration).

The steps run through ``scripts/ds_run_all.py`` (one process per job, a checkout is needed: the step script is
not part of the installed package) into ``DIR/NAME.calibration/check/``; the predictions use the simulator's
measured-run replay (:mod:`sosim.answers.validate_measured`: same DeepSpeed config, same shape, the harness's barriers).
The simulator part imports no torch; the DeepSpeed part runs in child processes. It sits with the answers, not in
sosim/calibrate/ (which imports nothing of sosim, so that the harness runs from a copy of its folder): sosim.cli
hands :func:`run_check` to ``sosim.calibrate.cli.main``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sosim.answers.validate_measured import predict, read_runs

DEFAULT_JOBS: tuple[str, ...] = (
    "0.5b:2048:4:zero2:steps=5:phased=2",
    "0.5b:2048:4:zero3:steps=5:phased=2",
    "0.5b:2048:4:superoffload:steps=5:phased=2",
)


def scripts_folder() -> Path | None:
    root = Path(__file__).resolve().parent.parent.parent
    folder = root / "scripts"
    return folder if (folder / "ds_run_all.py").is_file() else None


def run_jobs(jobs: list[str], out: Path, deadline_s: float) -> int:
    """Each job in its own process (scripts/ds_run_all.py); jobs an earlier check into ``out`` finished are
    skipped (--skip-done), so a second call continues the first."""
    scripts = scripts_folder()
    if scripts is None:
        print("sosim calibrate --check: scripts/ds_run_all.py not found (run from a sosim checkout)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(scripts / "ds_run_all.py"), "--out", str(out), "--deadline-s", str(deadline_s),
               "--skip-done", *jobs]
    return subprocess.run(command, check=False, env=os.environ.copy()).returncode


def format_check(check_dir: Path, profile: str, bands: int = 40) -> str:
    """Predicted vs measured for every run in ``check_dir`` with ``profile`` (plus its p10-p90 band)."""
    runs, skipped = read_runs(check_dir)
    lines = [f"sosim calibrate --check: {len(runs)} DeepSpeed runs on this machine, predicted with profile {profile}",
             f"{'run':<44} {'measured s':>10} {'predicted s':>11} {'error':>7}  p10-p90 band (in?)"]
    errors = []
    for run in runs:
        try:
            res = predict(run, profile, bands=bands)
        except Exception as error:  # one run the simulator cannot map must not hide the others
            lines.append(f"{run.run_id:<44} {run.step.median:>10.3f} not predicted: {type(error).__name__}: {error}")
            continue
        errors.append(abs(res.error))
        band = "-" if res.band is None else (f"{res.band[0]:.3f}-{res.band[2]:.3f} "
                                             f"({'in' if res.in_band else 'OUT'})")
        lines.append(f"{run.run_id:<44} {run.step.median:>10.3f} {res.predicted_s:>11.3f} {res.error:>+7.1%}  {band}")
    for skip in skipped:
        lines.append(f"{skip.run_id:<44} skipped: {skip.reason}")
    if errors:
        lines.append(f"mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%} over {len(errors)} runs")
    return "\n".join(lines)


def run_check(profile: str, folder: Path, jobs_text: str | None, quick: bool, deadline_s: float | None = None,
              bands: int = 40) -> int:
    """Run the jobs, then print predicted vs measured with ``profile`` found in ``folder``."""
    jobs = [j.strip() for j in jobs_text.split(",") if j.strip()] if jobs_text else list(DEFAULT_JOBS)
    check_dir = folder / f"{profile}.calibration" / "check"
    if not (folder / f"{profile}.yaml").is_file():
        print(f"sosim calibrate --check: no profile {folder / (profile + '.yaml')}; run sosim calibrate --profile "
              f"{profile} first", file=sys.stderr)
        return 2
    budget_s = deadline_s if deadline_s is not None else (300.0 if quick else 900.0)
    code = run_jobs(jobs, check_dir, deadline_s=budget_s)
    if not (check_dir / "deepspeed_steps.csv").is_file():
        print(f"sosim calibrate --check: no DeepSpeed run finished (ds_run_all exit {code})", file=sys.stderr)
        return 1
    previous = os.environ.get("SOSIM_PROFILES")
    os.environ["SOSIM_PROFILES"] = os.pathsep.join([str(folder), *([previous] if previous else [])])
    print(format_check(check_dir, profile, bands=bands))
    return 0 if code == 0 else 1
