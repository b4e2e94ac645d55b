"""No module over 500 lines without a written reason at its top (issue 25): a module of sosim/, scripts/ or tests/
longer than that says, in its docstring, "Why this module is over 500 lines: ..."."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 500
REASON = "Why this module is over 500 lines:"
# Over the limit without the paragraph yet, each with why it is not written here; nothing may join, and an entry
# that is no longer over the limit (or now says why) must go.
PENDING: dict[str, str] = {}


def _modules() -> list[Path]:
    return sorted(p for folder in ("sosim", "scripts", "tests") for p in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _long_without_reason(paths: list[Path], root: Path = ROOT) -> list[str]:
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + (not text.endswith("\n") and bool(text))
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in doc or len(doc.split(REASON, 1)[1].split()) < 8:
            out.append(f"{path.relative_to(root)} ({lines} lines)")
    return out


def test_every_long_module_says_why_at_its_top() -> None:
    found = _long_without_reason(_modules())
    new = [f for f in found if f.split(" (")[0] not in PENDING]
    assert not new, (f"modules over {MAX_LINES} lines without '{REASON} ...' (a sentence or more) in their "
                     f"docstring: split them, or say why: {new}")
    gone = set(PENDING) - {f.split(" (")[0] for f in found}
    assert not gone, f"no longer pending, remove from PENDING: {sorted(gone)}"


def test_the_rule_catches_a_long_module(tmp_path: Path) -> None:
    body = "x = 1\n" * MAX_LINES
    bare = tmp_path / "bare.py"
    bare.write_text('"""A module."""\n' + body)
    short_reason = tmp_path / "short_reason.py"
    short_reason.write_text(f'"""A module.\n\n{REASON} yes."""\n' + body)
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text(f'"""A module.\n\n{REASON} its parts share one table and one error type.\n"""\n' + body)
    at_limit = tmp_path / "at_limit.py"
    at_limit.write_text("x = 1\n" * MAX_LINES)
    assert _long_without_reason([bare, short_reason, reasoned, at_limit], tmp_path) == [
        f"bare.py ({MAX_LINES + 1} lines)", f"short_reason.py ({MAX_LINES + 3} lines)"]
