"""cluster.optimizer_socket: a rank's optimizer state and CPU Adam on a neighbour socket (issue 10).

Tiny two-socket nodes whose timelines are computed by hand: one rank's plan is a CPU Adam that moves 10 GB in
1 s (10 GB/s of DRAM traffic, 8 threads) and, separately, a 1 GB host-to-device copy at the 20 GB/s link.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers import SRC, tiny_scenario

from sosim import load_scenario
from sosim.engine.contention import node_plan, ranks_share_host
from sosim.engine.plan import CPU_OPT, H2D, Category, Phase, Plan
from sosim.engine.simpy_engine import run_plan
from sosim.hardware.machine import Machine
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError
from sosim.run.simulate import make_cost_model
from sosim.schedules.registry import SYSTEMS

GB = 1e9
F = Phase.FORWARD


def _scenario(gpu_socket: list[int], placement: Any, dram_GBps: float = 10.0, link_GBps: float = 5.0,
              sockets: int = 2) -> Scenario:
    sc = tiny_scenario({"system": "zero_offload"})
    sc["hardware"]["node"] = {
        "gpus": len(gpu_socket), "cpu_sockets": sockets, "gpu_socket": gpu_socket, "dram_GBps": dram_GBps,
        "socket_link": {"GBps": link_GBps, "latency_us": 0.0, "sources": {"GBps": SRC, "latency_us": SRC}},
        "fabric": {"kind": "nvlink", "GBps": 100.0, "latency_us": 0.0, "sources": {"GBps": SRC, "latency_us": SRC}},
        "sources": {k: SRC for k in ("gpus", "cpu_sockets", "gpu_socket", "dram_GBps")},
    }
    sc["cluster"] = {"gpus": 2, "gpus_per_node": 2, "optimizer_socket": placement}
    return load_scenario(sc)


def _rank0_end_s(sc: Scenario, plan: Plan) -> list[float]:
    """End of each of rank 0's ops when the node (both ranks) runs ``plan`` under contention."""
    m = Machine.from_scenario(sc)
    node, contention, ranks = node_plan(m, plan)
    _start, end = run_plan(node, contention)
    return [float(e) for e in end[::ranks]]


def _adam_plan() -> Plan:
    plan = Plan()
    plan.add(CPU_OPT, "adam", 1.0, phase=F, category=Category.OPTIMIZER, n_bytes=10 * GB)
    return plan


def _copy_plan() -> Plan:
    plan = Plan()
    plan.add(H2D, "h2d", 1 * GB / (20 * GB), phase=F, category=Category.TRANSFER, n_bytes=1 * GB)
    return plan


def test_neighbour_sockets_are_the_idle_ones_first() -> None:
    assert Machine.from_scenario(_scenario([0, 0], "own")).rank_opt_socket == (0, 0)
    assert Machine.from_scenario(_scenario([0, 0], "neighbour")).rank_opt_socket == (1, 1)
    assert Machine.from_scenario(_scenario([0, 1], "neighbour")).rank_opt_socket == (1, 0)
    four = Machine.from_scenario(_scenario([0, 1, 2, 3], "neighbour", sockets=4))
    assert four.rank_opt_socket == (2, 3) and not ranks_share_host(four)


def test_adam_time_halves_when_it_borrows_an_idle_socket() -> None:
    """Both GPUs on socket 0 (10 GB/s of DRAM): the two ranks' Adams share it, 5 GB/s each, 2 s. Rank 1's
    Adam on idle socket 1: each has a socket's 10 GB/s (and 8 cores) to itself, 1 s."""
    assert _rank0_end_s(_scenario([0, 0], "own"), _adam_plan()) == pytest.approx([2.0], rel=1e-9)
    assert _rank0_end_s(_scenario([0, 0], [0, 1]), _adam_plan()) == pytest.approx([1.0], rel=1e-9)
    # "neighbour" sends both to the one idle socket: they share it there instead.
    assert _rank0_end_s(_scenario([0, 0], "neighbour"), _adam_plan()) == pytest.approx([2.0], rel=1e-9)


def test_adam_on_a_busy_neighbour_is_contended() -> None:
    """One GPU per socket: each rank's Adam alone on its socket, 1 s. Rank 0 borrowing socket 1, where rank
    1's Adam runs: two Adams on 10 GB/s and 8 cores, 2 s each."""
    assert _rank0_end_s(_scenario([0, 1], "own"), _adam_plan()) == pytest.approx([1.0], rel=1e-9)
    assert _rank0_end_s(_scenario([0, 1], [1, 1]), _adam_plan()) == pytest.approx([2.0], rel=1e-9)


