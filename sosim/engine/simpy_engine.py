"""The reference engine: SimPy runs a :class:`~sosim.engine.plan.Plan`, shared resources contended as the run unfolds.

Serial resources (a GPU stream, a copy engine, a CPU worker) each get one long-lived process walking its op
list in order (a process per op is ~5x slower); cross-resource dependencies are pre-created events. Ops that
draw on contended shared resources run through the fluid model (:mod:`sosim.engine.fluid`), which SimPy's clock
drives. ``simulate(sc, engine="simpy")`` / ``sosim run --engine simpy`` run a scenario on it;
:mod:`sosim.engine.fast` is the faster engine ``simulate()`` uses by default, held equal to this one by
``tests/test_engines.py``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import cast

import numpy as np
import simpy

from sosim.engine.fluid import Contention, EngineRun, Fluid, effective_contention, stretch_by_name
from sosim.engine.plan import Plan

# The contention model's names, importable from the engine as before (they live in sosim.engine.fluid).
__all__ = ["Contention", "EngineRun", "effective_contention", "run_plan", "run_plan_detailed"]


def run_plan(plan: Plan, contention: Contention | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Simulate ``plan``; return (start_s, end_s) arrays indexed by op id."""
    run = run_plan_detailed(plan, contention)
    return run.start_s, run.end_s


def run_plan_detailed(plan: Plan, contention: Contention | None = None) -> EngineRun:
    """Simulate ``plan`` under ``contention``; start and end of every op and where contention cost time."""
    env = simpy.Environment()
    ops = plan.ops
    done = [env.event() for _ in ops]
    start = np.zeros(len(ops))
    end = np.zeros(len(ops))
    active = effective_contention(plan, contention)
    fluid = Fluid(env, active) if active is not None else None
    # By global op id, as a plain dict (a repeated plan's RepeatedUses answers each lookup from its template).
    uses = dict(active.uses) if active is not None else {}

    def worker(op_ids: list[int]) -> Generator[simpy.Event, object, None]:
        for i in op_ids:
            op = ops[i]
            for d in op.deps:
                ev = done[d]
                if not ev.processed:
                    yield ev
            start[i] = env.now
            if fluid is not None and i in uses:
                yield cast(simpy.Event, fluid.run(i, op.duration_s, uses[i]))  # made by env: a SimPy event
            elif op.duration_s > 0.0:
                yield env.timeout(op.duration_s)
            end[i] = env.now
            done[i].succeed()

    for op_ids in plan.ops_by_resource().values():
        env.process(worker(op_ids))
    env.run()
    unfinished = [op.name for op in ops if not done[op.id].processed]
    if unfinished:
        # A plan bug (a dependency cycle through resource order), never a user error.
        raise RuntimeError(f"deadlock: {len(unfinished)} ops never ran, first: {unfinished[0]}")
    stretch = stretch_by_name(fluid.stretch, active) if fluid is not None and active is not None else {}
    return EngineRun(start, end, stretch)


