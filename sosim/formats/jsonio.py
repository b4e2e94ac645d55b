"""The user's own JSON files (DeepSpeed and Hugging Face configs): strict reading with line numbers, and
the notes that say how each key was used.

``json.loads`` gives no positions, so after it has accepted a text, a small scanner walks the same text and
records the line of every key path (the same side table :class:`sosim.run.loader.Located` keeps for YAML).
Problems are reported as ``file:line: key.path: message`` like every other input error in sosim.

DeepSpeed reads its config with ``hjson`` and rejects duplicate keys
(``runtime/config.py``: ``dict_raise_error_on_duplicate_keys``); sosim reads strict JSON (no comments) and
rejects duplicates the same way, naming both lines.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sosim.inputs.errors import ConfigError
from sosim.run.loader import KeyPath, Located, read_text

_WS = re.compile(r"[ \t\n\r]*")
# A JSON number or literal: the scanner only needs to step over it (json.loads has validated it).
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")


class _Indexer:
    """Walks an already-valid JSON text and records (key path -> line) and duplicate keys."""

    def __init__(self, text: str, origin: str) -> None:
        self.text = text
        self.origin = origin
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.lines: dict[KeyPath, tuple[str, int]] = {}
        self.duplicates: list[str] = []

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self.newlines, pos - 1) + 1

    def skip_ws(self, pos: int) -> int:
        m = _WS.match(self.text, pos)
        return m.end() if m else pos

    def value(self, pos: int, path: KeyPath) -> int:
        pos = self.skip_ws(pos)
        self.lines.setdefault(path, (self.origin, self.line_of(pos)))
        ch = self.text[pos]
        if ch == "{":
            return self.obj(pos + 1, path)
        if ch == "[":
            return self.arr(pos + 1, path)
        if ch == '"':
            _, end = json.decoder.scanstring(self.text, pos + 1)  # type: ignore[attr-defined]
            return int(end)
        m = _SCALAR.match(self.text, pos)
        if m is None:  # pragma: no cover - json.loads accepted the text, so every value is a scalar here
            raise ValueError(f"unexpected character at {pos}")
        return m.end()

    def obj(self, pos: int, path: KeyPath) -> int:
        seen: dict[str, int] = {}
        pos = self.skip_ws(pos)
        if self.text[pos] == "}":
            return pos + 1
        while True:
            pos = self.skip_ws(pos)
            key_line = self.line_of(pos)
            key, pos = json.decoder.scanstring(self.text, pos + 1)  # type: ignore[attr-defined]
            key_path = (*path, key)
            if key in seen:
                dotted = ".".join(str(p) for p in key_path)
                self.duplicates.append(
                    f"{self.origin}:{key_line}: {dotted}: duplicate key (first at line {seen[key]}); "
                    "DeepSpeed rejects duplicate keys too"
                )
            else:
                seen[key] = key_line
                self.lines[key_path] = (self.origin, key_line)
            pos = self.skip_ws(pos)
            pos = self.value(pos + 1, key_path)  # past the ':'
            pos = self.skip_ws(pos)
            if self.text[pos] == "}":
                return pos + 1
            pos += 1  # ','

    def arr(self, pos: int, path: KeyPath) -> int:
        pos = self.skip_ws(pos)
        if self.text[pos] == "]":
            return pos + 1
        index = 0
        while True:
            pos = self.value(pos, (*path, index))
            pos = self.skip_ws(pos)
            if self.text[pos] == "]":
                return pos + 1
            pos += 1
            index += 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _LongNumber(ValueError):
    """A number written with more characters than any value sosim takes (MAX_NUMBER_CHARS)."""


# As sosim/run/loader.py MAX_NUMBER_CHARS (the longest exact double has 57 characters): a 4,300-digit
# integer in a DeepSpeed config overflowed float() deep in the mapping (exit 70).
MAX_NUMBER_CHARS = 100
_LONG_NUMBER = re.compile(rf"-?\d[\d.eE+-]{{{MAX_NUMBER_CHARS},}}")


def _number(convert: type[int] | type[float]) -> Any:
    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise _LongNumber(text)
        return convert(text)

    return parse


def parse_json(text: str, origin: str) -> Located:
    """Parse strict JSON keeping the line of every key; syntax errors and duplicates name their line."""
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_int=_number(int), parse_float=_number(float))
    except _LongNumber as exc:
        found = _LONG_NUMBER.search(text)
        line = text.count("\n", 0, found.start()) + 1 if found else 1
        raise ConfigError([f"{origin}:{line}: a number of {len(str(exc)):,} characters; no value sosim takes "
                           f"needs more than {MAX_NUMBER_CHARS} (docs/limits.md)"]) from None
    except json.JSONDecodeError as exc:
        hint = " (sosim reads strict JSON: no comments or trailing commas)" if "Expecting" in exc.msg else ""
        raise ConfigError([f"{origin}:{exc.lineno}: JSON syntax error: {exc.msg} (column {exc.colno}){hint}"]) from None
    except ValueError as exc:
        raise ConfigError([f"{origin}:1: JSON error: {exc}"]) from None
    except RecursionError:
        raise ConfigError([f"{origin}:1: (top level): JSON nested too deeply"]) from None
    indexer = _Indexer(text, origin)
    try:
        indexer.value(0, ())
    except RecursionError:
        raise ConfigError([f"{origin}:1: (top level): JSON nested too deeply"]) from None
    if indexer.duplicates:
        raise ConfigError(indexer.duplicates)
    return Located(data=data, origin=origin, lines=indexer.lines)


def read_json(path: str | Path) -> Located:
    p = Path(path)
    return parse_json(read_text(p), str(p))  # bounded size, UTF-8 with the line of a bad byte


@dataclass(frozen=True)
class Note:
    """How one key of a user's JSON file was used: mapped, defaulted (absent: the value used instead), ignored.

    ``affects_step`` marks ignored keys that would change the real step time but that sosim does not model,
    so that the report can tell them apart from keys that do not matter for speed (learning rate, logging).
    """

    status: Literal["mapped", "defaulted", "ignored"]
    key: str  # dotted key path in the JSON file
    where: str  # file:line (or the file alone for an absent key)
    value: Any = None  # the file's value (None when absent)
    to: str = ""  # scenario key path it sets
    as_value: Any = None  # the value the scenario gets
    reason: str = ""
    affects_step: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "where": self.where}
        if self.status != "defaulted":
            out["value"] = self.value
        if self.to:
            out["to"] = self.to
            out["as"] = self.as_value
        if self.reason:
            out["reason"] = self.reason
        if self.status == "ignored":
            out["affects_step"] = self.affects_step
        return out

    def line(self) -> str:
        if self.status == "ignored":
            tag = "NOT MODELLED" if self.affects_step else "ignored"
            shown = "" if self.value is None else f" = {_show(self.value)}"
            return f"  {tag:<12} {self.key}{shown}: {self.reason}"
        shown = "(absent)" if self.status == "defaulted" else f"= {_show(self.value)}"
        target = f" -> {self.to} = {_show(self.as_value)}" if self.to else ""
        reason = f"  [{self.reason}]" if self.reason else ""
        return f"  {self.status:<12} {self.key} {shown}{target}{reason}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e6:
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return json.dumps(value) if isinstance(value, str) else str(value)


def notes_by_status(notes: list[Note]) -> dict[str, list[dict[str, Any]]]:
    """The JSON form of a report: {"mapped": [...], "defaulted": [...], "ignored": [...]}."""
    return {status: [n.as_dict() for n in notes if n.status == status] for status in ("mapped", "defaulted", "ignored")}
