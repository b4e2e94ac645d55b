"""SimPy execution of a :class:`~sosim.plan.Plan`.

One long-lived process per serial resource walks that resource's op list (a process per op is ~5x slower);
cross-resource dependencies are pre-created events. The only dynamic behaviour is duplex contention on
the host link: a copy that starts while the opposite direction is busy runs at
``plan.duplex_factors[direction]`` of its speed for its whole length (a first-order model of a link whose
bidirectional total is below the sum of its directions). Without contention the result equals
:func:`sosim.plan.list_schedule`.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import simpy

from sosim.plan import Plan, Resource, ResourceKind

_OPPOSITE = {ResourceKind.H2D: ResourceKind.D2H, ResourceKind.D2H: ResourceKind.H2D}


def run_plan(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Simulate ``plan``; return (start_s, end_s) arrays indexed by op id."""
    env = simpy.Environment()
    ops = plan.ops
    done = [env.event() for _ in ops]
    start = np.zeros(len(ops))
    end = np.zeros(len(ops))
    # Busy flags per link direction and instance: a direction slows while the opposite one of the same link
    # (same instance id) is busy.
    busy: dict[Resource, bool] = {}
    factors = {k: f for k, f in plan.duplex_factors.items() if f < 1.0}

    def worker(resource: Resource, op_ids: list[int]) -> Generator[simpy.Event, object, None]:
        opposite_kind = _OPPOSITE.get(resource.kind) if factors else None
        opposite = Resource(opposite_kind, resource.instance) if opposite_kind is not None else None
        factor = factors.get(resource.kind, 1.0)
        for i in op_ids:
            op = ops[i]
            for d in op.deps:
                ev = done[d]
                if not ev.processed:
                    yield ev
            duration = op.duration_s
            if opposite is not None:
                if busy.get(opposite, False):
                    duration /= factor
                busy[resource] = True
            start[i] = env.now
            if duration > 0.0:
                yield env.timeout(duration)
            end[i] = env.now
            if opposite is not None:
                busy[resource] = False
            done[i].succeed()

    for resource, op_ids in plan.ops_by_resource().items():
        env.process(worker(resource, op_ids))
    env.run()
    unfinished = [op.name for op in ops if not done[op.id].processed]
    if unfinished:
        # A plan bug (a dependency cycle through resource order), never a user error.
        raise RuntimeError(f"deadlock: {len(unfinished)} ops never ran, first: {unfinished[0]}")
    return start, end
