"""The tuner's memo of identical simulations (sosim/tune_memo.py): a search that reuses results answers exactly
as the same search simulating every candidate; a reused result is what simulate() gives that candidate; a
read of a whole section puts the whole section in the key."""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sosim import load_scenario, simulate
from sosim.loader import load_derived
from sosim.tune import PARALLEL_MIN_BATCH, TuneOptions, Tuner, TuneResult, memory_check
from sosim.tune_memo import WHOLE, ReadMemo, key_of, keyer, simulate_recorded
from sosim.tune_report import format_text, to_json
from tests.helpers import SRC, tiny_scenario


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


def test_memo_search_is_the_plain_search_exactly() -> None:
    options = TuneOptions(exhaustive_limit=10**6, budget=400)
    fast, tuner = _run(options, memo=True)
    plain, _ = _run(options, memo=False)
    assert tuner.memo is not None and tuner.memo.hits > 0  # the space has knobs some systems never read
    assert _summary(fast) == _summary(plain)
    assert [e.key for e in fast.ranked] == [e.key for e in plain.ranked]
    assert fast.simulated == plain.simulated  # the budget counts candidates evaluated, reused or not
    assert fast.reused == tuner.memo.hits and plain.reused == 0
    plain.reused = fast.reused  # the one line that differs: how many results were reused
    assert json.dumps(to_json(fast, 10), default=str) == json.dumps(to_json(plain, 10), default=str)
    assert format_text(fast, 10) == format_text(plain, 10)


def test_memo_with_a_pool_is_the_plain_search() -> None:
    options = TuneOptions(exhaustive_limit=10**6, budget=300, jobs=2)
    with ThreadPoolExecutor(max_workers=2) as pool:
        fast, _ = _run(options, memo=True, executor=pool)
    plain, _ = _run(TuneOptions(exhaustive_limit=10**6, budget=300), memo=False)
    assert _summary(fast) == _summary(plain)


def test_staged_search_with_memo_is_the_plain_staged_search() -> None:
    fast, _ = _run(TuneOptions(), memo=True)
    plain, _ = _run(TuneOptions(), memo=False)
    assert _summary(fast) == _summary(plain)


def test_a_reused_result_is_what_simulate_gives_that_candidate() -> None:
    base = load_scenario(_base())
    memo = ReadMemo(base)
    first = load_derived(base, {"cluster": {"gpus": 2, "bind_cores_to_rank": False}})
    metrics, reads = simulate_recorded(first)
    assert metrics == dict(simulate(first).metrics)
    memo.add(first, reads, metrics)
    for bind in (False, True):
        other = load_derived(base, {"cluster": {"gpus": 2, "bind_cores_to_rank": bind}})
        hit = memo.lookup(other)
        if hit is not None:  # reused only where the field was not read, and then it is the same simulation
            assert ("cluster", "bind_cores_to_rank") not in reads
            assert hit == dict(simulate(other).metrics)
    # A field the simulation read, changed: never a hit.
    changed = load_derived(base, {"training": {**base.training.model_dump(exclude_unset=True), "micro_batch": 2}})
    assert ("training", "micro_batch") in reads
    assert memo.lookup(changed) is None


def test_a_whole_section_read_keys_on_every_field(monkeypatch: Any) -> None:
    import importlib

    sim_module = importlib.import_module("sosim.simulate")  # the module (sosim.simulate is also the function)
    real = sim_module.simulate_with

    def dumping(sc: Any, costs: Any, engine: Any) -> Any:
        sc.cluster.model_dump()  # reads every field of the section at once
        return real(sc, costs, engine)

    monkeypatch.setattr(sim_module, "simulate_with", dumping)
    base = load_scenario(_base())
    _, reads = simulate_recorded(base)
    assert ("cluster", WHOLE) in reads
    assert not any(s == "cluster" and n != WHOLE for s, n in reads)
    other = load_derived(base, {"cluster": {"gpus": 2, "gpus_per_node": 1}})
    assert key_of(base, reads) != key_of(other, reads)


def test_other_hardware_is_not_eligible() -> None:
    base = load_scenario(_base())
    memo = ReadMemo(base)
    assert memo.eligible(load_derived(base, {"cluster": {"gpus": 2}}))
    assert not memo.eligible(load_scenario(_base()))  # an equal profile, another object: not shared


def test_keyer_is_key_of() -> None:
    base = load_scenario(_base())
    _, reads = simulate_recorded(base)
    others = [load_derived(base, {"cluster": {"gpus": 2, "bind_cores_to_rank": b}}) for b in (False, True)]
    others.append(load_derived(base, {"training": {**base.training.model_dump(exclude_unset=True), "micro_batch": 2}}))
    for sc in (base, *others):
        assert keyer(reads)(sc) == key_of(sc, reads)
    whole = ((("cluster", WHOLE)), *reads)
    assert keyer(whole)(others[1]) == key_of(others[1], whole)


