"""The step driver: one training step composed from blocks, the same loop for every offload system.

A system is a :class:`Recipe`: a layout (what is moved and updated as one piece) and one block per job:

* ``weights`` (:mod:`sosim.schedules.weights`): where the bf16 weights live and what a unit's compute waits
  for before it can run (resident in HBM, streamed from host memory; an all-gather across ranks);
* ``hooks``: host-side framework work around each layer that the GPU waits for when it is longer than the
  layer (DeepSpeed's ZeRO-3 hooks), or none;
* ``grads`` (:mod:`sosim.schedules.gradients`): how gradients leave the GPU during backward, flush by flush,
  and when each optimizer group's gradients are complete on the host;
* ``step`` (:mod:`sosim.schedules.steps`): when and where each group is updated, and how the updated
  parameters return (the parameter refresh is a block the step is built with);
* ``activations``: activation checkpoints kept in host memory (weight-flow), or on the GPU.

The driver walks iterations and micro-batches: forward over the units, backward in reverse (calling the
gradient path after each unit), then the step. The next iteration's forward of a unit waits for the groups
holding its parameters (``staleness`` iterations back: 1, or 2 with delayed parameter update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import FunctionType, MethodType
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import BaseModel

from sosim.machine import Machine, zero_group
from sosim.plan import COMPUTE, GPU, NET, SYNC, Category, Op, Phase, Plan, Resource, ResourceKind

if TYPE_CHECKING:
    from sosim.config import Scenario
    from sosim.costs import CostModel
    from sosim.schedules.cpu import CpuPlan
    from sosim.schedules.layout import Group, Layout, Unit


@dataclass
class Ctx:
    """What the blocks share while one plan is built."""

    sc: Scenario
    costs: CostModel
    plan: Plan
    layout: Layout
    cpu: CpuPlan
    it: int = 0
    micro: int = 0
    boundary: bool = True  # the last micro-batch of the step: gradients are final
    # The last blocking call of the training process's host thread: GPU work issued later waits for it.
    host_issue: int | None = None
    # Extra dependencies of the next GPU compute op (work queued before it on the compute stream).
    compute_gate: list[int] = field(default_factory=list)
    # GPU compute ops of this micro-batch, in order (weight streaming's buffer window reads it).
    computed: list[int] = field(default_factory=list)

    dp: int = 1  # data-parallel ranks (set from the scenario)
    ops: list[Op] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.dp = zero_group(self.sc)
        self.ops = self.plan.ops  # the plan's op list (read by every add)

    # The arguments after ``deps`` may be given by position (the driver's own calls do: a keyword argument
    # costs a lookup per call, and this is called once per op).
    def add(self, resource: Resource, name: str, duration_s: float, deps: Sequence[int | None],
            phase: Phase, category: Category, layer: int = -1, n_bytes: float = 0.0, flops: float = 0.0,
            group: int = -1) -> int:
        # Plan.add's checks, inlined: this is the hot path of plan building.
        ops = self.ops
        op_id = len(ops)
        # Dependencies sorted, without duplicates or None. One or two are the common cases: done without a set.
        n = len(deps)
        if n == 0:
            clean: tuple[int, ...] = ()
        elif n == 1:
            first = deps[0]
            clean = () if first is None else (first,)
        elif n == 2:
            a, b = deps
            if a is None or a == b:
                clean = () if b is None else (b,)
            elif b is None:
                clean = (a,)
            else:
                clean = (a, b) if a < b else (b, a)
        else:
            unique: set[Any] = set(deps)
            unique.discard(None)
            clean = tuple(sorted(unique))
        if not duration_s >= 0 or (clean and clean[-1] >= op_id):
            return self.plan.add(resource, name, duration_s, clean, phase=phase)  # raises the error
        ops.append(Op(op_id, resource, name, float(duration_s), clean, layer, self.it, category, phase,
                      float(n_bytes), float(flops), group))
        return op_id

    def host_op(self, name: str, duration_s: float, deps: Sequence[int | None], phase: Phase,
                category: Category = SYNC, layer: int = -1, group: int = -1) -> int:
        """A blocking call of the training process's host thread: kernels issued after it wait for it."""
        op = self.add(self.cpu.host, name, duration_s, [*deps, self.host_issue], phase, category, layer, 0.0, 0.0,
                      group)
        self.host_issue = op
        return op

    def gpu_op(self, name: str, duration_s: float, deps: Sequence[int | None], phase: Phase,
               category: Category, layer: int = -1, flops: float = 0.0, group: int = -1) -> int:
        """Work on the compute stream: after the host issued it and after what the stream holds before it."""
        gate = self.compute_gate
        if gate:
            self.compute_gate = []
            return self.add(GPU, name, duration_s, [*deps, self.host_issue, *gate], phase, category, layer, 0.0,
                            flops, group)
        return self.add(GPU, name, duration_s, [*deps, self.host_issue], phase, category, layer, 0.0, flops, group)


