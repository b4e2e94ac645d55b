"""sosim's own version, in one place low in the house: the package's ``__version__`` and every output that says
which sosim produced a number (``check`` baselines) read it here, so no module has to import the package face."""

from __future__ import annotations

VERSION = "0.1.0"  # keep equal to pyproject.toml's [project] version (tests/test_packaging.py checks it)
