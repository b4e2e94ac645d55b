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
from sosim.tune import TuneOptions, Tuner, TuneResult
from sosim.tune_memo import WHOLE, ReadMemo, key_of, simulate_recorded
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
