"""``python -m sosim`` = the ``sosim`` command."""

import signal

# Held (not lost) until main() has its handlers in place: a Ctrl-C or SIGTERM while the CLI module imports is
# then handled like any other (one line, 130 / 143) instead of a KeyboardInterrupt traceback.
if hasattr(signal, "pthread_sigmask"):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

from sosim.cli import main

raise SystemExit(main())