@dataclass
class Stream:
    """A CUDA stream: its work runs in issue order, whichever engine (copy engine, kernels) executes it."""

    last: int | None = None

    def add(self, ctx: Ctx, resource: Resource, name: str, duration_s: float, deps: Sequence[int | None],
            phase: Phase, category: Category, layer: int = -1, n_bytes: float = 0.0, group: int = -1) -> int:
        self.last = ctx.add(resource, name, duration_s, [*deps, self.last], phase, category, layer, n_bytes, 0.0,
                            group)
        return self.last


# --- block protocols -----------------------------------------------------------------------------------------
class WeightSource(Protocol):
    """Where the bf16 weights live; what a unit's compute waits for before it can read them."""

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]: ...


class Hooks(Protocol):
    """Host-side framework work around each unit's forward and backward."""

    def around(self, ctx: Ctx, u: Unit, phase: Phase) -> None: ...


class Activations(Protocol):
    """Where activation checkpoints wait between forward and backward."""

    def after_forward(self, ctx: Ctx, u: Unit, op: int) -> None: ...
    def before_backward(self, ctx: Ctx, u: Unit) -> list[int]: ...


class GradientPath(Protocol):
    """Gradients leaving the GPU during backward; reports each group once its gradients are on the host."""

    def start(self, ctx: Ctx) -> None: ...
    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None: ...
    def finish(self, ctx: Ctx, done: DoneCallback) -> None: ...


class DoneCallback(Protocol):
    def __call__(self, ctx: Ctx, group: Group, arrival: int) -> None: ...


class StepBlock(Protocol):
    """The optimizer step: updates every group and returns what the next use of each group waits for."""

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None: ...
    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]: ...


# --- trivial blocks --------------------------------------------------------------------------------------------
class NoHooks:
    def around(self, ctx: Ctx, u: Unit, phase: Phase) -> None:
        del ctx, u, phase


class ActivationsOnGpu:
    def after_forward(self, ctx: Ctx, u: Unit, op: int) -> None:
        del ctx, u, op

    def before_backward(self, ctx: Ctx, u: Unit) -> list[int]:
        del ctx, u
        return []


@dataclass(frozen=True)
class Recipe:
    """A system, as blocks."""

    layout: Layout
    cpu: CpuPlan
    weights: WeightSource
    grads: GradientPath
    step: StepBlock
    hooks: Hooks = field(default_factory=NoHooks)
    activations: Activations = field(default_factory=ActivationsOnGpu)
    # Iterations between an update and the forward that uses it (2: delayed parameter update).
    staleness: int = 1
    # Extra iterations simulated before the timeline is periodic (DPU's one-step staleness needs 2).
    warmup_iterations: int = 0


