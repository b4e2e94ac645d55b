"""Calibration tables of *published* measurements (third-party papers, vendor guides, DeepSpeed's own PRs).

A published table is an ordinary ``measurements.csv`` (same schema, same lookups, same p10/p90 spread, so the
error bands draw on the published ranges), kept in a folder whose ``SOURCES.md`` starts with the line
``# published`` (:func:`sosim.costs.calibration_table.declares_published`, read when the table is loaded):
that file names the source of every row. Rows the folder marks as *transferred* (a value
carried from another machine with its reason, ``device`` column starting with ``transferred``) are listed
apart. Provenance says so, so that a result never passes a published or transferred number off as one sosim
measured (issue 16).
"""

from __future__ import annotations

from pathlib import Path

from sosim.costs.calibration_table import CalibrationTable


def table_origin(table: CalibrationTable) -> str:
    """How provenance describes where a (possibly merged) table's numbers come from; empty when all of them
    were measured by ``sosim calibrate``."""
    paths = [p for p, _ in table.parts] if table.parts else [Path(table.path)]
    marked = [p for p in paths if p in table.published_paths]
    if not marked:
        return ""
    names = ", ".join(f"{p.parent.name}/SOURCES.md" for p in marked)
    return f"published measurements, not measured by sosim (each row's source: {names})"


def all_published(table: CalibrationTable) -> bool:
    """Whether every part of a (possibly merged) table is a published one."""
    paths = [p for p, _ in table.parts] if table.parts else [Path(table.path)]
    return all(p in table.published_paths for p in paths)
