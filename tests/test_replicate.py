"""Plan building copies a periodic iteration instead of building it again (sosim/schedules/driver.py,
``_replicate``): the copied plan equals the plan built iteration by iteration, op for op, on every shipped
scenario; the copy is really taken there; and blocks whose state does not move with the op ids (a counter,
a reference that stays) are built in full."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from sosim import load_scenario
from sosim.config import Scenario
from sosim.plan import GPU, Category, Phase, Plan
from sosim.schedules import SCHEDULES, driver, superoffload
from sosim.schedules.driver import Ctx, Recipe, StepBlock
from sosim.schedules.layout import Group
from sosim.simulate import make_cost_model

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def _build(sc: Scenario, replicate: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, int]:
    """The scenario's plan built with or without copying, and how many times a copy was made."""
    calls = {"copies": 0}
    build, copy = driver.build, driver._replicate

    def counting_copy(*args: Any) -> bool:
        done = copy(*args)
        calls["copies"] += done
        return done

    with monkeypatch.context() as m:
        m.setattr(driver, "build", lambda ctx, r, replicate=replicate: build(ctx, r, replicate))
        m.setattr(driver, "_replicate", counting_copy)
        plan = SCHEDULES[sc.schedule.system].build_plan(sc, make_cost_model(sc))
    return plan, calls["copies"]


def assert_same_plan(a: Plan, b: Plan) -> None:
    assert len(a.ops) == len(b.ops)
    assert a.ops == b.ops  # every field: id, resource, name, duration, deps, layer, iteration, ...
    assert a.iteration_starts == b.iteration_starts
    assert a.duplex_factors == b.duplex_factors


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
@pytest.mark.parametrize("iterations", [3, 5])
def test_copied_iterations_equal_built_ones(path: Path, iterations: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = load_scenario(path, [f"training.iterations={iterations}"])
    full, none = _build(sc, False, monkeypatch)
    copied, copies = _build(sc, True, monkeypatch)
    assert none == 0
    assert copies == 1, "every shipped system reaches a periodic state after its first iterations"
    assert_same_plan(copied, full)
    assert [op.iteration for op in copied.ops[-3:]] == [iterations - 1] * 3


@pytest.mark.parametrize("overrides", [["training.grad_accum=3"], ["training.gradient_clipping=1.0"],
                                       ["schedule.gpu_optimizer_fraction=0.25"]])
def test_copied_iterations_with_accumulation_and_variants(overrides: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for stem in ("gh200_superoffload_8b", "gh200_superoffload_deepspeed_8b"):
        sc = load_scenario(ROOT / "scenarios" / f"{stem}.yaml", ["training.iterations=4", *overrides])
        assert_same_plan(_build(sc, True, monkeypatch)[0], _build(sc, False, monkeypatch)[0])


@dataclasses.dataclass
class _Counting:
    """A step block wrapper whose extra op's duration grows with every step: iterations are not copies."""

    inner: StepBlock
    steps: int = 0

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        self.inner.on_done(ctx, group, arrival)

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        self.steps += 1
        ctx.add(GPU, "counted", 1e-3 * self.steps, [backward_end], phase=Phase.OPTIMIZER, category=Category.SYNC)
        return self.inner.run(ctx, arrivals, backward_end)


@dataclasses.dataclass
class _Pinned:
    """A step block whose extra op always waits for the first step's op (a reference that does not move)."""

    inner: StepBlock
    first: int | None = None

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        self.inner.on_done(ctx, group, arrival)

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        op = ctx.add(GPU, "pinned", 1e-3, [backward_end, self.first], phase=Phase.OPTIMIZER, category=Category.SYNC)
        if self.first is None:
            self.first = op
        return self.inner.run(ctx, arrivals, backward_end)


@pytest.mark.parametrize("wrapper", [_Counting, _Pinned])
def test_state_that_does_not_move_with_ids_is_built_in_full(wrapper: Any) -> None:
    sc = load_scenario(ROOT / "scenarios" / "gh200_superoffload_8b.yaml", ["training.iterations=4"])
    costs = make_cost_model(sc)

    def recipe() -> Recipe:
        base = superoffload.ideal(sc, costs, superoffload._knobs(sc))
        return dataclasses.replace(base, step=wrapper(base.step))

    copied = driver.plan_for(sc, costs, recipe())
    r = recipe()
    full = driver.build(Ctx(sc, costs, Plan(duplex_factors=dict(copied.duplex_factors)), r.layout, r.cpu), r,
                        replicate=False)
    assert_same_plan(copied, full)
    extra = [op for op in full.ops if op.name in ("counted", "pinned")]
    assert len(extra) == 4
    if wrapper is _Counting:  # each step's op is longer than the one before: no iteration is a copy
        assert [op.duration_s for op in extra] == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
    else:  # every later step's op waits for the first one
        assert all(extra[0].id in op.deps for op in extra[1:])
