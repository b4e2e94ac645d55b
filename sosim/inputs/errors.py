"""Exceptions for user mistakes. The CLI prints them as one line each and exits non-zero (no traceback)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# What kind of problem a :class:`Problem` is, for callers that act on it (a sweep stops before its first point on
# a key path that cannot exist; a bad value at one point is that point's row): the key path itself
# (unknown_key, not_a_mapping, cannot_set, empty_key), an override that is not ``key.path=value``
# (override_syntax), a value (value), or anything else, given as text (other).
ProblemKind = Literal["unknown_key", "not_a_mapping", "cannot_set", "empty_key", "override_syntax", "value", "other"]
# The kinds about the key path rather than its value.
KEY_PATH_KINDS: frozenset[str] = frozenset({"unknown_key", "not_a_mapping", "cannot_set", "empty_key"})


@dataclass(frozen=True)
class Problem:
    """One problem of an input, located: ``where`` (``file:line``, ``--set TEXT``; "" when unknown), the key
    ``path`` (dotted; "" when the problem is about no key), the ``message``, its ``kind``, and the ``--set``
    texts it is blamed on (``overrides``). Printed as ``where: path: message``."""

    where: str
    path: str
    message: str
    kind: ProblemKind = "value"
    overrides: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        """The problem without its location (``path: message``): the same for every input that has it."""
        return f"{self.path}: {self.message}" if self.path else self.message

    def __str__(self) -> str:
        return ": ".join(part for part in (self.where, self.what) if part)


class SosimError(Exception):
    """Base class for errors caused by input (files, overrides, options), not by bugs."""


class ConfigError(SosimError):
    """One or more problems in a YAML file or an override.

    ``details`` holds the problems as :class:`Problem` objects, ``problems`` the same as fully formatted lines
    ``file:line: key.path: message``, so that every problem in a file is reported at once rather than one per
    run. A problem given as text is kept as it is (kind ``other``, no location of its own).
    """

    def __init__(self, problems: Sequence[str | Problem] | str) -> None:
        items = [problems] if isinstance(problems, str) else problems
        self.details: tuple[Problem, ...] = tuple(p if isinstance(p, Problem) else Problem("", "", p, "other")
                                                  for p in items)
        self.problems = [str(p) for p in self.details]
        super().__init__("\n".join(self.problems))

    def __reduce__(self) -> tuple[type[ConfigError], tuple[list[Problem]]]:
        # Across a process pool the problems travel as objects (Exception's default would pass the joined text).
        return type(self), (list(self.details),)


class InfeasibleError(SosimError):
    """A configuration that cannot run at all (for example a search that finds no model that fits)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an exception so that a command stops (and stops its workers) as Ctrl-C does: the CLI
    installs the handler first thing (sosim/cli.py), sweep and tune keep it while their workers run
    (sosim/answers/workers.py). Exit status 143 (128 + 15)."""
