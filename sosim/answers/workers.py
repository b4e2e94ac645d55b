"""Local worker pools that end with their parent (``sosim sweep`` and ``sosim tune``).

Three guarantees, one place:

- :func:`start_pool`: a process pool whose workers ignore Ctrl-C (the terminal sends SIGINT to the whole
  process group; only the parent handles it, so the workers print no tracebacks), take the default action on
  SIGTERM (a forked worker would otherwise inherit the parent's handler), and, on Linux, ask the kernel for
  SIGKILL when their parent dies (``prctl(PR_SET_PDEATHSIG)``): a backstop for a parent killed with SIGKILL or
  dying before it could stop them.
- :func:`stop_pool` with ``abort=True``: cancel what is queued and end the workers now, by PID (SIGTERM, then
  SIGKILL for one that has not gone within a grace period). A plain ``shutdown(wait=False)`` leaves the workers
  finishing their current tasks after the parent has exited.
- :func:`signals_interrupt`: while a command runs, SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) in
  the main thread, so the command stops the way Ctrl-C stops it: its ``finally`` blocks stop the pool.

The death signal is tied to the thread that started the worker (Linux semantics); pools here are started
from the main thread of the command, whose end is the end of the process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sosim.inputs.errors import Terminated

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How long stopped workers get to exit on SIGTERM before SIGKILL. They run pure-Python simulations with no
# state to save, so a short grace is enough; it only bounds how long an interrupted command takes to return.
STOP_GRACE_S = 3.0
EXIT_TERMINATED = 143  # 128 + SIGTERM, the shell's convention for a process ended by SIGTERM
EXIT_INTERRUPTED = 130  # 128 + SIGINT


def _parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it ends (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def init_worker(parent_pid: int) -> None:
    """Pool worker initializer (see the module docstring). ``parent_pid``: the process that forked this worker
    (0 when the start method is not fork: a forkserver is the parent then, and it ends with this process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Forked with the stop signals blocked (_SignalSafePool._spawn_process): take them again.
    _set_mask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    _parent_death_signal()
    # The parent may have died between fork and prctl: then no death signal would ever come.
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)


def _pool_args(workers: int) -> dict[str, Any]:
    context = multiprocessing.get_context()
    parent = os.getpid() if context.get_start_method() == "fork" else 0
    return {"max_workers": max(1, workers), "mp_context": context, "initializer": init_worker,
            "initargs": (parent,)}


_STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def _set_mask(how: int, signals: frozenset[signal.Signals]) -> set[int | signal.Signals] | None:
    """pthread_sigmask where there is one (POSIX); None elsewhere."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(how, signals)


class _SignalSafePool(ProcessPoolExecutor):
    """A ProcessPoolExecutor that forks its workers with SIGINT and SIGTERM blocked in the forking thread.

    Why: right after fork, the parent runs Python's at-fork handlers (logging's ``_releaseLock`` among them);
    a Ctrl-C or SIGTERM whose Python handler runs there raises inside a callback whose exceptions Python only
    prints ("Exception ignored in ..."), and the command then ran on to the end as if never stopped (exit 0
    after Ctrl-C, seen under load). Blocked, the signal stays pending and is handled once the fork is done.
    The workers unblock them in :func:`init_worker`."""

    def _spawn_process(self) -> None:  # every fork of a worker goes through it (Python 3.11 to 3.13)
        old = _set_mask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            super()._spawn_process()  # type: ignore[misc]  # private, not in typeshed
        finally:
            if old is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of ``workers`` processes whose workers end with this process."""
    return _SignalSafePool(**_pool_args(workers))


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A worker that exited stays a zombie until the pool reaps it (its own
    business: reaping it here would confuse the pool's bookkeeping), so on Linux a zombie counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ')'.
            return fh.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        pass
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_workers(pids: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each PID, wait up to ``grace_s`` for them to go, SIGKILL the rest. The PIDs are this process's
    own children (the pool's table), so they cannot have been reused before the pool reaps them."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def worker_pids(pool: Any) -> list[int]:
    """PIDs of a ProcessPoolExecutor's live workers (its ``_processes`` table; empty for other executors)."""
    procs = getattr(pool, "_processes", None) or {}
    return [int(p.pid) for p in list(procs.values()) if getattr(p, "pid", None)]


def stop_pool(pool: Any, abort: bool) -> None:
    """Shut ``pool`` down: wait for its work (``abort=False``), or drop queued work and end the workers now."""
    if not abort:
        pool.shutdown(wait=True, cancel_futures=True)
        return
    pids = worker_pids(pool)
    pool.shutdown(wait=False, cancel_futures=True)
    kill_workers(pids)


class WorkerPool(_SignalSafePool):
    """:func:`start_pool`'s pool for code that shuts a pool down itself: ``shutdown(wait=False,
    cancel_futures=True)`` (stop now, drop the queue) also ends the running workers, by PID."""

    def __init__(self, workers: int) -> None:
        super().__init__(**_pool_args(workers))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if wait or not cancel_futures:
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
            return
        pids = worker_pids(self)
        super().shutdown(wait=False, cancel_futures=True)
        kill_workers(pids)


class SignalState:
    """What :func:`signals_interrupt` saw: the first SIGTERM (``terminated``)."""

    def __init__(self) -> None:
        self.terminated = False

    def handle(self, signum: int, frame: object) -> None:
        self.terminated = True
        raise Terminated()


@contextlib.contextmanager
def signals_interrupt() -> Iterator[SignalState]:
    """SIGTERM raises :class:`Terminated` while the block runs (main thread only; elsewhere a no-op)."""
    state = SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.signal(signal.SIGTERM, state.handle)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit(exc: BaseException) -> tuple[int, str]:
    """(exit status, what happened) for a KeyboardInterrupt that stopped a command."""
    if isinstance(exc, Terminated):
        return EXIT_TERMINATED, "terminated (SIGTERM)"
    return EXIT_INTERRUPTED, "interrupted"


__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "SignalState",
    "Terminated",
    "WorkerPool",
    "init_worker",
    "interrupted_exit",
    "kill_workers",
    "signals_interrupt",
    "start_pool",
    "stop_pool",
    "worker_pids",
]
