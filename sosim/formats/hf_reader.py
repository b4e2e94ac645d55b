"""The key-by-key reader of a Hugging Face ``config.json`` (shared by :mod:`sosim.formats.hf_model` and
:mod:`sosim.formats.hf_moe`): located errors, and a note for every key read, defaulted or ignored."""

from __future__ import annotations

from typing import Any

from sosim.formats.jsonio import Note
from sosim.run.loader import KeyPath, Located


class _Reader:
    def __init__(self, loc: Located, prefix: KeyPath) -> None:
        self.loc = loc
        self.prefix = prefix
        node = loc.data
        for p in prefix:
            node = node[p]
        self.data: dict[str, Any] = node
        self.notes: list[Note] = []
        self.problems: list[str] = []

    def where(self, key: str) -> str:
        return self.loc.where((*self.prefix, key))

    def dotted(self, key: str) -> str:
        return ".".join(str(p) for p in (*self.prefix, key))

    def error(self, key: str, message: str) -> None:
        self.problems.append(f"{self.where(key)}: {self.dotted(key)}: {message}")

    def pos_int(self, key: str, to: str, required: bool = True) -> int | None:
        if key not in self.data or self.data[key] is None:
            if required:
                self.error(key, f"missing (sosim needs it for model.{to})")
            return None
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.error(key, f"expected a positive integer, got {value!r}")
            return None
        self.notes.append(Note("mapped", self.dotted(key), self.where(key), value, f"model.{to}", value))
        return value

    def defaulted(self, key: str, to: str, value: Any, reason: str) -> None:
        self.notes.append(Note("defaulted", self.dotted(key), self.loc.origin, None, f"model.{to}", value, reason))

    def ignored(self, key: str, reason: str, affects_step: bool = False) -> None:
        self.notes.append(Note("ignored", self.dotted(key), self.where(key), self.data.get(key), reason=reason,
                               affects_step=affects_step))
