"""Exceptions for user mistakes. The CLI prints them as one line each and exits non-zero (no traceback)."""

from __future__ import annotations


class SosimError(Exception):
    """Base class for errors caused by input (files, overrides, options), not by bugs."""


class ConfigError(SosimError):
    """One or more problems in a YAML file or an override.

    ``problems`` holds fully formatted lines ``file:line: key.path: message`` so that every problem in a
    file is reported at once rather than one per run.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class InfeasibleError(SosimError):
    """A configuration that cannot run at all (for example a search that finds no model that fits)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an exception so that a command stops (and stops its workers) as Ctrl-C does: the CLI
    installs the handler first thing (sosim/cli.py), sweep and tune keep it while their workers run
    (sosim/answers/workers.py). Exit status 143 (128 + 15)."""