def pass_op(ctx: Ctx, u: Unit, phase: Phase, deps: Sequence[int]) -> int:
    """One unit's forward or backward on the GPU, preceded by its Ulysses all-to-all if any.

    The all-to-all of Q/K/V (and of the attention output) sits on the critical path: attention cannot
    start before every rank holds its heads for the whole sequence, so the compute op depends on it.
    """
    forward = phase is Phase.FORWARD
    tag = "fwd" if forward else "bwd"
    if u.a2a_s > 0:
        # It exchanges this layer's activations, which the previous compute op produces: it cannot run ahead
        # of it (it sits inside the layer: projection, all-to-all, attention, all-to-all, projection).
        deps = [ctx.add(NET, f"all_to_all_{tag}:{u.name}", u.a2a_s, [*deps, *ctx.computed[-1:]], phase,
                        Category.COMM, u.index, u.a2a_bytes)]
    if forward:
        duration, flops, name = u.fwd_s, u.fwd_flops, u.pass_names[0]
    else:
        duration, flops, name = u.bwd_s, u.bwd_flops, u.pass_names[1]
    # ctx.gpu_op, inlined (once per unit and pass).
    gate = ctx.compute_gate
    if gate:
        ctx.compute_gate = []
        op = ctx.add(GPU, name, duration, [*deps, ctx.host_issue, *gate], phase, COMPUTE, u.index, 0.0, flops)
    else:
        op = ctx.add(GPU, name, duration, [*deps, ctx.host_issue], phase, COMPUTE, u.index, 0.0, flops)
    ctx.computed.append(op)
    return op


def build(ctx: Ctx, r: Recipe, replicate: bool = True) -> Plan:
    """Every iteration of ``ctx.sc`` through the blocks of ``r``; returns the finished plan.

    ``replicate``: once an iteration has been built whose end state is its start state with every op id
    moved by the iteration's op count (see :func:`_replicate`), the remaining iterations are that
    iteration's ops copied with shifted ids instead of being built again (the same ops, bit for bit).
    """
    sc = ctx.sc
    units = r.layout.units
    backward_order = units[::-1]
    unit_groups = r.layout.unit_groups
    forward, backward = Phase.FORWARD, Phase.BACKWARD
    # The blocks' methods, looked up once (this loop runs once per unit, pass, micro-batch and iteration).
    before_use, around = r.weights.before_use, r.hooks.around
    after_forward, before_backward = r.activations.after_forward, r.activations.before_backward
    after_backward = r.grads.after_backward
    # Blocks that add nothing (no hooks, activations kept on the GPU) are not called at all.
    hooks = type(r.hooks) is not NoHooks
    # A weight source may say that it adds nothing for this plan (weights resident on one rank).
    adds_nothing = getattr(r.weights, "adds_nothing", None)
    weights = not (adds_nothing is not None and adds_nothing(ctx))
    activations = type(r.activations) is not ActivationsOnGpu
    ready: dict[int, dict[int, list[int]]] = {}  # iteration -> group -> ops its next use waits for
    iterations = sc.training.iterations + r.warmup_iterations
    previous: list[object] | None = None  # the start state of the previous iteration (see _state)
    begin = 0  # its first op
    for it in range(iterations):
        if replicate and it >= 1:
            state = _state(ctx, r, ready, it)
            if previous is not None and state is not None and _replicate(ctx.plan, begin, previous, state, it,
                                                                         iterations):
                return ctx.plan
            previous, begin = state, len(ctx.ops)
        ctx.it = it
        gates = ready.get(it - r.staleness, {})
        done = _Arrivals(r.step)
        backward_end = -1
        for micro in range(sc.training.grad_accum):
            ctx.micro, ctx.boundary = micro, micro == sc.training.grad_accum - 1
            ctx.computed = []
            for u in units:
                deps = before_use(ctx, u, forward) if weights else []
                if micro == 0:
                    deps += [d for g in unit_groups.get(u.index, ()) for d in gates.get(g, [])]
                if hooks:
                    around(ctx, u, forward)
                op = pass_op(ctx, u, forward, deps)
                if micro == 0 and u.index == 0:
                    ctx.plan.mark_iteration_start(op)
                if activations:
                    after_forward(ctx, u, op)
            r.grads.start(ctx)
            for u in backward_order:
                deps = before_use(ctx, u, backward) if weights else []
                if activations:
                    deps = deps + before_backward(ctx, u)
                if hooks:
                    around(ctx, u, backward)
                backward_end = pass_op(ctx, u, backward, deps)
                after_backward(ctx, u, backward_end, done)
            r.grads.finish(ctx, done)
        ready[it] = r.step.run(ctx, done.arrivals, backward_end)
    return ctx.plan


