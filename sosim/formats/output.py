"""Shared output helpers for the CLI commands: one JSON encoder, one number format, output-file checks.

Why a module: ``--format json`` must print strict JSON (no ``NaN``/``Infinity``, which ``json.dumps``
writes by default) from dicts that hold numpy scalars, pandas NA and non-finite floats; every command
prints through the same function so they all agree.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sosim.inputs.errors import SosimError


def json_safe(value: Any) -> Any:
    """Plain JSON types: numpy scalars unwrapped, NaN/inf and pandas NA as null, containers recursed."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    # pandas only if it is loaded (no pandas value exists otherwise): the CLI imports this module before
    # its signal handlers are in place, and pandas takes most of a second to import (sosim/cli.py).
    pd = sys.modules.get("pandas")
    if value is None or (pd is not None and value is pd.NA):
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


def check_output_path(path: str, option: str, suffixes: Sequence[str] | None = None, *,
                      folder_ok: bool = False) -> Path:
    """Refuse an output path that cannot be written, before any work is done. ``folder_ok``: the output is a
    folder (Parquet part files) and may exist already."""
    out = Path(path)
    if not path.strip():
        raise SosimError(f"{option}: empty file name")
    if out.is_dir() and not folder_ok:
        raise SosimError(f"{option} {path}: is a folder; give a file name")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SosimError(f"{option} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK):
        raise SosimError(f"{option} {path}: cannot write in {parent}")
    problem = _write_probe(out, parent, folder_ok)
    if problem:
        raise SosimError(f"{option} {path}: cannot write: {problem}")
    if suffixes is not None and out.suffix.lower().lstrip(".") not in suffixes:
        raise SosimError(f"{option} {path}: unsupported file type '{out.suffix or '(none)'}'; use one of "
                         + ", ".join(f".{s}" for s in sorted(suffixes)))
    return out


def _write_probe(out: Path, parent: Path, folder_ok: bool) -> str:
    """'' when ``out`` can really be written, else why not. os.access answers yes to root everywhere, and
    pseudo file systems (/proc, /sys) or a read-only mount only refuse the actual write: try it, leaving
    nothing behind (an existing file is opened for appending and closed unchanged)."""
    import tempfile

    try:
        if out.is_file():
            with out.open("ab"):
                pass
            return ""
        if out.is_dir() and folder_ok:
            parent = out
        fd, probe = tempfile.mkstemp(prefix=".sosim-write-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""


def plot_suffixes() -> list[str]:
    """Figure formats matplotlib can write here (imports matplotlib: only call when a figure is asked for)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return list(FigureCanvasBase.get_supported_filetypes())


def non_finite_metrics(metrics: dict[str, Any]) -> list[str]:
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]


def check_finite_result(name: str, metrics: dict[str, Any]) -> None:
    """A result with inf/NaN metrics is not an answer: say so instead of printing it."""
    bad = non_finite_metrics(metrics)
    if bad:
        raise SosimError(f"{name}: the simulation gave non-finite {', '.join(bad)}: some input is outside the "
                         "range the model handles (an extreme bandwidth, FLOP rate, latency or size)")


def provenance_fields(sc: Any, engine: str | None = None) -> dict[str, Any]:
    """What produced a result, for every output: implementation (None where a system has one), the hardware
    profile's name, the calibration table's path, several joined by ", " (None: the analytic cost model), the
    DeepSpeed release,
    and, when given, the engine that ran the plan (docs/engines.md; every Result's provenance names it)."""
    paths = sc.hardware.calibration_paths
    out = {"implementation": getattr(sc.schedule, "implementation", None), "profile": sc.hardware.name,
           "calibration": ", ".join(paths) if paths else None,
           # The DeepSpeed release the system runs (issue 21; sosim/schedules/blocks/ds_version.py).
           "deepspeed_version": getattr(sc.schedule, "deepspeed_version", None)}
    if engine is not None:
        out["engine"] = engine
    return out
