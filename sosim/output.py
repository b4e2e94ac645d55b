"""Shared output helpers for the CLI commands: one JSON encoder and one number format.

Why a module: ``--format json`` must print strict JSON (no ``NaN``/``Infinity``, which ``json.dumps``
writes by default) from dicts that hold numpy scalars, pandas NA and non-finite floats; every command
prints through the same function so they all agree.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd


def json_safe(value: Any) -> Any:
    """Plain JSON types: numpy scalars unwrapped, NaN/inf and pandas NA as null, containers recursed."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if value is pd.NA or value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def print_json(obj: Any) -> None:
    """Exactly one strict JSON object on one line of stdout."""
    print(json.dumps(json_safe(obj), allow_nan=False))


def format_value(value: Any) -> str:
    """Table cell: four significant digits for floats, the value as is otherwise."""
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:.4g}"
    return str(value)
