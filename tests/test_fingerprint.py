"""The engine fingerprint (sosim/engine/fingerprint.py): equal for equal engine inputs, whatever objects hold
them; different when anything an engine reads differs, down to one bit of one duration."""

from __future__ import annotations

import dataclasses
import math

from sosim import load_scenario, simulate
from sosim.engine.contention import node_plan
from sosim.engine.fingerprint import engine_fingerprint
from sosim.engine.fluid import Contention
from sosim.engine.plan import CPU_OPT, GPU, H2D, Category, Op, Phase, Plan, Template
from sosim.hardware.machine import Machine
from sosim.run.simulate import ENGINES, EngineRuns, make_costs
from sosim.schedules.registry import SYSTEMS


def _plan(d: float = 1.0, name: str = "a") -> Plan:
    p = Plan()
    a = p.add(GPU, name, d, phase=Phase.FORWARD)
    b = p.add(H2D, "b", 0.5, (a,), phase=Phase.FORWARD, category=Category.TRANSFER, n_bytes=1e6)
    p.add(CPU_OPT, "c", 0.25, (b,), phase=Phase.OPTIMIZER, category=Category.OPTIMIZER)
    p.mark_iteration_start(a)
    p.mark_iteration_start(b)
    return p


def test_equal_inputs_equal_fingerprints_and_names_are_left_out() -> None:
    assert engine_fingerprint(_plan(), None, "fast") == engine_fingerprint(_plan(), None, "fast")
    assert engine_fingerprint(_plan(name="x"), None, "fast") == engine_fingerprint(_plan(), None, "fast")


def test_any_engine_input_changes_the_fingerprint() -> None:
    base = engine_fingerprint(_plan(), None, "fast")
    assert engine_fingerprint(_plan(math.nextafter(1.0, 2.0)), None, "fast") != base  # one bit of a duration
    assert engine_fingerprint(_plan(0.0), None, "fast") != engine_fingerprint(_plan(-0.0), None, "fast")
    assert engine_fingerprint(_plan(), None, "simpy") != base
    other = _plan()
    other.ops[2] = dataclasses.replace(other.ops[2], deps=(0, 1))
    assert engine_fingerprint(other, None, "fast") != base
    other = _plan()
    other.ops[1] = dataclasses.replace(other.ops[1], n_bytes=2e6)
    assert engine_fingerprint(other, None, "fast") != base
    c1 = Contention(("link0.h2d",), (1e9,), {1: ((0, 1e6 / 0.5),)})
    c2 = Contention(("link0.h2d",), (math.nextafter(1e9, 2e9),), {1: ((0, 1e6 / 0.5),)})
    f1 = engine_fingerprint(_plan(), c1, "fast")
    assert f1 not in (base, engine_fingerprint(_plan(), c2, "fast"))
    assert engine_fingerprint(_plan(), dataclasses.replace(c1, stands_for=2), "fast") != f1


def _template() -> Template:
    t = _plan()
    tmpl = Template(ops=t.ops, iteration_starts=[0], lag={-1: 1}, carry_out={-1: (2,)})
    tmpl.ops[0] = dataclasses.replace(tmpl.ops[0], deps=(-1,))
    return tmpl


def test_a_repeated_plan_is_its_template_whether_its_ops_are_made_or_not() -> None:
    lazy, made = Plan.repeat(_template(), 3), Plan.repeat(_template(), 3)
    assert made.ops and not made.repeated and lazy.repeated
    assert engine_fingerprint(lazy, None, "fast") == engine_fingerprint(made, None, "fast")
    assert engine_fingerprint(Plan.repeat(_template(), 4), None, "fast") != engine_fingerprint(lazy, None, "fast")
    other = _template()
    other.lag[-1] = 2
    assert engine_fingerprint(Plan.repeat(other, 3), None, "fast") != engine_fingerprint(lazy, None, "fast")


def test_shared_engine_runs_give_the_metrics_of_a_plain_simulation() -> None:
    """Two builds of one shipped scenario's plan (a contended 8-rank node): one fingerprint; the second
    simulation through :class:`EngineRuns` reuses the first's run and its metrics are simulate()'s exactly."""
    sc = load_scenario("hgx_zero_infinity_nvme_13b")
    m = Machine.from_scenario(sc)
    keys = []
    for _ in range(2):
        costs = make_costs(sc, machine=m)
        node, contention, _ranks = node_plan(m, SYSTEMS[sc.schedule.system].build_plan(sc, costs, m))
        keys.append(engine_fingerprint(node, contention, "fast"))
    assert keys[0] == keys[1] and "fast" in ENGINES
    runs = EngineRuns()
    first = simulate(sc, runs=runs).metrics
    second = simulate(sc, runs=runs).metrics
    assert (runs.hits, runs.misses) == (1, 1)
    assert first == second == simulate(sc).metrics


def test_every_field_an_engine_can_read_is_fingerprinted() -> None:
    """A new field of an op, a template or the contention must be added to the fingerprint (or named here
    with the reason it cannot change an engine run); otherwise twins with different values would share a run."""
    covered_op = {"resource", "duration_s", "deps", "layer", "iteration", "category", "phase", "n_bytes", "flops",
                  "group", "id"}  # id: the position in the plan, serialized by order
    labels = {"name"}  # never read by an engine except to name an op in an error (not shared)
    assert {f.name for f in dataclasses.fields(Op)} == covered_op | labels
    assert {f.name for f in dataclasses.fields(Template)} == {"ops", "iteration_starts", "lag", "carry_out"}
    assert {f.name for f in dataclasses.fields(Contention)} == {"names", "capacity", "uses", "stands_for",
                                                                "report_as"}
    # optimizer_core_share: no engine reads it; contention_for does, and the Contention it makes is fingerprinted.
    assert set(Plan.__slots__) == {"_copy_deps", "_ops", "copies", "iteration_starts", "template",
                                   "optimizer_core_share"}


def test_engine_runs_forget_the_oldest_beyond_their_bound() -> None:
    runs = EngineRuns(max_ops=5)  # room for one 3-op run
    a, b = _plan(1.0), _plan(2.0)
    first = runs.run("fast", a, None)
    assert runs.run("fast", _plan(1.0), None) is first and (runs.hits, runs.misses) == (1, 1)
    runs.run("fast", b, None)  # evicts a's run
    assert runs.ops_held == 3 and len(runs.runs) == 1
    again = runs.run("fast", a, None)
    assert again is not first and list(again.end_s) == list(first.end_s) and runs.misses == 3
    assert not first.start_s.flags.writeable
