"""Validation rows of kind ``fits``: does a published "model X trains on N GPUs" claim fit sosim's memory model?

The prediction is memory only (no simulation): the scenario's per-rank GPU and host footprint
(:mod:`sosim.hardware.memory`, the system's ``memory_usage``) against the usable memory of the profile. The
row's ``error`` is the tighter side's use of its usable memory minus 1 (-0.10: 10% headroom; +0.19: 19% over),
so a fit that holds by a hair is visible; the row is within budget when the prediction (fits / does not fit)
matches the claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sosim.hardware.machine import Machine
from sosim.hardware.memory import check_fit
from sosim.inputs.units import GIB
from sosim.run.loader import load_scenario
from sosim.schedules.registry import SYSTEMS

FIT_WORDS = ("fits", "does not fit")


def fit_prediction(scenario: Path, overrides: list[str]) -> tuple[bool, float, str]:
    """(fits, worst use of usable memory - 1, why not) for a scenario file and its overrides."""
    sc = load_scenario(scenario, overrides)
    machine = Machine.from_scenario(sc)
    usage = SYSTEMS[sc.schedule.system].memory_usage(sc)
    hw = sc.hardware
    fit = check_fit(usage, hw, machine)
    sharing = 1
    if not machine.legacy:  # the busiest socket's ranks share its host memory (as check_fit counts them)
        sharing = max(machine.ranks_on_socket(s) for s in set(machine.rank_socket))
    gpu_use = usage.gpu_peak_bytes / ((hw.gpu.hbm_gib - hw.gpu.reserved_gib) * GIB)
    cpu_use = usage.cpu_peak_bytes * sharing / ((hw.cpu.mem_gib - hw.cpu.reserved_gib) * GIB)
    return fit.feasible, max(gpu_use, cpu_use) - 1.0, fit.reason


def evaluate_fit(row: dict[str, Any], scenario: Path) -> tuple[str, str, float, bool]:
    """(published, predicted, error, within) of one ``fits`` row."""
    feasible, margin, _ = fit_prediction(scenario, list(row.get("set", [])))
    predicted = FIT_WORDS[0] if feasible else FIT_WORDS[1]
    return str(row["published"]), predicted, margin, predicted == row["published"]
