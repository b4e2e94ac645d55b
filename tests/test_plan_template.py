"""A plan is one iteration built as a template with typed carries and repeated (``Plan.repeat``,
sosim/schedules/blocks/driver.py ``build_template``): the repeated plan equals the plan built iteration by iteration
through the same blocks, op for op, on every shipped scenario (3 and 5 iterations) and a hypothesis sample of
others; and a hand-made template shows what the carries do."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sosim import load_scenario
from sosim.engine import fast as engine_fast
from sosim.engine.plan import GPU, H2D, Category, Op, Phase, Plan, Template
from sosim.hardware.machine import Machine
from sosim.inputs.config import Scenario
from sosim.inputs.errors import SosimError
from sosim.run.simulate import make_cost_model
from sosim.schedules.blocks import driver
from sosim.schedules.blocks.driver import Ctx, Recipe
from sosim.schedules.registry import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
F = Phase.FORWARD


def unrolled(ctx: Ctx, r: Recipe) -> Plan:
    """The oracle: every iteration built through the blocks in turn, each handed the real op ids of the
    iterations before it (what the driver did before templates)."""
    ready: dict[int, dict[int, list[int]]] = {}
    for it in range(ctx.sc.training.iterations + r.warmup_iterations):
        ctx.it = it
        ready[it] = driver.run_iteration(ctx, r, ready.get(it - r.staleness, {}))
    return ctx.plan


def built(sc: Scenario, monkeypatch: pytest.MonkeyPatch, oracle: bool) -> Plan:
    with monkeypatch.context() as m:
        if oracle:
            m.setattr(driver, "build", unrolled)
        return SYSTEMS[sc.schedule.system].build_plan(sc, make_cost_model(sc), Machine.from_scenario(sc))


def assert_same_plan(sc: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = built(sc, monkeypatch, False), built(sc, monkeypatch, True)
    # The fast engine's list schedule of the repeated template (read as arrays, each carry slot as the latest
    # end it holds) is that of the plan built in turn, float for float.
    assert a.repeated and engine_fast.list_times(a) == engine_fast.list_times(b)
    assert len(a.ops) == len(b.ops)
    assert a.ops == b.ops  # every field: id, resource, name, duration, deps, layer, iteration, ...
    assert a.iteration_starts == b.iteration_starts


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
@pytest.mark.parametrize("iterations", [3, 5])
def test_repeated_template_equals_iterations_built_in_turn(path: Path, iterations: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same_plan(load_scenario(path, [f"training.iterations={iterations}"]), monkeypatch)


_BASES = [p for p in SCENARIOS if not any(s in p.stem for s in ("1m", "x1024"))]


@st.composite
def scenario_overrides(draw: st.DrawFn) -> tuple[Path, list[str]]:
    path = draw(st.sampled_from(_BASES))
    overrides = [f"model.layers={draw(st.integers(1, 6))}", f"training.iterations={draw(st.integers(3, 5))}",
                 f"training.grad_accum={draw(st.integers(1, 3))}"]
    if draw(st.booleans()):
        overrides.append(f"schedule.bucket_mb={draw(st.sampled_from([16, 64, 200, 1000]))}")
    if draw(st.booleans()):
        overrides.append(f"schedule.implementation={draw(st.sampled_from(['ideal', 'deepspeed']))}")
    for knob, values in (("schedule.dpu", [True, False]), ("schedule.gpu_optimizer_fraction", [0.0, 0.25, 0.5]),
                         ("training.gradient_clipping", [0.0, 1.0]), ("schedule.offload_checkpoints", [True])):
        if draw(st.booleans()):
            overrides.append(f"{knob}={draw(st.sampled_from(values))}")
    return path, overrides


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=scenario_overrides())
def test_repeated_template_equals_built_iterations_on_a_sample(case: tuple[Path, list[str]],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path, overrides = case
    try:
        sc = load_scenario(path, overrides)
    except SosimError:
        assume(False)  # a knob the system does not have
        return
    assert_same_plan(sc, monkeypatch)


def _op(i: int, deps: tuple[int, ...], resource: object = GPU) -> Op:
    return Op(i, resource, f"op{i}", 1.0, deps, -1, 0, Category.COMPUTE, F)  # type: ignore[arg-type]


def test_carries_by_hand() -> None:
    """Two ops a copy: 0 waits for slot -1 (lag 1, filled with op 1) and slot -2 (lag 2, filled with op 0),
    1 waits for 0 and slot -1 again. Copy 0 has nothing to wait for; copy 1 waits for copy 0's op 1; copy 2
    for copy 1's op 1 and copy 0's op 0."""
    t = Template([_op(0, (-2, -1)), _op(1, (-1, 0), H2D)], [0], {-1: 1, -2: 2}, {-1: (1,), -2: (0,)})
    plan = Plan.repeat(t, 3)
    assert [op.deps for op in plan.ops] == [(), (0,), (1,), (1, 2), (0, 3), (3, 4)]
    assert [op.iteration for op in plan.ops] == [0, 0, 1, 1, 2, 2]
    assert plan.iteration_starts == [0, 2, 4]


def test_a_slot_passed_on_reaches_the_iteration_that_filled_it() -> None:
    """An iteration that makes no new host call passes the host slot on: the next one waits for the call two
    iterations back."""
    t = Template([_op(0, (-1,))], [0], {-1: 1}, {-1: (-1,)})
    assert [op.deps for op in Plan.repeat(t, 3).ops] == [(), (), ()]
    t = Template([_op(0, (-1,)), _op(1, (-1,))], [0], {-1: 1}, {-1: (-1,)})
    assert [op.deps for op in Plan.repeat(t, 2).ops] == [(), (), (), ()]


def test_simulate_reads_the_template_without_making_the_ops() -> None:
    """A single-GPU GH200 run on the spec-sheet C2C (nothing can contend: 450 + 450 <= 900 GB/s): the fast
    engine and the metrics read the repeated template as arrays; the run's ops are made only when asked for
    (the spans), and are then the same timeline's. (On the published copy rates its link contends, and the
    event loop needs the ops: tests/test_engines.py.)"""
    from sosim import simulate
    from sosim.engine.fast import list_times

    spec_c2c = ["hardware.link.h2d_GBps=450", "hardware.link.d2h_GBps=450", "hardware.link.bidir_GBps=900"]
    result = simulate(load_scenario("gh200_superoffload_8b", ["model.layers=4", *spec_c2c]))
    assert result.plan.repeated
    start, end = list_times(result.plan)
    made = Plan(list(result.plan.ops), list(result.plan.iteration_starts))
    assert not result.plan.repeated and not made.repeated
    assert list_times(made) == (start, end) == (result.start_s.tolist(), result.end_s.tolist())
