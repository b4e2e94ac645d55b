"""The tuner's reuse key (sosim/answers/tune/key.py): a search that reuses results by simulation key answers exactly as
the same search simulating every candidate; the key is the resolved inputs (defaults resolved, types and
float bits kept); the one input it replaces (the launcher's core binding) is read by nothing but the machine."""

from __future__ import annotations

import copy
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sosim import load_scenario, simulate
from sosim.answers.tune import PARALLEL_MIN_BATCH, TuneOptions, Tuner, TuneResult, memory_check
from sosim.answers.tune.key import RESOLVED_BY_MACHINE, Reuse, simulation_key
from sosim.answers.tune.report import format_text, to_json
from sosim.run.loader import load_derived
from tests.helpers import SRC, tiny_scenario

SOSIM = Path(__file__).resolve().parents[1] / "sosim"


def _base(gpus: int = 2) -> dict[str, Any]:
    data = copy.deepcopy(tiny_scenario({"system": "zero_offload"}, micro_batch=4))
    data["hardware"]["interconnect"] = {
        "gpu_gpu_GBps": 100.0, "node_node_GBps": 25.0, "gpus_per_node": 2, "latency_us": 5.0,
        "sources": {k: SRC for k in ("gpu_gpu_GBps", "node_node_GBps", "gpus_per_node", "latency_us")}}
    data["cluster"] = {"gpus": gpus}
    return data


def _summary(r: TuneResult) -> list[Any]:
    return [(e.key, e.system, e.fits, e.reason, e.metrics, e.score, e.gpu_mem_gib, e.cpu_mem_gib)
            for e in r.evaluations]


def _run(options: TuneOptions, memo: bool, executor: Any = None) -> tuple[TuneResult, Tuner]:
    tuner = Tuner(load_scenario(_base()), options, memo=memo, executor=executor)
    return tuner.run(), tuner


# The exhaustive searches below, on the README's test command, leave out SuperOffload: its 17,280-point grid on this
# scenario is 92% of the candidates (about 1 s of checking per search) and the budgets here never reach it (they
# simulate gpu_only, zero_offload and zero3_offload; its candidates are only memory-checked, which
# test_candidate_checks_are_the_checks_from_scratch checks one by one). CI runs every system (--slow -m slow).
BUT_SUPEROFFLOAD = ("gpu_only", "zero_offload", "zero3_offload", "zero3", "zero_infinity")
SYSTEMS = [pytest.param(BUT_SUPEROFFLOAD, id="all-but-superoffload"),
           pytest.param(None, id="every-system", marks=pytest.mark.slow)]


# ------------------------------------------------------------------------ the search with reuse is the plain one


@pytest.mark.parametrize("systems", SYSTEMS)
def test_reusing_search_is_the_plain_search_exactly(systems: tuple[str, ...] | None) -> None:
    options = TuneOptions(exhaustive_limit=10**6, budget=400, systems=systems)
    fast, tuner = _run(options, memo=True)
    plain, _ = _run(options, memo=False)
    assert tuner.memo is not None and tuner.memo.hits > 0  # core binding is one simulation on this machine
    assert _summary(fast) == _summary(plain)
    assert [e.key for e in fast.ranked] == [e.key for e in plain.ranked]
    assert fast.simulated == plain.simulated  # the budget counts candidates evaluated, reused or not
    assert fast.reused == tuner.memo.hits and plain.reused == 0
    plain.reused = fast.reused  # the one line that differs: how many results were reused
    assert json.dumps(to_json(fast, 10), default=str) == json.dumps(to_json(plain, 10), default=str)
    assert format_text(fast, 10) == format_text(plain, 10)


@pytest.mark.parametrize("systems", SYSTEMS)
def test_reusing_search_with_a_thread_pool_is_the_plain_search(systems: tuple[str, ...] | None) -> None:
    options = TuneOptions(exhaustive_limit=10**6, budget=300, jobs=2, systems=systems)
    with ThreadPoolExecutor(max_workers=2) as pool:
        fast, _ = _run(options, memo=True, executor=pool)
    plain, _ = _run(TuneOptions(exhaustive_limit=10**6, budget=300, systems=systems), memo=False)
    assert _summary(fast) == _summary(plain)


def test_staged_search_with_reuse_is_the_plain_staged_search() -> None:
    fast, _ = _run(TuneOptions(), memo=True)
    plain, _ = _run(TuneOptions(), memo=False)
    assert _summary(fast) == _summary(plain)


SMALL = ("gpu_only", "zero_offload", "zero3_offload")