def test_transfers_to_a_borrowed_socket_pay_the_socket_link() -> None:
    """1 GB over the 20 GB/s link: 0.05 s to its own socket's memory; from a neighbour's memory it also
    crosses the 5 GB/s socket link: 0.2 s. Each rank's copy uses its own direction of a different socket's
    link, so the two do not slow each other."""
    own = _scenario([0, 1], "own", dram_GBps=100.0)
    borrowed = _scenario([0, 1], "neighbour", dram_GBps=100.0)
    assert _rank0_end_s(own, _copy_plan()) == pytest.approx([0.05], rel=1e-9)
    assert _rank0_end_s(borrowed, _copy_plan()) == pytest.approx([0.2], rel=1e-9)
    route = Machine.from_scenario(borrowed).route(0, "host", "hbm", 1)
    assert [r.name for r in route[-2:]] == ["socket_link.out1", "dram1"]


def _rank0_cpu_pools(sc: Scenario) -> dict[str, set[str]]:
    """Shared pools (cores, DRAM) rank 0's CPU ops draw on, by op kind (optimizer or other)."""
    m = Machine.from_scenario(sc)
    plan = SYSTEMS[sc.schedule.system].build_plan(sc, make_cost_model(sc), m)
    node, contention, ranks = node_plan(m, plan)
    out: dict[str, set[str]] = {"optimizer": set(), "other": set()}
    for op in node.ops[::ranks]:
        if op.resource.kind.name.startswith("CPU") and op.id in contention.uses:
            key = "optimizer" if op.category == Category.OPTIMIZER else "other"
            out[key] |= {contention.names[k] for k, _ in contention.uses[op.id]}
    return out


def test_two_ranks_on_a_quad_gh200_node_borrow_the_idle_graces() -> None:
    """2 ranks on an Alps node: with neighbour placement each rank's Adam runs on an idle Grace (sockets 2
    and 3) while its training process keeps its own, so a rank draws on two Graces' cores and LPDDR5X instead
    of one (its host copies go to the neighbour's LPDDR5X, where its optimizer state is), and no two ranks
    share anything (one rank still stands for both)."""
    path = "scenarios/alps_gh200x4_superoffload_6.7b.yaml"
    sets = ["cluster.gpus=2", "model.layers=2"]
    own = load_scenario(path, [*sets, "cluster.optimizer_socket=own"])
    neigh = load_scenario(path, [*sets, "cluster.optimizer_socket=neighbour"])
    m = Machine.from_scenario(neigh)
    assert m.rank_opt_socket == (2, 3) and not ranks_share_host(m)
    pools_own, pools_neigh = _rank0_cpu_pools(own), _rank0_cpu_pools(neigh)
    assert pools_own["optimizer"] == {"cores", "dram0"}
    assert pools_neigh["optimizer"] == {"cores2", "dram2"}
    # The rest of its CPU work here is the training process's host thread: it stays on its own Grace's cores.
    assert "cores0" in pools_neigh["other"] and pools_neigh["other"] <= {"cores0", "dram0"}


def test_four_ranks_on_a_quad_node_borrow_a_busy_neighbour() -> None:
    sc = load_scenario("scenarios/alps_gh200x4_superoffload_6.7b.yaml", ["cluster.optimizer_socket=neighbour"])
    m = Machine.from_scenario(sc)
    assert m.rank_opt_socket == (1, 2, 3, 0) and ranks_share_host(m)


@pytest.mark.parametrize(
    ("placement", "message"),
    [([0], "one socket (0-1) to each of the 2 ranks"), ([0, 2], "one socket (0-1) to each of the 2 ranks")],
)
def test_bad_placements_are_rejected(placement: list[int], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _scenario([0, 1], placement)
    assert message in str(err.value) and "optimizer_socket" in str(err.value)


def test_neighbour_needs_several_sockets() -> None:
    sc: dict[str, Any] = copy.deepcopy(tiny_scenario({"system": "zero_offload"}))
    sc["cluster"] = {"optimizer_socket": "neighbour"}
    with pytest.raises(ConfigError, match="needs a node of several CPU sockets"):
        load_scenario(sc)