# --- replicating a periodic iteration ------------------------------------------------------------------------
# Why it is exact. Building iteration k reads only its start state S_k -- the context's op references
# (host_issue, compute_gate, computed), the groups' gates of earlier iterations, and whatever the blocks keep
# between calls -- and the scenario, layout and cost model, which do not change while a plan is built (the
# cost model is a pure function, and no block reads ``ctx.it`` or the plan's ops). Op ids enter the blocks only
# as references: they are stored, compared, sorted and passed as dependencies, never computed with. So
# building from S + d (every op id of S moved by d) on a plan d ops longer gives the same ops with every id
# and dependency moved by d, and ends in the end state moved by d. If the state after iteration k is its
# start state moved by D (the number of ops of iteration k), iteration k + 1 is iteration k moved by D, its
# end state is moved by D again, and so on: every later iteration is a copy. The check is on the whole
# state, leaf by leaf: an int either moves by exactly D (an op id) or stays (a constant, such as a group
# index), and an int that stays must not be an op that iteration k depends on (a reference that did not
# move would be copied as one that did). Anything the walk cannot read (an unknown object type) means no copy.
_LEAF = (float, str, bool, type(None), Enum)
_CONFIG = (BaseModel, Machine, Resource)


def _state(ctx: Ctx, r: Recipe, ready: dict[int, dict[int, list[int]]], it: int) -> list[object] | None:
    """The start state of iteration ``it`` as a flat list of leaves and shape markers (None: unreadable)."""
    out: list[object] = []
    fixed = {id(ctx.sc), id(ctx.costs), id(ctx.plan), id(ctx.layout), id(ctx.cpu), id(ctx.ops), id(ctx)}
    for name, value in vars(ctx).items():
        if name != "it" and id(value) not in fixed:
            out.append(name)
            if not _walk(value, out, fixed):
                return None
    out.append("ready")
    if not _walk([ready.get(k) for k in range(it - r.staleness, it)], out, fixed):
        return None
    for block in (r.weights, r.hooks, r.activations, r.grads, r.step):
        out.append(type(block))
        if not _walk(block, out, fixed):
            return None
    return out


def _walk(value: object, out: list[object], fixed: set[int]) -> bool:
    """Append ``value``'s leaves to ``out``; False if it holds something this walk cannot read."""
    cls = type(value)
    if cls is int:
        out.append(value)
        return True
    if cls is list or cls is tuple:
        # Lists of op ids are most of the state (the groups' gates): their ints without a call each.
        out.append((cls, len(value)))  # type: ignore[arg-type]
        for v in value:  # type: ignore[attr-defined]
            if type(v) is int:
                out.append(v)
            elif not _walk(v, out, fixed):
                return False
        return True
    if cls is dict:
        out.append((dict, len(value)))  # type: ignore[arg-type]
        for k, v in value.items():  # type: ignore[attr-defined]
            if type(k) is int:
                out.append(k)
            elif not _walk(k, out, fixed):
                return False
            if type(v) is int:
                out.append(v)
            elif not _walk(v, out, fixed):
                return False
        return True
    if cls is float or cls is str or value is None or isinstance(value, _LEAF):  # the common leaves first
        out.append((value,))  # a constant leaf: compared as is
        return True
    if id(value) in fixed or isinstance(value, _CONFIG):
        # Configuration, immutable while a plan is built: the same object in both states is the same value.
        out.append(("obj", id(value)))
        return True
    if isinstance(value, (list, tuple, dict)):  # subclasses (named tuples, ...): walked like their base
        return _walk(dict(value) if isinstance(value, dict) else list(value), out, fixed)
    if isinstance(value, MethodType):
        out.append(MethodType)
        return _walk(value.__self__, out, fixed) and _walk(value.__func__, out, fixed)
    if isinstance(value, FunctionType):
        out.append(("fn", id(value.__code__)))
        cells = value.__closure__ or ()
        return all(_walk(c.cell_contents, out, fixed) for c in cells)
    if isinstance(value, type):
        return False
    if hasattr(value, "__dict__"):
        out.append(cls)
        return _walk(vars(value), out, fixed)
    slots = getattr(cls, "__slots__", None)
    if slots is not None:
        out.append(cls)
        return all(_walk(getattr(value, name, None), out, fixed) for name in slots)
    return False


