"""docs/knobs.md, written from the code: each registered system's knobs (sosim/schedules/registry.py), with
their values, their defaults under each implementation and their field descriptions (the pydantic models'
``Field(description=...)``, Vidur's config pattern), so the page cannot drift from the schema.

``python -m sosim.formats.knob_docs`` rewrites the page; tests/test_knob_docs.py fails when it is stale.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic.fields import FieldInfo

from sosim.schedules.registry import SYSTEMS

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"
REGENERATE = "python -m sosim.formats.knob_docs"
_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="), (annotated_types.Lt, "lt", "<"),
           (annotated_types.Le, "le", "<="))


def _values(info: FieldInfo) -> str:
    """What a knob accepts, in words: a Literal's values, else the type and its bounds."""
    ann = info.annotation
    if typing.get_origin(ann) is typing.Literal:
        return " / ".join(f"`{v}`" for v in typing.get_args(ann))
    name = getattr(ann, "__name__", str(ann))
    bounds = [f"{sign} {getattr(m, attr)}" for m in info.metadata for cls, attr, sign in _BOUNDS
              if isinstance(m, cls)]
    return f"{name} {', '.join(bounds)}".strip()


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value >= 1e6:
        return f"{value:.0e}".replace("e+0", "e")
    return str(value)


def _implementations(knobs: type[Any]) -> tuple[str, ...]:
    """The implementations a system's knobs accept, its default first (a system without the knob: one, "")."""
    field = knobs.model_fields.get("implementation")
    if field is None:
        return ("",)
    return tuple(sorted(typing.get_args(field.annotation), key=lambda impl: impl != field.default))


def _defaults(system: str, knobs: type[Any], impl: str) -> dict[str, Any]:
    """The knob values a scenario gets when it names only the system (and the implementation): the model's
    own defaults and its per-implementation ``DEFAULTS``, as validation applies them."""
    data: dict[str, Any] = {"system": system}
    if impl:
        data["implementation"] = impl
    return dict(knobs.model_validate(data).model_dump(mode="json"))


def system_table(system: str) -> list[str]:
    knobs = SYSTEMS[system].knobs
    impls = _implementations(knobs)
    defaults = {impl: _defaults(system, knobs, impl) for impl in impls}
    head = "| knob | values | " + " | ".join(f"default ({i})" if i else "default" for i in impls) + " | meaning |"
    lines = [f"## `{system}` (`{knobs.__module__}.{knobs.__name__}`)", "", head,
             "|" + "---|" * (3 + len(impls))]
    for name, info in knobs.model_fields.items():
        if name == "system":
            continue
        if not info.description:
            raise ValueError(f"{knobs.__module__}.{knobs.__name__}.{name}: no Field(description=...); "
                             "every knob says what it is (docs/knobs.md is written from it)")
        cells = [f"`{name}`", _values(info), *(_fmt(defaults[i][name]) for i in impls),
                 info.description.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render() -> str:
    """The whole page."""
    out = ["# Schedule knobs, by system", "",
           f"<!-- Written by `{REGENERATE}` from the knob models' field descriptions; do not edit by hand. -->", "",
           "Each system's `schedule:` keys (docs/scenarios.md \"Schedule knobs\" compares them across systems). A "
           "default that depends on `implementation` is given for each; a knob DeepSpeed does not have for a system "
           "is an error with `implementation: deepspeed`.", ""]
    for system in SYSTEMS:
        out += [*system_table(system), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    del argv
    DOC_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
