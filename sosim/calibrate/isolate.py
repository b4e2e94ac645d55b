"""Run one measurement in a child process (spawn), streaming its rows back, under a hard time limit.

Why a child per DeepSpeed measurement: an engine leaves pinned buffers, NCCL groups, hooks and (for
SuperOffload) a worker process behind, and changes the CPU affinity of the thread that created it; a fresh
process per configuration keeps each measurement clean and lets a hung one be killed without losing the
rows already measured.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TextIO

# One measurement as it crosses the process boundary: (op, variant, dtype, times_s, shape columns).
Measurement = tuple[str, str, str, list[float], Mapping[str, float]]
Emit = Callable[[Measurement], None]

_DONE = "__done__"


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (a killed ``sosim calibrate`` must not
    leave a child measuring on the GPU). Elsewhere a no-op. Inlined, not sosim.answers.workers: this folder runs
    standalone on GPU machines without the simulator."""
    if not sys.platform.startswith("linux"):
        return
    import contextlib
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def _child(target: Callable[..., None], kwargs: dict[str, Any], results: Any) -> None:
    die_with_parent()
    try:
        target(results.put, **kwargs)
    except BaseException as error:  # report any failure to the parent, then end the child
        results.put(("__error__", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
    finally:
        results.put(_DONE)


def run_isolated(
    target: Callable[..., None],
    kwargs: dict[str, Any],
    timeout_s: float,
    log: TextIO = sys.stderr,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[Measurement], str]:
    """Rows emitted by ``target(emit, **kwargs)`` in a spawned child, and '' or the reason it stopped early.

    ``target`` must be a module-level function (spawn pickles it by name). Rows emitted before a crash or
    a timeout are kept. ``clock`` measures the timeout (a test passes one it controls: no race with a slow
    start of the child on a loaded machine).
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    # Not daemonic: SuperOffload starts its own worker process from inside the child.
    child = context.Process(target=_child, args=(target, kwargs, results), daemon=False)
    child.start()
    deadline_s = clock() + timeout_s
    rows: list[Measurement] = []
    problem = ""
    while True:
        try:
            item = results.get(timeout=1.0)
        except queue.Empty:
            if clock() > deadline_s:
                problem = f"timed out after {timeout_s:.0f} s"
                break
            if not child.is_alive() and results.empty():
                problem = problem or f"child exited with code {child.exitcode} before finishing"
                break
            continue
        if item == _DONE:
            break
        if isinstance(item, tuple) and len(item) == 2 and item[0] == "__error__":
            problem = str(item[1]).splitlines()[0]
            print(f"[calibrate] {getattr(target, '__name__', target)} failed:\n{item[1]}", file=log, flush=True)
            continue
        rows.append(item)
    # A child that timed out is hung: no point waiting for it to finish on its own.
    child.join(timeout=0 if problem.startswith("timed out") else 20)
    if child.is_alive():
        child.kill()
        child.join(timeout=10)
    return rows, problem
