"""``python -m sosim`` = the ``sosim`` command."""

# Held (not lost) until main() has its handlers in place: a Ctrl-C or SIGTERM while the CLI module imports is
# then handled like any other (one line, 130 / 143) instead of a KeyboardInterrupt traceback. _signal, the C
# module under signal: importing signal itself (enum and all) took long enough to be interrupted.
import _signal  # type: ignore[import-not-found]  # no stub: a C module of CPython

if hasattr(_signal, "pthread_sigmask"):
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT, _signal.SIGTERM})

from sosim.cli import main

raise SystemExit(main())
