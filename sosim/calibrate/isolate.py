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
_STARTED = "__started__"
# Starting a spawned interpreter and importing torch/DeepSpeed can take tens of seconds on a loaded host; that
# start has its own limit, so that ``timeout_s`` bounds the measurement itself, whatever the machine's load.
START_TIMEOUT_S = 180.0


def _child(target: Callable[..., None], kwargs: dict[str, Any], results: Any) -> None:
    results.put(_STARTED)
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
) -> tuple[list[Measurement], str]:
    """Rows emitted by ``target(emit, **kwargs)`` in a spawned child, and '' or the reason it stopped early.

    ``target`` must be a module-level function (spawn pickles it by name). Rows emitted before a crash or
    a timeout are kept.
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    # Not daemonic: SuperOffload starts its own worker process from inside the child.
    child = context.Process(target=_child, args=(target, kwargs, results), daemon=False)
    child.start()
    # The measurement's clock starts when the child reports that it runs (see START_TIMEOUT_S).
    deadline_s = time.monotonic() + START_TIMEOUT_S
    rows: list[Measurement] = []
    problem = ""
    while True:
        try:
            item = results.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline_s:
                problem = f"timed out after {timeout_s:.0f} s"
                break
            if not child.is_alive() and results.empty():
                problem = problem or f"child exited with code {child.exitcode} before finishing"
                break
            continue
        if item == _STARTED:
            deadline_s = time.monotonic() + timeout_s
            continue
        if item == _DONE:
            break
        if isinstance(item, tuple) and len(item) == 2 and item[0] == "__error__":
            problem = str(item[1]).splitlines()[0]
            print(f"[calibrate] {getattr(target, '__name__', target)} failed:\n{item[1]}", file=log, flush=True)
            continue
        rows.append(item)
    # A child that timed out is hung: end it now. One that finished gets time to release its GPU state.
    if not problem.startswith("timed out"):
        child.join(timeout=20)
    if child.is_alive():
        child.kill()
        child.join(timeout=10)
    return rows, problem
