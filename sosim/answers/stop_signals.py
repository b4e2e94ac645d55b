"""Signals from the first instant of every command: SIGTERM raises :class:`~sosim.inputs.errors.Terminated`
(a KeyboardInterrupt) and SIGINT KeyboardInterrupt, so that a signal at any point ends the command with one
line and exit 130 / 143 (sosim/cli.py installs them before anything heavy is imported; ``python -m sosim``
holds both signals until then, sosim/__main__.py). Sweep and tune keep the SIGTERM handler while their workers
run (sosim/answers/workers.py)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from sosim.inputs.errors import Terminated

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def install_stop_handlers() -> dict[int, Any]:
    """SIGTERM raises Terminated (a KeyboardInterrupt) and SIGINT KeyboardInterrupt from here on, so that a
    signal at any instant (while pandas and pyarrow import, in validate or check) ends the command with one
    line and 130 / 143. A SIGINT the parent set to be ignored (``nohup``, a background job) stays ignored.
    Called before anything heavy is imported (sosim/__init__.py imports lazily for that). Returns the handlers
    it replaced (main() puts them back: main() is also called in-process, by tests and notebooks)."""
    if not threading_main():
        return {}
    previous: dict[int, Any] = {signal.SIGTERM: signal.signal(signal.SIGTERM, _on_sigterm)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    return previous


def release_held_signals() -> None:
    """Deliver a SIGINT / SIGTERM that sosim/__main__.py held while the CLI module imported (call inside the
    block that handles KeyboardInterrupt: a held signal is raised right here)."""
    if hasattr(signal, "pthread_sigmask") and threading_main():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def stopped(exc: KeyboardInterrupt) -> int:
    """Say what stopped the command (one line) and return its exit status."""
    terminated = isinstance(exc, Terminated)
    print("sosim: terminated (SIGTERM)" if terminated else "sosim: interrupted", file=sys.stderr)
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "install_stop_handlers", "release_held_signals", "stopped"]
