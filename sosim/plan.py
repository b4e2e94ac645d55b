"""Plan: what each serial resource does, in order, and what waits for what.

A plan is pure data built before the simulation: every op has a resolved duration, a resource whose ops
run one at a time in the order they were added, and dependencies on earlier ops (by id). Because a
dependency always points to a smaller id, id order is a topological order; :func:`list_schedule` uses that
to compute the timeline without SimPy (the test oracle for the engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Serial resources. Each is one SimPy process walking its op list.
GPU = "gpu"  # the GPU compute stream
H2D = "h2d"  # host -> device copy engine / link direction
D2H = "d2h"  # device -> host
CPU_OPT = "cpu_opt"  # CPU optimizer worker(s)
CPU_CAST = "cpu_cast"  # CPU-side dtype conversion and bookkeeping
NET = "net"  # GPU-GPU collectives (NCCL stream)
GPU_CAST = "gpu_cast"  # a side CUDA stream for dtype casts (memory bound, overlaps compute)

# Categories drive the breakdown of where the step time goes.
COMPUTE = "compute"
OPTIMIZER = "optimizer"
TRANSFER = "transfer"
CAST = "cast"
COMM = "comm"
SYNC = "sync"


@dataclass(frozen=True, slots=True)
class Op:
    id: int
    resource: str
    name: str
    duration_s: float
    deps: tuple[int, ...]
    layer: int
    iteration: int
    category: str


@dataclass
class Plan:
    ops: list[Op] = field(default_factory=list)
    # op id of the first forward op of each iteration: the steady-state step is measured between them.
    iteration_starts: list[int] = field(default_factory=list)
    # Speed factor of each link direction ("h2d", "d2h") while the other is busy (1.0 = full duplex).
    duplex_factors: dict[str, float] = field(default_factory=dict)
    # Free-form facts the schedule wants in the result (choices made, bytes moved per step, ...).
    notes: dict[str, object] = field(default_factory=dict)

    def add(
        self,
        resource: str,
        name: str,
        duration_s: float,
        deps: tuple[int, ...] | list[int] = (),
        *,
        layer: int = -1,
        iteration: int = 0,
        category: str = COMPUTE,
    ) -> int:
        if duration_s < 0:
            raise ValueError(f"op {name}: negative duration {duration_s}")
        op_id = len(self.ops)
        clean = tuple(sorted({d for d in deps if d is not None}))
        if clean and clean[-1] >= op_id:
            raise ValueError(f"op {name}: dependency on a later op")
        self.ops.append(Op(op_id, resource, name, float(duration_s), clean, layer, iteration, category))
        return op_id

    def mark_iteration_start(self, op_id: int) -> None:
        self.iteration_starts.append(op_id)

    @property
    def resources(self) -> list[str]:
        seen: dict[str, None] = {}
        for op in self.ops:
            seen.setdefault(op.resource)
        return list(seen)

    def ops_by_resource(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for op in self.ops:
            out.setdefault(op.resource, []).append(op.id)
        return out


def list_schedule(plan: Plan) -> tuple[list[float], list[float]]:
    """Start and end of every op by plain list scheduling (no SimPy, no duplex contention).

    Each op starts when its resource has finished the previous op and all its dependencies are done.
    """
    free: dict[str, float] = {}
    start = [0.0] * len(plan.ops)
    end = [0.0] * len(plan.ops)
    for op in plan.ops:
        t = free.get(op.resource, 0.0)
        for d in op.deps:
            t = max(t, end[d])
        start[op.id] = t
        end[op.id] = t + op.duration_s
        free[op.resource] = end[op.id]
    return start, end


def critical_path_s(plan: Plan) -> float:
    """Longest dependency chain, ignoring resource conflicts: a lower bound on the makespan."""
    finish = [0.0] * len(plan.ops)
    for op in plan.ops:
        finish[op.id] = max((finish[d] for d in op.deps), default=0.0) + op.duration_s
    return max(finish, default=0.0)
