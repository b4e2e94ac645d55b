"""Plan: what each serial resource does, in order, and what waits for what.

A plan is pure data built before the simulation: every op has a resolved duration, a resource whose ops
run one at a time in the order they were added, and dependencies on earlier ops (by id). Because a
dependency always points to a smaller id, id order is a topological order; :func:`list_schedule` uses that
to compute the timeline without SimPy (the test oracle for the engine).

Every op says what it is in typed fields, so that nothing downstream parses op names:

* ``resource`` (:class:`Resource`): where it runs. A resource is a *kind* (:class:`ResourceKind`: the GPU
  compute stream, a link direction, the CPU optimizer worker, ...) plus an *instance* id that tells copies
  of the same kind apart (the GPU of rank 3, the second NVMe device, the PCIe uplink of switch 1). Kinds
  are a closed enum the engine and the outputs know how to treat; instances are plain integers, so a
  machine described by profile data (n GPUs per node, m NVMe devices, k uplinks) creates as many instances
  as it has, without new code. Contract for new resources: add a kind here (with its place in
  ``TRACK_ORDER`` and, in :mod:`sosim.run.result`, the breakdown bucket its exposed time goes to); create
  instances with ``Resource(kind, i)``; a plan never needs to declare its resources up front (the engine
  starts one process per distinct resource it finds).
* ``phase`` (:class:`Phase`): which part of the training step the op belongs to (forward, backward, the
  gradient path, the optimizer step, the parameter refresh, ...): phase-level reports sum by it.
* ``category`` (:class:`Category`): what kind of work it is (compute, transfer, cast, optimizer math,
  collective, host synchronisation, framework bookkeeping): the breakdown of exposed time reads it.
* ``n_bytes``: bytes the op moves across its resource (copies, collectives, disk I/O); ``flops``: the
  floating-point operations a GPU compute op performs (hardware FLOPs, recompute included); ``group``:
  the gradient bucket or optimizer sub-group an op serves (-1 when none); ``layer`` and ``iteration``.

The ``name`` is a label for humans (traces, span tables) and is never parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ResourceKind(StrEnum):
    """Kinds of serial resources. Values are the labels used in span tables and traces."""

    GPU = "gpu"  # the GPU compute stream
    GPU_CAST = "gpu_cast"  # a side CUDA stream (dtype casts, side-stream copies' kernels)
    H2D = "h2d"  # host -> device copy engine / link direction
    D2H = "d2h"  # device -> host
    CPU_OPT = "cpu_opt"  # CPU optimizer worker(s)
    CPU_MAIN = "cpu_main"  # the training process: its host thread and the CPU work it starts (casts, copies)
    NET = "net"  # GPU-GPU collectives (NCCL stream)
    NVME_READ = "nvme_read"  # a rank's asynchronous-I/O reads from the node's NVMe volume (DeepSpeed aio handle)
    NVME_WRITE = "nvme_write"  # its writes


@dataclass(frozen=True, slots=True, order=True)
class Resource:
    """One serial resource: a kind and an instance id (rank, device, link index)."""

    kind: ResourceKind
    instance: int = 0

    @property
    def label(self) -> str:
        """``gpu`` for instance 0, ``gpu.1`` for instance 1 (the span table's ``resource`` column)."""
        return self.kind.value if self.instance == 0 else f"{self.kind.value}.{self.instance}"

    def __str__(self) -> str:
        return self.label


class Phase(StrEnum):
    """The part of a training step an op belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    GRADIENT = "gradient"  # gradients leaving the GPU: reduce, copies, casts, accumulation
    OPTIMIZER = "optimizer"  # norm, unscale/clip, the Adam update, step() bookkeeping
    REFRESH = "refresh"  # updated parameters back where the next forward reads them
    FETCH = "fetch"  # weights streamed in for use (weight-flow, ZeRO-Infinity)
    CHECKPOINT = "checkpoint"  # activation checkpoints moved out and back


class Category(StrEnum):
    """What kind of work an op is; the breakdown of exposed time is by category and resource."""

    COMPUTE = "compute"
    OPTIMIZER = "optimizer"
    TRANSFER = "transfer"
    CAST = "cast"
    COMM = "comm"
    SYNC = "sync"
    FRAMEWORK = "framework"  # host-side bookkeeping of the training framework (step() fixed part, waits)
    HOOK = "hook"  # DeepSpeed ZeRO-3's per-module hooks around each layer's pass (host thread)


# Singleton instances of each kind (one GPU, one host link): what single-GPU schedules use.
GPU = Resource(ResourceKind.GPU)
GPU_CAST = Resource(ResourceKind.GPU_CAST)
H2D = Resource(ResourceKind.H2D)
D2H = Resource(ResourceKind.D2H)
CPU_OPT = Resource(ResourceKind.CPU_OPT)
CPU_MAIN = Resource(ResourceKind.CPU_MAIN)
NET = Resource(ResourceKind.NET)
NVME_READ = Resource(ResourceKind.NVME_READ)
NVME_WRITE = Resource(ResourceKind.NVME_WRITE)

# Canonical order of resource kinds in traces and plots (GPU compute on top).
TRACK_ORDER: tuple[ResourceKind, ...] = tuple(ResourceKind)

# Old names of the categories, kept so that callers can write ``plan.COMPUTE``.
COMPUTE, OPTIMIZER, TRANSFER = Category.COMPUTE, Category.OPTIMIZER, Category.TRANSFER
CAST, COMM, SYNC, FRAMEWORK = Category.CAST, Category.COMM, Category.SYNC, Category.FRAMEWORK


# Not frozen: a frozen dataclass sets each of its 12 fields through object.__setattr__, ~5x the cost of a
# plain slot store, and plans of a search create millions of ops. Treat an op as immutable all the same
# (dataclasses.replace makes a changed copy).
@dataclass(slots=True)
class Op:
    id: int
    resource: Resource
    name: str
    duration_s: float
    deps: tuple[int, ...]
    layer: int
    iteration: int
    category: Category
    phase: Phase
    n_bytes: float = 0.0
    flops: float = 0.0
    group: int = -1


class Plan:
    """Ops in id order and the first forward op of each iteration.

    A plan made by :meth:`repeat` keeps its one-iteration :class:`Template` and makes its ``ops`` only when
    something asks for them: the fast engine and the metrics read the template and each copy's resolved
    carries directly (struct of arrays, :func:`sosim.engine.fast.list_times`), so a simulation does work in
    proportion to one iteration's ops plus one pass over all starts and ends.
    """

    __slots__ = ("_copy_deps", "_ops", "copies", "iteration_starts", "optimizer_core_share", "template")

    def __init__(self, ops: list[Op] | None = None, iteration_starts: list[int] | None = None) -> None:
        self._ops: list[Op] | None = [] if ops is None else ops
        # op id of the first forward op of each iteration: the steady-state step is measured between them.
        self.iteration_starts: list[int] = [] if iteration_starts is None else iteration_starts
        self.template: Template | None = None  # set by repeat(): the ops are ``copies`` copies of it
        self.copies = 0
        self._copy_deps: list[dict[int, tuple[int, ...]]] | None = None
        # The share of a rank's CPU threads its optimizer worker (CPU_OPT) is pinned to, the rest being the
        # training process's (CPU_MAIN); 1: no split, both take turns on every thread. Set by the system that
        # splits the cores (sosim/schedules/blocks/cpu.py split_cores); the engine's contention reads it here.
        self.optimizer_core_share = 1.0

    @property
    def ops(self) -> list[Op]:
        if self._ops is None:
            assert self.template is not None
            self._ops = _materialize(self.template, self.copies, self.copy_deps)
        return self._ops

    @property
    def repeated(self) -> bool:
        """Whether this is a repeated template whose ops are not made yet (read it through :attr:`template`,
        :attr:`copy_deps`, :meth:`ops_like` and :meth:`iteration_ops`)."""
        return self._ops is None

    @property
    def copy_deps(self) -> list[dict[int, tuple[int, ...]]]:
        """For a repeated template: per copy, the template ops whose dependencies are not their own shifted
        (those waiting for a carry slot), with their dependencies in that copy (global op ids)."""
        if self._copy_deps is None:
            assert self.template is not None
            self._copy_deps = _copy_deps(self.template, self.copies)
        return self._copy_deps

    def template_if_current(self) -> Template | None:
        """The template this plan repeats, when its ops are (still) exactly its copies (None otherwise)."""
        t = self.template
        if t is None or (self._ops is not None and len(self._ops) != len(t.ops) * self.copies):
            return None
        return t

    def ops_like(self, ids: list[int]) -> list[Op]:
        """The ops at ``ids``, for fields every copy of a template shares (resource, category, name, duration,
        bytes, flops, phase, group, layer): a repeated plan answers with its template's ops without making
        its own (their ``id``, ``deps`` and ``iteration`` are then the template's)."""
        if self._ops is None:
            assert self.template is not None
            t, m = self.template.ops, len(self.template.ops)
            return [t[i % m] for i in ids]
        ops = self.ops
        return [ops[i] for i in ids]

    def iteration_ops(self, iteration: int) -> list[Op]:
        """The ops of ``iteration`` (for a repeated plan not yet made: its template's, as :meth:`ops_like`)."""
        if self._ops is None:
            assert self.template is not None
            return self.template.ops if 0 <= iteration < self.copies else []
        return [op for op in self.ops if op.iteration == iteration]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (self.ops == other.ops and self.iteration_starts == other.iteration_starts
                and self.optimizer_core_share == other.optimizer_core_share)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"Plan({len(self.ops)} ops, iteration_starts={self.iteration_starts})"

    def __getstate__(self) -> tuple[list[Op], list[int], float]:
        return self.ops, self.iteration_starts, self.optimizer_core_share

    def __setstate__(self, state: tuple[list[Op], list[int], float]) -> None:
        self.__init__(state[0], state[1])  # type: ignore[misc]
        self.optimizer_core_share = state[2]

    @staticmethod
    def repeat(template: Template, n: int) -> Plan:
        """The run: ``n`` copies of one iteration's ``template``, each copy's carries filled from the copies
        before it (see :class:`Template`); ops of copy ``k`` have ids ``k * len(template.ops) + i`` and
        iteration ``k``."""
        plan = Plan()
        plan._ops = None
        plan.template, plan.copies = template, n
        m = len(template.ops)
        plan.iteration_starts = [s + k * m for k in range(n) for s in template.iteration_starts]
        return plan

    def add(
        self,
        resource: Resource,
        name: str,
        duration_s: float,
        deps: tuple[int, ...] | list[int] = (),
        *,
        phase: Phase,
        category: Category = Category.COMPUTE,
        layer: int = -1,
        iteration: int = 0,
        n_bytes: float = 0.0,
        flops: float = 0.0,
        group: int = -1,
    ) -> int:
        if not duration_s >= 0:  # also rejects NaN
            raise ValueError(f"op {name}: invalid duration {duration_s}")
        op_id = len(self.ops)
        clean = tuple(sorted(set(deps)))
        if clean and clean[-1] >= op_id:
            raise ValueError(f"op {name}: dependency on a later op")
        self.ops.append(Op(op_id, resource, name, float(duration_s), clean, layer, iteration, category, phase,
                           float(n_bytes), float(flops), group))
        return op_id

    def mark_iteration_start(self, op_id: int) -> None:
        self.iteration_starts.append(op_id)

    @property
    def resources(self) -> list[Resource]:
        seen: dict[Resource, None] = {}
        for op in self.ops:
            seen.setdefault(op.resource)
        return list(seen)

    def ops_by_resource(self) -> dict[Resource, list[int]]:
        """Each resource's ops in id order, resources in order of first use (the engines' worker order)."""
        return ops_by_resource(self.ops)

    @property
    def measured_iteration(self) -> int:
        """The iteration whose first forward opens the steady-state window (the second-to-last start)."""
        if self._ops is None:
            assert self.template is not None
            return self.iteration_starts[-2] // len(self.template.ops)
        return self.ops[self.iteration_starts[-2]].iteration


@dataclass
class Template:
    """One iteration of a run, with typed carries: what flows into it from earlier iterations.

    ``ops`` are the iteration's ops with ids ``0 .. len(ops) - 1``; a dependency ``d >= 0`` is an op of the
    same iteration, ``d < 0`` a *carry slot*: a stand-in for ops of an earlier iteration. Slot ``s`` of copy
    ``k`` holds what ``carry_out[s]`` names in copy ``k - lag[s]`` (op ids of that copy, or its own slots,
    passed on); before the first copies (``k < lag[s]``) it holds nothing, and a dependency on it is dropped.
    The driver's slots are the host thread's last blocking call and the compute stream's pending work (lag 1)
    and each optimizer group's gate (lag = the plan's staleness); :data:`sosim.schedules.blocks.driver.HOST_SLOT`.
    """

    ops: list[Op] = field(default_factory=list)
    iteration_starts: list[int] = field(default_factory=list)
    lag: dict[int, int] = field(default_factory=dict)  # slot -> iterations between filling and use
    carry_out: dict[int, tuple[int, ...]] = field(default_factory=dict)  # slot -> refs it is filled with


def ops_by_resource(ops: list[Op]) -> dict[Resource, list[int]]:
    """Each resource's ops (by their ids) in list order, resources in order of first use (the engines'
    worker order)."""
    out: dict[Resource, list[int]] = {}
    # By the resource object's identity first (ops share resource objects; hashing a Resource runs
    # Python code); equal but distinct objects still meet in one list through the dict.
    by_id: dict[int, list[int]] = {}
    for op in ops:
        queue = by_id.get(id(op.resource))
        if queue is None:
            queue = by_id[id(op.resource)] = out.setdefault(op.resource, [])
        queue.append(op.id)
    return out


def slots_passed_on(t: Template, slots: set[int]) -> set[int]:
    """``slots`` and every slot they are passed on from, copy to copy (a slot's carry-out may name another
    slot): what must be followed to resolve the slots ops wait for. Updates and returns ``slots``."""
    todo = list(slots)
    while todo:
        for r in t.carry_out.get(todo.pop(), ()):
            if r < 0 and r not in slots:
                slots.add(r)
                todo.append(r)
    return slots


def _copy_deps(t: Template, n: int) -> list[dict[int, tuple[int, ...]]]:
    """:attr:`Plan.copy_deps`. Every dependency on a slot is replaced by the ops the slot holds in that copy,
    and such an op's dependencies sorted again without duplicates: the ops a block would have made, had it
    been handed the earlier iteration's real op ids instead of slots (tests/test_plan_template.py)."""
    # The template ops waiting for a slot (deps are sorted: a slot, negative, comes first): their slots, and
    # their dependencies inside the iteration.
    split = [(op.id, [d for d in op.deps if d < 0], [d for d in op.deps if d >= 0])
             for op in t.ops if op.deps and op.deps[0] < 0]
    m = len(t.ops)
    # Only the slots some op waits for, and those they are passed on from, are followed copy by copy.
    needed = slots_passed_on(t, {s for _i, slots, _own in split for s in slots})
    lags = [(s, t.lag[s]) for s in sorted(needed)]
    # Per slot: the iteration's own ops it carries out (sorted, unique) and the slots it passes on.
    carry = []
    for s in sorted(needed):
        refs = t.carry_out.get(s, ())
        carry.append((s, sorted({r for r in refs if r >= 0}), [r for r in refs if r < 0]))
    out: list[dict[int, tuple[int, ...]]] = []
    # Per copy: slot -> the op ids it carries out, sorted, without duplicates.
    filled: list[dict[int, tuple[int, ...]]] = []
    for k in range(n):
        base = k * m
        held = {s: filled[k - lag][s] if k >= lag else () for s, lag in lags}
        # What a slot passes on comes from earlier copies (lag >= 1): those ids are below ``base``, so the
        # sorted union is the passed-on ids sorted, then the copy's own shifted (already sorted).
        now: dict[int, tuple[int, ...]] = {}
        for s, own_refs, passes in carry:
            shifted = [r + base for r in own_refs]
            if not passes:
                now[s] = tuple(shifted)
            elif len(passes) == 1:
                now[s] = (*held[passes[0]], *shifted)
            else:
                now[s] = (*sorted({x for r in passes for x in held[r]}), *shifted)
        filled.append(now)
        copy: dict[int, tuple[int, ...]] = {}
        for i, slots, own in split:
            earlier = held[slots[0]] if len(slots) == 1 else sorted({x for s in slots for x in held[s]})
            copy[i] = (*earlier, *[d + base for d in own]) if own else tuple(earlier)
        out.append(copy)
    return out


def _materialize(t: Template, n: int, copy_deps: list[dict[int, tuple[int, ...]]]) -> list[Op]:
    """The ops of ``n`` copies of ``t``: shifted ids and dependencies, the slots resolved per copy."""
    m = len(t.ops)
    special = copy_deps[0]
    # The first copy is the template itself wherever an op waits for no slot (same ids, iteration 0; ops are
    # never changed in place).
    ops = [op if op.id not in special else Op(op.id, op.resource, op.name, op.duration_s, special[op.id],
                                                op.layer, 0, op.category, op.phase, op.n_bytes, op.flops, op.group)
           for op in t.ops]
    for k in range(1, n):
        base = k * m
        special = copy_deps[k]
        for op in t.ops:
            new = special.get(op.id)
            if new is None:
                deps = op.deps
                new = deps if not deps else (deps[0] + base,) if len(deps) == 1 else tuple([d + base for d in deps])
            ops.append(Op(op.id + base, op.resource, op.name, op.duration_s, new, op.layer, k, op.category,
                          op.phase, op.n_bytes, op.flops, op.group))
    return ops


def list_schedule(plan: Plan) -> tuple[list[float], list[float]]:
    """Start and end of every op by plain list scheduling (no SimPy, no duplex contention).

    Each op starts when its resource has finished the previous op and all its dependencies are done.
    """
    free: dict[Resource, float] = {}
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
