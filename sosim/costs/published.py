"""Calibration tables of *published* measurements (third-party papers, vendor guides, DeepSpeed's own PRs).

A published table is an ordinary ``measurements.csv`` (same schema, same lookups, same p10/p90 spread, so the
error bands draw on the published ranges), kept in a folder whose ``SOURCES.md`` starts with the line
``# published``: that file names the source of every row. Rows the folder marks as *transferred* (a value
carried from another machine with its reason, ``device`` column starting with ``transferred``) are listed
apart. Provenance says so, so that a result never passes a published or transferred number off as one sosim
measured (issue 16).
"""

from __future__ import annotations

from pathlib import Path

from sosim.costs.calibration_table import CalibrationTable

MARKER = "# published"


def is_published(table_path: Path) -> bool:
    """Whether the table's folder declares its rows published (``SOURCES.md`` starting with ``# published``)."""
    sources = Path(table_path).parent / "SOURCES.md"
    try:
        with sources.open(encoding="utf-8") as fh:
            return fh.readline().strip().lower().startswith(MARKER)
    except OSError:
        return False


def table_origin(table: CalibrationTable) -> str:
    """How provenance describes where a (possibly merged) table's numbers come from; empty when all of them
    were measured by ``sosim calibrate``."""
    paths = [p for p, _ in table.parts] if table.parts else [Path(table.path)]
    marked = [p for p in paths if is_published(p)]
    if not marked:
        return ""
    names = ", ".join(f"{p.parent.name}/SOURCES.md" for p in marked)
    return f"published measurements, not measured by sosim (each row's source: {names})"


def all_published(table: CalibrationTable) -> bool:
    """Whether every part of a (possibly merged) table is a published one."""
    paths = [p for p, _ in table.parts] if table.parts else [Path(table.path)]
    return all(is_published(p) for p in paths)
