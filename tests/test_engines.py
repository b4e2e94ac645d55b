"""The fast engine (sosim/engine/fast.py) gives the SimPy reference engine's run bit for bit: one property over
random plans with random shared resources (contended or not; durations from a small set so that ties are
frequent), and every shipped scenario through ``simulate(sc, engine=...)``. Plus a hand case of the shared
fluid model and the engine's name in every result's provenance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.engine import fast as engine_fast
from sosim.engine import simpy_engine as engine
from sosim.engine.fluid import Contention, effective_contention
from sosim.engine.plan import CPU_MAIN, CPU_OPT, D2H, GPU, H2D, Phase, Plan, Resource, ResourceKind
from sosim.run.simulate import DEFAULT_ENGINE, ENGINES

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
F = Phase.FORWARD


@st.composite
def plans_with_contention(draw: st.DrawFn) -> tuple[Plan, Contention | None]:
    """A random plan on serial resources of several kinds and instances, and (or not) random shared resources
    that some of its non-GPU ops draw on. Capacities from a small set, so some resources can be
    oversubscribed (the event loop) and some cannot (the list schedule)."""
    resources = [GPU, H2D, D2H, CPU_OPT, CPU_MAIN, Resource(ResourceKind.H2D, 1), Resource(ResourceKind.D2H, 1)]
    plan = Plan()
    n = draw(st.integers(1, 30))
    for i in range(n):
        resource = draw(st.sampled_from(resources))
        duration = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0]))
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        plan.add(resource, f"op{i}", duration, deps, phase=F)
    if not draw(st.booleans()):
        return plan, None
    k = draw(st.integers(1, 3))
    capacity = tuple(draw(st.sampled_from([1.0, 1.5, 2.0, 10.0])) for _ in range(k))
    uses = {}
    for op in plan.ops:
        if op.resource.kind is not ResourceKind.GPU and draw(st.booleans()):
            chosen = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=k, unique=True))
            demand = [(r, draw(st.sampled_from([0.5, 1.0, 1.5]))) for r in chosen]
            # An op alone never exceeds a capacity (the contention model's contract).
            scale = min(1.0, *(capacity[r] / d for r, d in demand))
            uses[op.id] = tuple((r, d * scale) for r, d in demand)
    return plan, Contention(tuple(f"r{i}" for i in range(k)), capacity, uses)


@settings(max_examples=400, deadline=None)
@given(plans_with_contention())
def test_fast_engine_equals_simpy_on_random_plans(case: tuple[Plan, Contention | None]) -> None:
    plan, contention = case
    ref = engine.run_plan_detailed(plan, contention)
    fast = engine_fast.run_plan_detailed(plan, contention)
    assert np.array_equal(fast.start_s, ref.start_s) and np.array_equal(fast.end_s, ref.end_s)
    assert fast.stretch_s == ref.stretch_s


@settings(max_examples=400, deadline=None)
@given(plans_with_contention())
def test_the_full_speed_shortcut_is_the_fluid_models_timeline(case: tuple[Plan, Contention | None]) -> None:
    """Where either form of the shortcut (the sweep in Python, the array form) vouches that no contended op is
    ever slowed, SimPy with the fluid model gives the list schedule exactly, with no stretch."""
    plan, contention = case
    active = effective_contention(plan, contention)
    if active is None:
        return
    start, end = engine_fast.list_times(plan)
    by_sweep = engine_fast._full_speed(plan, active, start, end, array_from=10**9)
    by_arrays = engine_fast._full_speed(plan, active, start, end, array_from=0)
    if by_sweep or by_arrays:
        ref = engine.run_plan_detailed(plan, contention)
        assert ref.start_s.tolist() == start and ref.end_s.tolist() == end and ref.stretch_s == {}


def test_the_full_speed_shortcut_sees_a_hand_off_and_an_overlap() -> None:
    """Two uploads back to back (0-1 s, 1-2 s), a small download after the first (1-1.5 s), a large one later
    (2.25-3.25 s), on a two-way total of 1: the uploads meet only at their hand-off, where the second starts
    after the first ended, so nothing is ever slowed and both forms of the shortcut vouch for the list
    schedule, which SimPy gives. A larger first download (0.5 beside the second upload's 0.9) is slowed in
    SimPy, and the shortcut does not vouch."""
    plan = Plan()
    plan.add(H2D, "up0", 1.0, phase=F)
    plan.add(H2D, "up1", 1.0, phase=F)
    plan.add(D2H, "down", 0.5, [0], phase=F)
    plan.add(GPU, "compute", 0.25, [1], phase=F)
    plan.add(D2H, "down_big", 1.0, [3], phase=F)
    start, end = engine_fast.list_times(plan)
    assert (start, end) == ([0.0, 1.0, 1.0, 2.0, 2.25], [1.0, 2.0, 1.5, 2.25, 3.25])
    for small, full_speed in ((0.05, True), (0.5, False)):
        contention = Contention(("bidir",), (1.0,), {0: ((0, 0.9),), 1: ((0, 0.9),), 2: ((0, small),),
                                                     4: ((0, 0.9),)})
        active = effective_contention(plan, contention)
        assert active is not None  # the largest upload and download together exceed it
        for array_from in (0, 10**9):
            assert engine_fast._full_speed(plan, active, start, end, array_from=array_from) is full_speed
        ref = engine.run_plan_detailed(plan, contention)
        assert (ref.end_s.tolist() == end) is full_speed
        assert engine_fast.run_plan_detailed(plan, contention).end_s.tolist() == ref.end_s.tolist()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_fast_engine_equals_simpy_on_every_shipped_scenario(path: Path) -> None:
    sc = load_scenario(path)
    fast, ref = simulate(sc, engine="fast"), simulate(sc, engine="simpy")
    assert np.array_equal(fast.start_s, ref.start_s) and np.array_equal(fast.end_s, ref.end_s)
    stretch = {k: v for k, v in ref.provenance.items() if k.startswith("contention_")}
    assert {k: v for k, v in fast.provenance.items() if k.startswith("contention_")} == stretch
    assert fast.metrics == ref.metrics


def test_every_way_of_the_fast_engine_is_taken_by_shipped_scenarios() -> None:
    """Not vacuous: a single-GPU GH200 on the spec-sheet C2C (450 + 450 <= 900 GB/s) never oversubscribes
    anything (the list schedule); on its published copy rates (377 + 297 GB/s > a 450 GB/s two-way total,
    docs/gh200.md) it could, but the paper's SuperOffload never moves both directions at once (the full-speed
    check vouches for the list schedule); a PCIe host's link directions contend in fact (the event loop with
    the fluid model)."""
    from sosim.engine.contention import node_plan
    from sosim.hardware.machine import Machine

    spec_c2c = ["hardware.link.h2d_GBps=450", "hardware.link.d2h_GBps=450", "hardware.link.bidir_GBps=900"]

    def way(stem: str, overrides: list[str] | None = None) -> str:
        sc = load_scenario(stem, overrides)
        node, contention, _ = node_plan(Machine.from_scenario(sc), simulate(sc).plan)
        active = effective_contention(node, contention)
        if active is None:
            return "list"
        start, end = engine_fast.list_times(node)
        return "full speed" if engine_fast._full_speed(node, active, start, end) else "event loop"

    assert way("gh200_superoffload_8b", spec_c2c) == "list"
    assert way("gh200_superoffload_8b") == "full speed"
    assert way("x86_h100_superoffload_ideal_4b") == "event loop"


def test_two_copies_share_a_link_by_hand() -> None:
    """Two 1 s copies of 1 GB each on a 1 GB/s shared link, both at t=0: each at half speed, both end at 2 s,
    and 2 s of stretch (1 s each) is put on the link, in both engines."""
    plan = Plan()
    plan.add(H2D, "up", 1.0, phase=F)
    plan.add(D2H, "down", 1.0, phase=F)
    link = Contention(("bidir",), (1e9,), {0: ((0, 1e9),), 1: ((0, 1e9),)})
    for run in ENGINES.values():
        out = run(plan, link)
        assert out.start_s.tolist() == [0.0, 0.0] and out.end_s.tolist() == pytest.approx([2.0, 2.0], rel=1e-12)
        assert out.stretch_s == pytest.approx({"bidir": 2.0})


def test_every_result_names_its_engine() -> None:
    sc = load_scenario("gh200_zero_offload_4b", ["model.layers=2"])
    assert simulate(sc).provenance["engine"] == DEFAULT_ENGINE
    assert simulate(sc, engine="simpy").provenance["engine"] == "simpy"
    with pytest.raises(ValueError, match="engine must be one of simpy, fast"):
        simulate(sc, engine="replay")
    # sosim run --format json names it beside the other provenance columns.
    from sosim.formats.output import provenance_fields

    assert provenance_fields(sc, "simpy")["engine"] == "simpy"


def test_cli_runs_either_engine(capsys: pytest.CaptureFixture[str]) -> None:
    """``sosim run --engine simpy`` runs the reference; the JSON says which engine made the numbers, and both
    give the same step time."""
    import json

    from sosim.cli import main

    steps = {}
    for name in ("simpy", "fast"):
        assert main(["run", "gh200_zero_offload_4b", "--set", "model.layers=2", "--engine", name,
                     "--format", "json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["provenance"]["engine"] == name
        steps[name] = out["step_time_s"]
    assert steps["simpy"] == steps["fast"]
    with pytest.raises(SystemExit) as exit_:
        main(["run", "gh200_zero_offload_4b", "--engine", "replay"])
    assert exit_.value.code == 2 and "invalid choice: 'replay'" in capsys.readouterr().err


def test_results_pickle_with_their_plan() -> None:
    """A result (its plan a repeated template) crosses a process pool: the plan arrives with its ops."""
    import pickle

    r = simulate(load_scenario("gh200_superoffload_8b", ["model.layers=2"]))
    back = pickle.loads(pickle.dumps(r))
    assert back.plan == r.plan and back.plan.iteration_starts == r.plan.iteration_starts
    assert np.array_equal(back.start_s, r.start_s)