def test_streamed_stage_one_with_workers_is_the_plain_search() -> None:
    """Stage 1 handed to worker processes while it is being checked (chunked tasks): a staged search (stages 2
    and 3 follow) and an exhaustive one that the budget does not cut give the plain search's answer."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        staged, _ = _run(TuneOptions(jobs=2), memo=True, executor=pool)
        full, t2 = _run(TuneOptions(exhaustive_limit=10**6, budget=10**6, jobs=2, systems=SMALL), memo=True,
                        executor=pool)
        pooled_plain, _ = _run(TuneOptions(exhaustive_limit=10**6, budget=10**6, jobs=2, systems=SMALL),
                               memo=False, executor=pool)
    assert not full.budget_exhausted and full.simulated > PARALLEL_MIN_BATCH
    assert t2.memo is not None and t2.memo.hits > 0
    assert _summary(staged) == _summary(_run(TuneOptions(), memo=False)[0])
    plain_full = _run(TuneOptions(exhaustive_limit=10**6, budget=10**6, systems=SMALL), memo=False)[0]
    assert _summary(full) == _summary(plain_full) == _summary(pooled_plain)
    assert [e.key for e in full.ranked] == [e.key for e in plain_full.ranked]
    assert all("profile" not in (e.metrics or {}) for e in full.evaluations)  # metrics only, as simulate() gives
    plain_full.reused = full.reused  # the one line that differs: how many results were reused
    assert format_text(full, 10) == format_text(plain_full, 10)


@pytest.mark.parametrize("most", [pytest.param(1000, id="sample"),
                                  pytest.param(None, id="all", marks=pytest.mark.slow)])
def test_candidate_checks_are_the_checks_from_scratch(most: int | None) -> None:
    """Every candidate check of a search, with the reused sections and memory verdicts, is the check of the
    same candidate loaded and memory-checked from scratch (load_scenario of its data, memory_check).

    Loading from scratch is 0.3 ms a candidate and the search checks 18,744 (17,280 SuperOffload): on the README's
    test command, every candidate of a system with at most ``most`` of them and an even stride over a larger
    system's (first and last included; the search, and so every cache, is the full one); CI checks all (--slow)."""
    tuner = Tuner(load_scenario(_base()), TuneOptions(exhaustive_limit=10**6, budget=50), memo=True)
    tuner.run()
    cands = tuner.cands
    assert cands.memory is not None and cands.memory.hits > 0
    assert cands.sections  # sections were cached (and so reused by later candidates)
    by_system: dict[str, list[Any]] = {}
    for ev in cands.evals.values():
        by_system.setdefault(ev.system, []).append(ev)
    assert max(len(evs) for evs in by_system.values()) > 10_000  # the stride below has a large grid to sample
    sample = [ev for evs in by_system.values()
              for ev in (evs if most is None or len(evs) <= most else evs[:: -(-len(evs) // most)] + evs[-1:])]
    checked = 0
    for ev in sample:
        space = cands.space_of(ev.system)
        if space is None or ev.scenario is None or ev.is_base:
            continue
        fresh = load_scenario(cands.scenario_data(space, ev.settings))
        assert fresh.model_dump() == ev.scenario.model_dump()
        assert fresh.training.model_fields_set == ev.scenario.training.model_fields_set
        assert fresh.schedule.model_fields_set == ev.scenario.schedule.model_fields_set
        gpu, cpu, fits, reason, klass = memory_check(fresh)
        if ev.metrics is None:  # a simulated candidate takes its memory figures from the simulation
            assert (ev.gpu_mem_gib, ev.cpu_mem_gib) == (gpu, cpu)
            assert cands.caps(gpu, cpu, fits, reason, klass) == (ev.fits, ev.reason, ev.reason_key)
        checked += 1
    assert checked > 100


# --------------------------------------------------------------------------------------------------- the key


def test_key_is_the_resolved_inputs() -> None:
    base = load_scenario(_base())
    training = base.training.model_dump(exclude_unset=True)
    same = load_derived(base, {"training": {**training}})
    explicit_default = load_derived(base, {"training": {**training, "activation_checkpointing":
                                                        base.training.activation_checkpointing}})
    other = load_derived(base, {"training": {**training, "micro_batch": 2, "grad_accum": 2}})
    assert simulation_key(same) == simulation_key(base)
    assert simulation_key(explicit_default) == simulation_key(base)  # a default, set or not, is one input
    assert simulation_key(other) != simulation_key(base)
    reuse: Reuse[int] = Reuse(base)
    for sc in (base, same, explicit_default, other):
        assert reuse.key(sc) == simulation_key(sc)  # the per-object dump cache changes no key


def test_key_tells_types_and_zero_signs_apart() -> None:
    from sosim.answers.tune.key import freeze

    assert freeze(0.0) != freeze(-0.0)
    assert len({freeze(1), freeze(1.0), freeze(True)}) == 3
    assert freeze({"a": [1.0]}) != freeze({"a": [1]})


def test_core_binding_is_one_simulation_exactly_where_the_machine_is_the_same() -> None:
    """On one GPU per host (the legacy profile here) binding changes no thread count: one key, and the two
    simulations are equal; where ranks share a node it changes the threads per rank: two keys."""
    base = load_scenario(_base())
    legacy = [load_derived(base, {"cluster": {"gpus": 2, "bind_cores_to_rank": b}}) for b in (False, True)]
    assert simulation_key(legacy[0]) == simulation_key(legacy[1])
    assert simulate(legacy[0]).metrics == simulate(legacy[1]).metrics
    two_per_node = SOSIM.parent / "scenarios" / "h200x2_zero3_offload_llama2.0b.yaml"
    shared = [load_scenario(two_per_node, [f"cluster.bind_cores_to_rank={b}"]) for b in ("false", "true")]
    assert simulation_key(shared[0]) != simulation_key(shared[1])


def test_launcher_flag_is_read_only_by_the_machine() -> None:
    """The key replaces cluster.bind_cores_to_rank by the resolved Machine: sound only while machine.py is its
    only reader in the model (the tuner's own modules and the DeepSpeed config writers name it as a setting)."""
    for section, names in RESOLVED_BY_MACHINE.items():
        for name in names:
            readers = sorted(str(p.relative_to(SOSIM)) for p in SOSIM.rglob("*.py")
                             if re.search(rf"\.{name}\b", p.read_text())
                             and p.parent.name not in ("tune", "dsconfig"))
            assert readers == ["hardware/machine.py"], (section, name, readers)


def test_other_hardware_is_not_eligible() -> None:
    base = load_scenario(_base())
    reuse: Reuse[int] = Reuse(base)
    assert reuse.eligible(load_derived(base, {"cluster": {"gpus": 2}}))
    assert not reuse.eligible(load_scenario(_base()))  # an equal profile, another object: not shared


# ------------------------------------------------------------------------------------- sections, load_derived


def test_section_keys_tell_types_and_zero_signs_apart() -> None:
    from sosim.answers.tune.candidate_eval import section_keys

    a = section_keys("zero_offload", {"schedule.bucket_mb": 0.0, "training.micro_batch": 1})
    b = section_keys("zero_offload", {"schedule.bucket_mb": -0.0, "training.micro_batch": True})
    c = section_keys("zero_offload", {"training.micro_batch": 1, "schedule.bucket_mb": 0.0})
    d = section_keys("zero3_offload", {"schedule.bucket_mb": 0.0, "training.micro_batch": 1})
    assert a is not None and b is not None and c is not None and d is not None
    assert a["schedule"] != b["schedule"] and a["training"] != b["training"]
    assert a == c  # the order of the settings does not matter
    assert a["schedule"] != d["schedule"] and a["training"] == d["training"]  # another system's schedule base
    assert section_keys("zero_offload", {"schedule.bucket_mb": [1.0]}) is None  # not a scalar: not cached


def test_load_derived_checked_sections_are_kept_and_the_others_still_scanned() -> None:
    import math

    from sosim.inputs.errors import ConfigError

    base = load_scenario(_base())
    sc = load_derived(base, {"training": base.training, "cluster": {"gpus": 2}}, checked=["training"])
    assert sc.training is base.training
    bad = {**base.cluster.model_dump(exclude_unset=True), "gpus": 2}
    with pytest.raises(ConfigError):
        load_derived(base, {"training": base.training, "schedule": {"system": "zero_offload", "bucket_mb": math.nan},
                            "cluster": bad}, checked=["training"])


# ------------------------------------------------------------------------ the plan key: one engine run per plan


@pytest.mark.parametrize("systems", SYSTEMS)
def test_candidates_with_one_plan_share_one_engine_run_and_the_answer_is_unchanged(
        systems: tuple[str, ...] | None) -> None:
    """With reuse, candidates whose node plans and contention are equal share one engine run
    (sosim/engine/fingerprint.py); the search is the one that runs the engine for every candidate, metrics
    bit for bit."""
    options = TuneOptions(exhaustive_limit=10**6, budget=400, systems=systems)
    shared, tuner = _run(options, memo=True)
    assert tuner.eval.runs is not None and tuner.eval.runs.hits > 0
    assert tuner.eval.runs.hits + tuner.eval.runs.misses == shared.simulated - shared.reused
    alone = Tuner(load_scenario(_base()), options, memo=True)
    alone.eval.runs = None  # the scenario key only: every simulation runs its engine
    plain = alone.run()
    assert _summary(shared) == _summary(plain)
    assert [e.key for e in shared.ranked] == [e.key for e in plain.ranked]
    assert format_text(shared, 10) == format_text(plain, 10)
