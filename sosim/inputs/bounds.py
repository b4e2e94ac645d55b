"""Sanity bounds of sosim's inputs and the check that numbers are numbers (docs/limits.md).

The bounds are far outside anything real: they catch typos, unit mistakes and runaway inputs, each with a
message that names the key. :func:`field_problem` is what every config model (sosim/inputs/config.py ``_Strict``)
asks of each raw value before pydantic converts it: pydantic's lax mode would read ``layers: true`` as 1 layer
and ``activation_checkpointing: 1`` as true.
"""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

# Input bounds (docs/limits.md). Integers: above 2^53 a float no longer holds every integer, and the cost model
# computes in floats; no count or size sosim takes comes near it (the work bound in sosim/run/loader.py refuses far
# smaller layer counts).
MAX_INT = 2**53
# GPUs of one run: the largest training clusters today are ~1e5 GPUs; 1e6 leaves a 10x margin while refusing
# nonsense such as 1e9 GPUs (which otherwise "fits" and predicts 5e13 tokens/s).
MAX_GPUS = 1_000_000
# Link and memory bandwidths, GB/s: 1e-3 (1 MB/s) is below any real link (PCIe 1.0 x1 is 0.25 GB/s, 1 GbE
# 0.125 GB/s); 1e6 (1 PB/s) is 200x today's fastest HBM (4.8 TB/s, H200). Outside this a value is a typo or a
# unit mistake, and 1e-300 GB/s turned a step into 1e300 s without a word.
MIN_GBPS = 1e-3
MAX_GBPS = 1e6


def _leaf_types(tp: Any) -> set[Any]:
    """The types a field annotation admits at its leaves (list[tuple[float, float]] -> {float})."""
    origin = get_origin(tp)
    if origin is Literal:
        return {type(a) for a in get_args(tp)}
    if origin is Annotated:
        return _leaf_types(get_args(tp)[0])
    args = [a for a in get_args(tp) if a is not Ellipsis]
    if args and (origin in (Union, types.UnionType) or origin is not None):
        return set().union(*(_leaf_types(a) for a in args))
    return {tp}


@functools.cache
def _numbers_only(model: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``model`` holds numbers (at its leaves) and no booleans."""
    field = model.model_fields.get(name)
    if field is None:
        return False
    leaves = _leaf_types(field.annotation)
    return bool(leaves & {int, float}) and not leaves & {bool, Any, object}


@functools.cache
def _bool_only(model: type[BaseModel], name: str) -> bool:
    """Whether field ``name`` of ``model`` is a yes/no (bool, or bool | None)."""
    field = model.model_fields.get(name)
    return field is not None and _leaf_types(field.annotation) - {type(None)} == {bool}


def _bad_number(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` (or a value inside it) is not a number sosim takes: a boolean, or an integer beyond MAX_INT."""
    if isinstance(value, bool):
        return ("expected a number, got a boolean (YAML reads true/false, yes/no, on/off as booleans; "
                "write the number)")
    if isinstance(value, int) and abs(value) > MAX_INT:
        return (f"an integer of {len(str(abs(value)))} digits is beyond {MAX_INT:,} (2^53), larger than any "
                "quantity sosim takes (docs/limits.md)")
    if depth < 4 and isinstance(value, (list, tuple)):
        return next((bad for v in value if (bad := _bad_number(v, depth + 1))), None)
    if depth < 4 and isinstance(value, dict):
        return next((bad for v in value.values() if (bad := _bad_number(v, depth + 1))), None)
    return None


def field_problem(model: type[BaseModel], name: str, value: Any) -> str | None:
    """Why ``value`` does not fit field ``name``: a boolean for a number, a number for a yes/no, an integer
    beyond MAX_INT (None: fine, or left to the field's own validation)."""
    t = type(value)
    if t is bool:
        return _bad_number(value) if _numbers_only(model, name) else None
    if _bool_only(model, name):
        return f"expected true or false, got {value!r}"
    if t is float or t is str or (t is int and -MAX_INT <= value <= MAX_INT):
        return None
    return _bad_number(value) if _numbers_only(model, name) else None


class FieldProblem(ValueError):
    """A problem with one field, raised by a model-level check: the loader locates it at ``field`` (a key of
    the model, or a dotted path below it: the line of that key), not at the section."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field.split("."))


__all__ = ["MAX_GBPS", "MAX_GPUS", "MAX_INT", "MIN_GBPS", "FieldProblem", "field_problem"]
