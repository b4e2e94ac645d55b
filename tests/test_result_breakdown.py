"""``result.step_breakdown`` (every time class counted at once) gives exactly what the class-by-class
oracle ``step_breakdown_reference`` gives: on every shipped scenario's steady window and on random intervals
(with boundaries one float apart, where a piece's midpoint rounds onto a boundary)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.engine.plan import Category, Phase, Plan, Resource, ResourceKind
from sosim.run.result import step_breakdown, step_breakdown_reference

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_breakdown_equals_reference_on_shipped_scenarios(path: Path) -> None:
    sc = load_scenario(path)
    if sc.model.layers * sc.training.grad_accum > 400:
        sc = load_scenario(path, ["model.layers=8", "training.grad_accum=1"])
    r = simulate(sc)
    t0, t1 = r.steady_window_s
    assert step_breakdown(r.plan, r.start_s, r.end_s, t0, t1) == step_breakdown_reference(
        r.plan, r.start_s, r.end_s, t0, t1)


# Times on a coarse grid plus neighbours one float apart: equal, nearly equal and distinct boundaries.
TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]).flatmap(
    lambda t: st.sampled_from([t, float(np.nextafter(t, 10.0)), float(np.nextafter(np.nextafter(t, 10.0), 10.0))]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(ResourceKind)), st.sampled_from(list(Category)), TIMES, TIMES),
                max_size=25),
       TIMES, TIMES)
def test_breakdown_equals_reference_on_random_intervals(
        ops: list[tuple[ResourceKind, Category, float, float]], a: float, b: float) -> None:
    plan = Plan()
    start, end = [], []
    for i, (kind, category, x, y) in enumerate(ops):
        plan.add(Resource(kind, i % 2), f"op{i}", 0.0, phase=Phase.FORWARD, category=category)
        start.append(min(x, y))
        end.append(max(x, y))
    t0, t1 = min(a, b), max(a, b)
    s, e = np.array(start, dtype=float), np.array(end, dtype=float)
    got = step_breakdown(plan, s, e, t0, t1)
    assert got == step_breakdown_reference(plan, s, e, t0, t1)
    assert sum(got.values()) == pytest.approx(t1 - t0, abs=1e-12)
