"""What a system is given (issue 25, "a build context"): the Machine is resolved once per simulation and handed to
``build_plan`` and ``choices``; no system module rebuilds it from the scenario."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from sosim.schedules.registry import SYSTEMS

SCHEDULES = Path(__file__).resolve().parent.parent / "sosim" / "schedules"


def test_no_system_module_rebuilds_the_machine() -> None:
    found = [f"{p.name}:{n}" for p in sorted(SCHEDULES.glob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b(rank_threads|from_scenario)\(", line)]
    assert not found, f"rebuilds the Machine (take the one build_plan / choices is given): {found}"


def test_every_system_takes_the_machine() -> None:
    for name, system in SYSTEMS.items():
        for fn in (system.build_plan, system.choices):
            assert "machine" in inspect.signature(fn).parameters, (name, fn.__name__)
