"""Interchangeable ranks are simulated as rank 0 with its share of every shared resource
(sosim.engine.contention.symmetric_shares): the same timeline as every rank of the node simulated, up to the
rounding of summed shares, on the shipped scenarios whose ranks share their host and on a sample of
others; and machines whose ranks are not interchangeable are simulated rank by rank."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.engine import contention
from sosim.hardware.machine import Machine
from sosim.inputs.config import Scenario
from sosim.inputs.errors import SosimError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["h200x2_zero3_offload_llama2.0b", "hgx_zero_infinity_nvme_13b"]
REL = 1e-9


def assert_same_as_every_rank(sc: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    m = Machine.from_scenario(sc)
    assert contention.symmetric_shares(m) is not None
    reduced = simulate(sc)
    with monkeypatch.context() as patch:
        patch.setattr(contention, "symmetric_shares", lambda m: None)
        full = simulate(sc)
    assert np.allclose(reduced.start_s, full.start_s, rtol=REL, atol=1e-12)
    assert np.allclose(reduced.end_s, full.end_s, rtol=REL, atol=1e-12)
    for key, value in full.metrics.items():
        if isinstance(value, float):
            assert math.isclose(reduced.metrics[key], value, rel_tol=REL, abs_tol=1e-12), key
    stretch = {k: float(v) for k, v in full.provenance.items() if k.startswith("contention_")}
    assert stretch, "not vacuous: these ranks contend"
    # The time lost is the same, on the same resources; which of two resources that fill at the same level
    # (a socket's DRAM and the core pool) is named the limit is a tie that rounding breaks either way.
    again = {k: float(v) for k, v in reduced.provenance.items() if k.startswith("contention_")}
    assert set(again) == set(stretch)
    assert math.isclose(sum(again.values()), sum(stretch.values()), rel_tol=1e-5)


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_contended_nodes(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same_as_every_rank(load_scenario(stem, ["model.layers=4"]), monkeypatch)


@st.composite
def contended_nodes(draw: st.DrawFn) -> list[str]:
    base = draw(st.sampled_from(SHIPPED))
    sets = [f"model.layers={draw(st.integers(1, 4))}", f"training.micro_batch={draw(st.integers(1, 4))}"]
    if base.startswith("hgx"):
        sets.append(f"cluster.gpus={draw(st.sampled_from([2, 4, 8]))}")
    if draw(st.booleans()):
        sets.append(f"hardware.node.dram_GBps={draw(st.sampled_from([20, 80, 300]))}")
    if draw(st.booleans()):
        sets.append(f"hardware.link.bidir_GBps={draw(st.sampled_from([30, 60, 200]))}")
    return [base, *sets]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=contended_nodes())
def test_a_sample_of_contended_nodes(case: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        sc = load_scenario(case[0], case[1:])
    except SosimError:
        assume(False)
        return
    m = Machine.from_scenario(sc)
    assume(contention.ranks_share_host(m, True) and contention.symmetric_shares(m) is not None)
    assert_same_as_every_rank(sc, monkeypatch)


def test_shares_count_the_ranks_behind_each_resource() -> None:
    m = Machine.from_scenario(load_scenario("hgx_zero_infinity_nvme_13b"))
    shares = contention.symmetric_shares(m)
    assert shares is not None
    by_name = {rid.name: n for rid, n in shares.items()}
    # Its own link; its socket's DRAM with the 3 other GPUs there; the node's NVMe volume and cores with all 8.
    assert by_name["link0.h2d"] == 1 and by_name["dram0"] == 4 and by_name["nvme.read"] == 8
    assert by_name["cores"] == 8


def test_ranks_that_are_not_interchangeable_are_each_simulated() -> None:
    """Three GPUs of a two-socket node: one socket's DRAM serves two ranks, the other's one."""
    m = Machine.from_scenario(load_scenario("hgx_zero_infinity_nvme_13b", ["cluster.gpus=6"]))
    sockets = sorted(m.rank_socket)
    if sockets.count(0) != sockets.count(1):
        assert contention.symmetric_shares(m) is None
    else:
        pytest.skip(f"this profile places 6 GPUs evenly: {m.rank_socket}")
