"""``python -m sosim`` = the ``sosim`` command."""

from sosim.cli import main

raise SystemExit(main())