def _replicate(plan: Plan, lo: int, before: list[object], after: list[object], it: int, iterations: int) -> bool:
    """If ``after`` (the state after iteration ``it - 1``, whose ops start at ``lo``) is ``before`` (its start
    state) with every op id moved by the iteration's op count, append iterations ``it`` .. ``iterations - 1``
    as copies of it and return True."""
    ops = plan.ops
    shift = len(ops) - lo
    if len(before) != len(after) or shift <= 0:
        return False
    moved: set[int] = set()
    for a, b in zip(before, after):
        if type(a) is int:
            if type(b) is not int:
                return False
            if b == a + shift:
                moved.add(a)
            elif b != a:
                return False
        elif a != b:
            return False
    src = ops[lo:]
    # Every op before the iteration that it depends on must be one the state refers to by a moving reference
    # (an id kept in some object the walk does not read, or a reference that stays, would be copied wrongly).
    # Dependencies are sorted: only an op whose first one is older can have any.
    for op in src:
        deps = op.deps
        if deps and deps[0] < lo and any(x < lo and x not in moved for x in deps):
            return False
    last_it = it - 1
    own_starts = [s for s in plan.iteration_starts if s >= lo]
    for k in range(it, iterations):
        d = (k - last_it) * shift
        # One dependency is the common case: its tuple without a list.
        ops.extend([Op(op.id + d, op.resource, op.name, op.duration_s,
                       (op.deps[0] + d,) if len(op.deps) == 1 else tuple([x + d for x in op.deps]), op.layer, k,
                       op.category, op.phase, op.n_bytes, op.flops, op.group) for op in src])
        plan.iteration_starts.extend(s + d for s in own_starts)
    return True


@dataclass
class _Arrivals:
    """Records when each group's gradients are on the host and tells the step block at once."""

    step: StepBlock
    arrivals: dict[int, int] = field(default_factory=dict)

    def __call__(self, ctx: Ctx, group: Group, arrival: int) -> None:
        self.arrivals[group.index] = arrival
        self.step.on_done(ctx, group, arrival)


def plan_for(sc: Scenario, costs: CostModel, recipe: Recipe) -> Plan:
    """The plan of ``sc`` built from ``recipe``'s blocks."""
    duplex = {ResourceKind(k): f for k, f in costs.duplex_factors.items()}
    memo = cast("CostModel", _MemoCosts(costs))
    return build(Ctx(sc, memo, Plan(duplex_factors=duplex), recipe.layout, recipe.cpu), recipe)


class _MemoCosts:
    """The cost model with every call remembered for the build of one plan: iterations and groups of the
    same size ask the same questions, and a cost (an interpolation, a table lookup) is a pure function."""

    def __init__(self, costs: CostModel) -> None:
        self._costs = costs
        self._memo: dict[str, dict[object, object]] = {}  # method name -> arguments -> value

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._costs, name)
        if not callable(attr):
            return attr
        # One memo per method (keyed by the arguments alone: no name to hash with them on every call).
        memo: dict[object, object] = {}
        self._memo[name] = memo

        def call(*args: object, **kwargs: object) -> object:
            key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
            try:
                return memo[key]  # one lookup when remembered (most calls)
            except KeyError:
                value = memo[key] = attr(*args, **kwargs)
                return value

        setattr(self, name, call)
        return call
