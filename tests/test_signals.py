"""Every process ends with its parent: SIGTERM to ``sosim tune --jobs 2`` / ``sosim sweep --workers 2`` leaves no
worker behind, exits non-zero with a message, and hints ``--resume`` only when something was written.

Each command runs as a subprocess in its own session (so its process group is known: the parent's PID); the test
waits until the workers exist (``/proc``), sends SIGTERM to the parent alone (what a job scheduler or ``kill PID``
does), then polls until no process of the group is left. Timeouts are generous and only bound a failure: no
assertion depends on how fast the machine is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sosim.answers.workers import kill_workers, start_pool, stop_pool, worker_pids

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0  # for the workers to appear: imports on a loaded 2-core machine take a while
END_TIMEOUT_S = 60.0


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent PID, process group) of ``pid``, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw.rpartition(b")")[2].split()
    return fields[0].decode(), int(fields[1]), int(fields[2])


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[2] == pgid and st[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def _children(pid: int) -> list[int]:
    return [p for p in _group(pid) if (st := _stat(p)) is not None and st[1] == pid]


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended before {what} (exit {proc.returncode}):\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.1)


def _terminate_and_check(args: list[str], cwd: Path, workers: int, signum: int = signal.SIGTERM,
                         to_group: bool = False) -> tuple[int, str]:
    """Run ``sosim ARGS``, wait for its workers, send ``signum`` to the parent (or, as a terminal's Ctrl-C
    does, to the whole group), and check that no process of the group is left."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "sosim", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(f"{workers} workers", lambda: len(_children(proc.pid)) >= workers, START_TIMEOUT_S, proc)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=END_TIMEOUT_S)
        deadline = time.monotonic() + END_TIMEOUT_S
        while _group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _group(proc.pid)
        assert not left, f"processes of the group outlived the command: {left}\n{err}"
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_workers(_group(proc.pid), grace_s=0.0)  # anything left by a failed test: ours, by PID


# A sweep long enough to be running when the signal comes: 2,000 points of a shipped scenario.
SWEEP = """\
base: {base}
grid:
  training.micro_batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  schedule.bucket_mb: [{buckets}]
"""


def _sweep_file(tmp_path: Path) -> Path:
    base = REPO / "scenarios" / "gh200_zero_offload_4b.yaml"
    path = tmp_path / "long.yaml"
    path.write_text(SWEEP.format(base=base, buckets=", ".join(str(10 + i) for i in range(200))))
    return path


def test_sigterm_to_sweep_ends_its_workers_and_hints_resume_only_when_written(tmp_path: Path) -> None:
    sweep = _sweep_file(tmp_path)
    code, err = _terminate_and_check(["sweep", str(sweep), "--workers", "2", "--chunk-size", "1000"],
                                     tmp_path, 2)
    assert code == 143, err
    assert "terminated (SIGTERM)" in err and "--resume" not in err and "Traceback" not in err, err
    # With --out, chunks of 1,000 points: stopped before the first chunk finished, so nothing was written.
    out = tmp_path / "rows.csv"
    code, err = _terminate_and_check(["sweep", str(sweep), "--workers", "2", "--chunk-size", "1000",
                                      "--out", str(out)], tmp_path, 2)
    assert code == 143 and "Traceback" not in err, err
    written = out.exists() and len(out.read_text().splitlines()) > 1
    assert ("--resume" in err) == written, err


# A search that keeps two workers busy for several seconds (larger accumulation: more batch splits to try), so
# that the signal finds them running; the test does not wait for it to finish.
TUNE = ["tune", "gh200_zero_offload_4b", "--set", "training.grad_accum=32", "--jobs", "2", "--budget", "100000",
        "--no-write", "--no-progress"]


def test_sigterm_to_tune_ends_its_workers(tmp_path: Path) -> None:
    code, err = _terminate_and_check(
        TUNE,
        tmp_path, 2)
    assert code == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err, err


def test_ctrl_c_to_the_group_stops_sweep_and_workers(tmp_path: Path) -> None:
    code, err = _terminate_and_check(["sweep", str(_sweep_file(tmp_path)), "--workers", "2", "--chunk-size", "1000"],
                                     tmp_path, 2, signal.SIGINT, to_group=True)
    assert code == 130 and "interrupted" in err and "Traceback" not in err, err


def test_ctrl_c_to_the_group_stops_tune_and_workers(tmp_path: Path) -> None:
    code, err = _terminate_and_check(
        TUNE,
        tmp_path, 2, signal.SIGINT, to_group=True)
    assert code == 130 and "Traceback" not in err, err


def test_a_parent_killed_outright_takes_its_workers_along(tmp_path: Path) -> None:
    # SIGKILL: no handler runs in the parent; the workers' parent-death signal (PR_SET_PDEATHSIG) ends them.
    code, _ = _terminate_and_check(
        TUNE,
        tmp_path, 2, signal.SIGKILL)
    assert code == -signal.SIGKILL


def _square(x: int) -> int:
    return x * x


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_stop_pool_abort_ends_busy_workers_by_pid() -> None:
    pool = start_pool(2)
    futures = [pool.submit(_sleep, 600) for _ in range(2)]
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(worker_pids(pool)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = worker_pids(pool)
    assert len(pids) == 2
    stop_pool(pool, abort=True)
    deadline = time.monotonic() + END_TIMEOUT_S
    while any(_stat(p) is not None and _stat(p)[0] not in ("Z", "X") for p in pids):  # type: ignore[index]
        assert time.monotonic() < deadline, "a busy worker survived stop_pool(abort=True)"
        time.sleep(0.05)
    assert all(f.cancelled() or f.done() for f in futures)


def test_a_pool_stopped_without_abort_lets_its_workers_exit() -> None:
    pool = start_pool(2)
    assert [f.result() for f in [pool.submit(_square, i) for i in range(5)]] == [0, 1, 4, 9, 16]
    pids = worker_pids(pool)
    stop_pool(pool, abort=False)
    assert all(_stat(p) is None or _stat(p)[0] in ("Z", "X") for p in pids)  # type: ignore[index]
