"""YAML tags and the scalars PyYAML would build, checked on the event stream before anything is built.

Why: PyYAML's safe constructors raise plain Python errors for values their tag cannot hold
(``!!bool maybe`` -> KeyError, ``!!int abc`` -> ValueError, ``!!timestamp x`` -> AttributeError,
``!!int '<5,000 digits>'`` -> Python's 4,300-digit limit), which surfaced as "internal error" (exit 70).
Here every explicit tag must be one of the safe core's plain types (str, int, float, bool, null, seq, map:
nothing sosim reads is a date, a set or binary), and every scalar that will be built as a number, a
boolean or a date is built once on its own so that a failure is a message with the line
(sosim/run/loader.py ``_check_events`` calls these for each event).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_CORE = "tag:yaml.org,2002:"
# The safe core's plain types: what scenarios, profiles, sweeps and overrides are made of.
ALLOWED_TAGS = frozenset(f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map"))
# Tags whose scalars PyYAML's SafeConstructor builds by parsing the text (and can fail on).
_BUILT = frozenset(f"{_CORE}{name}" for name in ("int", "float", "bool", "null", "timestamp"))
# Characters of a number sosim reads (as sosim/run/loader.py MAX_NUMBER_CHARS says why).
MAX_NUMBER_CHARS = 100
# An untagged plain scalar PyYAML may resolve to a date (2024-13-45 resolves, then fails to build).
_DATE_LIKE = re.compile(r"[0-9]{4}-[0-9]")

_resolver = yaml.resolver.Resolver()


def _risky(value: str) -> bool:
    """Whether an untagged plain scalar may resolve to a number or a date that PyYAML then fails to build
    (``0x_``, ``-0b_``, ``2024-13-45``: int('', 16) and datetime errors). Most numbers are not: they are built
    without this check (it costs a resolution and a construction)."""
    if not value or value[0] not in "+-.0123456789":
        return False
    bare = value.lstrip("+-")
    return "_" in value or ":" in value or bare[:2].lower() in ("0x", "0b") or _DATE_LIKE.match(value) is not None


def _short(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


def tag_problem(tag: str | None) -> str | None:
    """Why an explicit tag on a mapping or sequence is refused (None: no tag, or a plain one)."""
    if tag is None or tag == "!" or tag in ALLOWED_TAGS:
        return None
    return (f"YAML tag {_short(tag)} is not accepted: sosim reads plain values (strings, numbers, true/false, "
            "null, lists, mappings); remove the tag")


def scalar_problem(ev: Any) -> str | None:
    """Why a scalar event cannot be built as its tag says (None: it can). ``ev`` is a yaml.ScalarEvent."""
    tag = ev.tag
    value = ev.value
    if tag == "!":  # the non-specific tag: PyYAML's composer resolves it as it resolves an untagged scalar
        tag = _resolver.resolve(yaml.ScalarNode, value, ev.implicit)
    if tag is not None:
        problem = tag_problem(tag)
        if problem is not None:
            return problem
        if tag not in _BUILT:
            return None
        if tag != f"{_CORE}null" and len(value) > MAX_NUMBER_CHARS:
            return (f"a {_short(tag)} value of {len(value):,} characters; no value sosim takes needs more than "
                    f"{MAX_NUMBER_CHARS} (docs/limits.md)")
    elif ev.style or len(value) > MAX_NUMBER_CHARS or not _risky(value):
        return None  # quoted, too long (the loader refuses it by its length) or built by PyYAML without fail
    else:
        tag = _resolver.resolve(yaml.ScalarNode, value, (True, False))
        if tag not in _BUILT:
            return None
    node = yaml.ScalarNode(tag, value)
    try:
        yaml.constructor.SafeConstructor().construct_object(node)
    except Exception:  # every way PyYAML's constructors fail is one answer: not a tag's value
        expected = {"int": "an integer", "float": "a number", "bool": "true or false", "null": "null",
                    "timestamp": "a date"}[tag[len(_CORE):]]
        if ev.tag is None:  # an untagged scalar PyYAML resolves but cannot build: 2024-13-45, 0x_
            what = "a date" if tag == f"{_CORE}timestamp" else "a number"
            return f"{value!r} reads as {what} but is not one; quote it if it is a name"
        return f"{value!r} is not {expected}, as its tag {_short(tag)} says"
    return None


__all__ = ["ALLOWED_TAGS", "scalar_problem", "tag_problem"]