def test_section_cache_and_memory_memo_change_no_verdict() -> None:
    """Every candidate check of a search, with the reused sections and memory verdicts, is the check of the
    same candidate loaded and memory-checked from scratch (load_scenario of its data, memory_check)."""
    tuner = Tuner(load_scenario(_base()), TuneOptions(exhaustive_limit=10**6, budget=50), memo=True)
    tuner.run()
    assert tuner.memory_memo is not None and tuner.memory_memo.hits > 0
    assert tuner._sections  # sections were cached (and so reused by later candidates)
    checked = 0
    for ev in tuner.evals.values():
        space = next((s for s in tuner.spaces if s.system == ev.system), None)
        if space is None or ev.scenario is None or ev.is_base:
            continue
        fresh = load_scenario(tuner._scenario_data(space, ev.settings))
        assert fresh.model_dump() == ev.scenario.model_dump()
        assert fresh.training.model_fields_set == ev.scenario.training.model_fields_set
        assert fresh.schedule.model_fields_set == ev.scenario.schedule.model_fields_set
        gpu, cpu, fits, reason, klass = memory_check(fresh)
        if ev.metrics is None:  # a simulated candidate takes its memory figures from the simulation
            assert (ev.gpu_mem_gib, ev.cpu_mem_gib) == (gpu, cpu)
            assert tuner._caps(gpu, cpu, fits, reason, klass) == (ev.fits, ev.reason, ev.reason_key)
        checked += 1
    assert checked > 100


def test_section_keys_tell_types_and_zero_signs_apart() -> None:
    from sosim.tune_eval import section_keys as _section_keys

    a = _section_keys("zero_offload", {"schedule.bucket_mb": 0.0, "training.micro_batch": 1})
    b = _section_keys("zero_offload", {"schedule.bucket_mb": -0.0, "training.micro_batch": True})
    c = _section_keys("zero_offload", {"training.micro_batch": 1, "schedule.bucket_mb": 0.0})
    d = _section_keys("zero3_offload", {"schedule.bucket_mb": 0.0, "training.micro_batch": 1})
    assert a is not None and b is not None and c is not None and d is not None
    assert a["schedule"] != b["schedule"] and a["training"] != b["training"]
    assert a == c  # the order of the settings does not matter
    assert a["schedule"] != d["schedule"] and a["training"] == d["training"]  # another system's schedule base
    assert _section_keys("zero_offload", {"schedule.bucket_mb": [1.0]}) is None  # not a scalar: not cached


def test_memo_with_a_process_pool_is_the_plain_search() -> None:
    """The chunked worker tasks (several candidates per round trip) give the plain search's answer."""
    from concurrent.futures import ProcessPoolExecutor

    options = TuneOptions(exhaustive_limit=10**6, budget=200, jobs=2)
    with ProcessPoolExecutor(max_workers=2) as pool:
        fast, tuner = _run(options, memo=True, executor=pool)
    plain, _ = _run(TuneOptions(exhaustive_limit=10**6, budget=200), memo=False)
    assert tuner.memo is not None and tuner.memo.hits > 0
    assert _summary(fast) == _summary(plain)
    assert [e.key for e in fast.ranked] == [e.key for e in plain.ranked]


def test_load_derived_checked_sections_are_kept_and_the_others_still_scanned() -> None:
    import math

    import pytest

    from sosim.errors import ConfigError

    base = load_scenario(_base())
    sc = load_derived(base, {"training": base.training, "cluster": {"gpus": 2}}, checked=["training"])
    assert sc.training is base.training
    bad = {**base.cluster.model_dump(exclude_unset=True), "gpus": 2}
    with pytest.raises(ConfigError):
        load_derived(base, {"training": base.training, "schedule": {"system": "zero_offload", "bucket_mb": math.nan},
                            "cluster": bad}, checked=["training"])


SMALL = ("gpu_only", "zero_offload", "zero3_offload")


def test_streamed_stage_one_with_workers_is_the_plain_search() -> None:
    """Stage 1 handed to the workers while it is being checked: a staged search (stages 2 and 3 follow) and an
    exhaustive one that the budget does not cut give the plain search's answer."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        staged, t1 = _run(TuneOptions(jobs=2), memo=True, executor=pool)
        full, t2 = _run(TuneOptions(exhaustive_limit=10**6, budget=10**6, jobs=2, systems=SMALL), memo=True,
                        executor=pool)
    assert not full.budget_exhausted and full.simulated > PARALLEL_MIN_BATCH
    assert t1.memo is not None and t2.memo is not None and t2.memo.hits > 0
    assert _summary(staged) == _summary(_run(TuneOptions(), memo=False)[0])
    plain_full = _run(TuneOptions(exhaustive_limit=10**6, budget=10**6, systems=SMALL), memo=False)[0]
    assert _summary(full) == _summary(plain_full)
    assert [e.key for e in full.ranked] == [e.key for e in plain_full.ranked]
    plain_full.reused = full.reused  # the one line that differs: how many results were reused
    assert format_text(full, 10) == format_text(plain_full, 10)


def test_plain_search_with_a_process_pool_records_what_the_serial_one_does() -> None:
    """The plain (memo=False) search's worker rows are sweep rows (scenario and provenance columns + metrics):
    only the metrics are recorded, the same dicts the serial search records (found by comparing a 10,000-
    candidate search with memo=False against the memoised one)."""
    from concurrent.futures import ProcessPoolExecutor

    options = TuneOptions(exhaustive_limit=10**6, budget=10**6, systems=SMALL)
    with ProcessPoolExecutor(max_workers=2) as pool:
        pooled, _ = _run(TuneOptions(exhaustive_limit=10**6, budget=10**6, systems=SMALL, jobs=2), memo=False,
                         executor=pool)
    serial, _ = _run(options, memo=False)
    assert pooled.simulated > PARALLEL_MIN_BATCH  # the batch went to the pool
    assert _summary(pooled) == _summary(serial)
    assert all("profile" not in (e.metrics or {}) for e in pooled.evaluations)
