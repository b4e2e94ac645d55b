"""The step driver: one training step composed from blocks, the same loop for every offload system.

A system is a :class:`Recipe`: a layout (what is moved and updated as one piece) and one block per job:

* ``weights`` (:mod:`sosim.schedules.blocks.weights`): where the bf16 weights live and what a unit's compute waits
  for before it can run (resident in HBM, streamed from host memory; an all-gather across ranks);
* ``hooks``: host-side framework work around each layer that the GPU waits for when it is longer than the
  layer (DeepSpeed's ZeRO-3 hooks), or none;
* ``grads`` (:mod:`sosim.schedules.blocks.gradients`): how gradients leave the GPU during backward, flush by flush,
  and when each optimizer group's gradients are complete on the host;
* ``step`` (:mod:`sosim.schedules.blocks.steps`): when and where each group is updated, and how the updated
  parameters return (the parameter refresh is a block the step is built with);
* ``activations``: activation checkpoints kept in host memory (weight-flow), or on the GPU.

The driver builds one iteration (its micro-batches: forward over the units, backward in reverse calling the
gradient path after each unit, then the step) as a :class:`~sosim.engine.plan.Template` whose ties to earlier
iterations are typed carry slots, and repeats it (:meth:`~sosim.engine.plan.Plan.repeat`): a unit's first forward
waits for the groups holding its parameters (``staleness`` iterations back: 1, or 2 with delayed parameter
update), GPU work for the host thread's last blocking call and the compute stream's queue. Blocks keep no
other state from one iteration to the next (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sosim.engine.plan import COMPUTE, GPU, NET, SYNC, Category, Op, Phase, Plan, Resource, Template
from sosim.hardware.machine import zero_group

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario
    from sosim.schedules.blocks.cpu import CpuPlan
    from sosim.schedules.blocks.layout import Group, Layout, Unit


@dataclass
class Ctx:
    """What the blocks share while one plan is built."""

    sc: Scenario
    costs: Costs
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


# --- one iteration as a template, repeated ---------------------------------------------------------------------
# What flows from one iteration into the next (the typed carries of sosim.engine.plan.Template): the training process's
# last blocking call (GPU work issued later waits for it), the work queued on the compute stream before the next
# compute op, and what each optimizer group's next use waits for (its update and refresh, ``staleness``
# iterations back). Each is a negative op id, a slot, while the template is built; everything else a block
# keeps is built afresh in every iteration (tests/test_plan_template.py holds the repeated template equal to
# the iterations built one after another, on every shipped scenario and a sample of others).
HOST_SLOT = -1
GATE_SLOT = -2


def group_slot(group: int) -> int:
    """The carry slot of an optimizer group's gate."""
    return -3 - group


def build(ctx: Ctx, r: Recipe) -> Plan:
    """Every iteration of ``ctx.sc`` through the blocks of ``r``: one iteration built as a template, repeated."""
    plan = Plan.repeat(build_template(ctx, r), ctx.sc.training.iterations + r.warmup_iterations)
    plan.optimizer_core_share = r.cpu.core_share
    return plan


def build_template(ctx: Ctx, r: Recipe) -> Template:
    """One iteration, built on slots where earlier iterations' ops would be (:class:`sosim.engine.plan.Template`)."""
    groups = sorted({g for gs in r.layout.unit_groups.values() for g in gs})
    ctx.host_issue, ctx.compute_gate = HOST_SLOT, [GATE_SLOT]
    ready = run_iteration(ctx, r, {g: [group_slot(g)] for g in groups})
    carry_out = {HOST_SLOT: () if ctx.host_issue is None else (ctx.host_issue,), GATE_SLOT: tuple(ctx.compute_gate)}
    lag = {HOST_SLOT: 1, GATE_SLOT: 1}
    for g in groups:
        carry_out[group_slot(g)] = tuple(ready.get(g, ()))
        lag[group_slot(g)] = r.staleness
    return Template(ctx.plan.ops, ctx.plan.iteration_starts, lag, carry_out)


def run_iteration(ctx: Ctx, r: Recipe, gates: dict[int, list[int]]) -> dict[int, list[int]]:
    """Iteration ``ctx.it`` through the blocks: the micro-batches' forward and backward, then the step.

    ``gates``: what each group's first use waits for (its update ``staleness`` iterations back). Returns what
    the next use of each group waits for after this iteration's step. ``ctx.host_issue`` and
    ``ctx.compute_gate`` flow in and out."""
    sc = ctx.sc
    units = r.layout.units
    backward_order = units[::-1]
    unit_groups = r.layout.unit_groups
    forward, backward = Phase.FORWARD, Phase.BACKWARD
    # The blocks' methods, looked up once (this loop runs once per unit, pass and micro-batch).
    before_use, around = r.weights.before_use, r.hooks.around
    after_forward, before_backward = r.activations.after_forward, r.activations.before_backward
    after_backward = r.grads.after_backward
    # Blocks that add nothing (no hooks, activations kept on the GPU) are not called at all.
    hooks = type(r.hooks) is not NoHooks
    # A weight source may say that it adds nothing for this plan (weights resident on one rank).
    adds_nothing = getattr(r.weights, "adds_nothing", None)
    weights = not (adds_nothing is not None and adds_nothing(ctx))
    activations = type(r.activations) is not ActivationsOnGpu
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
    return r.step.run(ctx, done.arrivals, backward_end)


@dataclass
class _Arrivals:
    """Records when each group's gradients are on the host and tells the step block at once."""

    step: StepBlock
    arrivals: dict[int, int] = field(default_factory=dict)

    def __call__(self, ctx: Ctx, group: Group, arrival: int) -> None:
        self.arrivals[group.index] = arrival
        self.step.on_done(ctx, group, arrival)


def plan_for(sc: Scenario, costs: Costs, recipe: Recipe) -> Plan:
    """The plan of ``sc`` built from ``recipe``'s blocks. ``costs`` remembers its own answers (the cost object,
    sosim/costs/model.py): iterations and groups of the same size ask it the same questions."""
    return build(Ctx(sc, costs, Plan(), recipe.layout, recipe.cpu), recipe)

