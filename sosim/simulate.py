"""``simulate(scenario) -> Result``: the one pure entry point (no files written, no global state)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np

from sosim.config import Scenario
from sosim.costs import AnalyticCostModel, CostModel
from sosim.fastpath import timeline
from sosim.memory import check_fit
from sosim.plan import Plan
from sosim.result import Result, compute_metrics
from sosim.schedules import SCHEDULES
from sosim.schedules.layout import tokens_per_gpu


def make_cost_model(sc: Scenario) -> CostModel:
    analytic = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    if sc.hardware.calibration is None:
        return analytic
    # Imported here so that profiles without a calibration table never touch its reader.
    from sosim.table_costs import TableCostModel

    return TableCostModel.from_profile(analytic)


def simulate(sc: Scenario, costs: CostModel | None = None) -> Result:
    """Simulate ``sc`` and return its metrics, spans and memory. Deterministic for a given scenario.

    ``costs``: another cost model for the same scenario (error bands replay sampled costs, sosim.bands);
    default: the profile's own (:func:`make_cost_model`)."""
    # A simulation allocates many small, acyclic objects (ops, tuples, events) and frees them all at once:
    # the cyclic garbage collector would only walk them again and again. Paused here, restored after.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _simulate(sc, costs, timeline)
    finally:
        if paused:
            gc.enable()


def _simulate(sc: Scenario, costs: CostModel | None, run: Callable[[Plan], tuple[np.ndarray, np.ndarray]]) -> Result:
    """simulate() with ``run`` giving the timeline (the fast path; SimPy's ``run_plan`` in the benchmark)."""
    costs = make_cost_model(sc) if costs is None else costs
    module = SCHEDULES[sc.schedule.system]
    usage = module.memory_usage(sc)
    plan = module.build_plan(sc, costs)
    start, end = run(plan)  # the engine's timeline
    fit = check_fit(usage, sc.hardware)
    metrics = compute_metrics(sc, plan, start, end, usage, fit)
    return Result(sc, metrics, plan, start, end, usage, provenance(sc, costs, module.choices(sc)))


def provenance(sc: Scenario, costs: CostModel, choices: dict[str, str]) -> dict[str, str]:
    """What produced a result: system, implementation, hardware profile, cost model and calibration table,
    then the cost model's own notes and the choices the system made for this scenario."""
    sched = sc.schedule
    out = {
        "system": sched.system,
        "implementation": str(getattr(sched, "implementation", "n/a")),
        "profile": sc.hardware.name,
        "calibration": "none",
    }
    out.update(costs.provenance)
    out.update(choices)
    return out
