"""The machine as data: node profiles, what each rank reaches, collectives on the topology."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers import SRC, TINY_PROFILE, tiny_scenario

from sosim import load_scenario, simulate
from sosim.costs.collectives import analytic_s, collective_s, inter_node_bytes
from sosim.engine.contention import expand_ranks, node_plan, ranks_share_host
from sosim.engine.plan import GPU, H2D, NET, Phase, Plan
from sosim.hardware.machine import Machine, SharedId
from sosim.inputs.errors import ConfigError
from sosim.inputs.units import MIB
from sosim.run.loader import load_profile

NODE_PROFILES = ["h200x2-pcie-gen5-x86", "gh200x4-alps", "gh200-480gb", "hgx-h100x8-x86"]
SCENARIO = "scenarios/gh200_zero3_offload_4b.yaml"


def _machine(profile: str, *sets: str) -> Machine:
    return Machine.from_scenario(load_scenario(SCENARIO, [f"hardware={profile}", *sets]))


@pytest.mark.parametrize("name", NODE_PROFILES)
def test_node_profiles_load(name: str) -> None:
    p = load_profile(name)
    assert p.node is not None and p.gpus_per_node == p.node.gpus


def test_single_gpu_profiles_keep_their_meaning() -> None:
    """A profile without a node block: one GPU with a private host, all its cores to the rank."""
    m = _machine("h200-pcie-gen5-x86")
    assert m.legacy and m.local_ranks == 1 and m.threads_per_rank == 16
    assert [r.name for r in m.shared_resources()] == ["link0.h2d", "link0.d2h", "link0.bidir"]


def test_h200x2_meanings() -> None:
    """cluster.gpus: 1 = one GPU with all the host's cores; 2 = both GPUs data parallel, each rank's pool on
    every core as DeepSpeed's launcher leaves it (or the cores split with bind_cores_to_rank);
    hardware.cpu.cores=N = only N cores usable."""
    one = _machine("h200x2-pcie-gen5-x86", "cluster.gpus=1")
    assert (one.local_ranks, one.threads_per_rank, one.nodes) == (1, 32, 1)
    two = _machine("h200x2-pcie-gen5-x86", "cluster.gpus=2")
    assert (two.local_ranks, two.threads_per_rank, two.rank_socket) == (2, 32, (0, 0))
    assert ranks_share_host(two)  # one socket's cores and DRAM behind both ranks
    bound = _machine("h200x2-pcie-gen5-x86", "cluster.gpus=2", "cluster.bind_cores_to_rank=true")
    assert bound.threads_per_rank == 16
    limited = _machine("h200x2-pcie-gen5-x86", "cluster.gpus=2", "hardware.cpu.cores=8")
    assert limited.threads_per_rank == 8
    limited_bound = _machine("h200x2-pcie-gen5-x86", "cluster.gpus=2", "hardware.cpu.cores=8",
                             "cluster.bind_cores_to_rank=true")
    assert limited_bound.threads_per_rank == 4
    # Two hosts of one GPU each need a network; the lent machine has none to offer.
    with pytest.raises(ConfigError, match=r"no 'node\.nics'"):
        _machine("h200x2-pcie-gen5-x86", "cluster.gpus=2", "cluster.gpus_per_node=1")
    hosts = _machine("gh200x4-alps", "cluster.gpus=2", "cluster.gpus_per_node=1")
    assert (hosts.nodes, hosts.local_ranks, hosts.threads_per_rank) == (2, 1, 72)


def test_routes_are_typed_ids() -> None:
    m = _machine("hgx-h100x8-x86", "cluster.gpus=8")
    assert m.rank_socket == (0, 0, 0, 0, 1, 1, 1, 1)
    assert m.route(5, "host", "hbm") == (SharedId("link", 5, "h2d"), SharedId("link", 5, "bidir"), SharedId("dram", 1))
    # CPU memory of the other socket: the copy also crosses the socket link.
    assert [r.name for r in m.route(5, "host", "hbm", socket=0)] == ["link5.h2d", "link5.bidir", "socket_link.out0",
                                                                     "dram0"]
    # No GPUDirect Storage: NVMe -> HBM bounces through host memory.
    assert [r.name for r in m.route(0, "nvme", "hbm")] == ["nvme.read", "link0.h2d", "link0.bidir", "dram0"]
    # Every id a route gives is one of the node's shared resources.
    ids = {r.id for r in m.shared_resources()}
    assert set(m.route(5, "host", "hbm", socket=0)) <= ids and set(m.route(0, "hbm", "nvme")) <= ids
    names = {r.name for r in m.shared_resources()}
    assert {"dram0", "dram1", "nvme.read", "nvme.write", "nic7", "cores"} <= names


def test_alps_ranks_share_nothing_and_1024_gpus_are_256_nodes() -> None:
    m = _machine("gh200x4-alps", "cluster.gpus=1024")
    assert (m.nodes, m.local_ranks, m.rank_socket) == (256, 4, (0, 1, 2, 3))
    assert not ranks_share_host(m)  # each Superchip has its own Grace, C2C and NIC: one rank stands for all


def _tiny_node(**node: Any) -> dict[str, Any]:
    prof = copy.deepcopy(TINY_PROFILE)
    prof["node"] = {"gpus": 2, "sources": {"gpus": SRC}, **node}
    return prof


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"gpu_socket": [0], "sources": {"gpus": SRC, "gpu_socket": SRC}}, "one socket per GPU"),
        ({"uplinks": [{"gpus": [0], "h2d_GBps": 1, "d2h_GBps": 1, "bidir_GBps": 1,
                       "sources": {k: SRC for k in ("gpus", "h2d_GBps", "d2h_GBps", "bidir_GBps")}}]},
         "two or more distinct GPUs"),
        ({"cpu_sockets": 2, "sources": {"gpus": SRC, "cpu_sockets": SRC}}, "socket_link"),
        ({"dram_GBps": 100}, "no source given for dram_GBps"),
    ],
)
def test_bad_node_blocks_are_rejected_with_the_key(node: dict[str, Any], message: str) -> None:
    sc = tiny_scenario({"system": "zero_offload"})
    sc["hardware"] = _tiny_node(**node)
    with pytest.raises(ConfigError) as err:
        load_scenario(sc)
    assert message in str(err.value) and "hardware.node" in str(err.value)


def test_more_gpus_per_node_than_the_node_has_is_an_error() -> None:
    with pytest.raises(ConfigError, match="gpus_per_node"):
        load_scenario(SCENARIO, ["hardware=h200x2-pcie-gen5-x86", "cluster.gpus=4", "cluster.gpus_per_node=4"])


# ---- collectives ----------------------------------------------------------------------------------------------
def test_intra_node_ring_by_hand() -> None:
    m = _machine("hgx-h100x8-x86", "cluster.gpus=2")
    n = 1e9
    # all-reduce: 2 (n-1)/n of the buffer over NVSwitch's 450 GB/s, plus the fabric's 10 us.
    assert collective_s(m, "all_reduce", n, 2) == pytest.approx(10e-6 + 2 * 0.5 * n / 450e9, rel=1e-12)
    assert collective_s(m, "all_gather", n, 2) == pytest.approx(10e-6 + 0.5 * n / 450e9, rel=1e-12)
    assert collective_s(m, "all_reduce", n, 1) == 0.0


def test_measured_nccl_curve_inside_a_node() -> None:
    """The lent machine's two GPUs: a 1 GiB all-gather at its measured bus bandwidth, 262.3 GB/s."""
    m = _machine("h200x2-pcie-gen5-x86", "cluster.gpus=2")
    gib = float(1 << 30)
    assert collective_s(m, "all_gather", gib, 2) == pytest.approx(0.5 * gib / 262.314e9, rel=1e-9)


def test_alps_measured_curve_is_reproduced_where_it_was_measured() -> None:
    """Two Alps nodes x 4 GH200, 128 MiB all-reduce: the measured busbw 122.57 GB/s, exactly."""
    m = _machine("gh200x4-alps", "cluster.gpus=8")
    s = 128 * MIB
    assert collective_s(m, "all_reduce", s, 8, 4) == pytest.approx(2 * 7 / 8 * s / 122.57e9, rel=1e-9)
    # Across 256 nodes the analytic scaling carries the same measured correction.
    big = _machine("gh200x4-alps", "cluster.gpus=1024")
    ratio = collective_s(m, "all_reduce", s, 8, 4) / analytic_s(m, "all_reduce", s, 8, 4)
    assert collective_s(big, "all_reduce", s, 1024, 4) == pytest.approx(
        analytic_s(big, "all_reduce", s, 1024, 4) * ratio, rel=1e-12)
    # Each rank sends (N-1)/N of its quarter of the buffer, twice, across the network.
    assert inter_node_bytes(big, "all_reduce", s, 1024, 4) == pytest.approx(2 * 255 / 256 * s / 4)


def test_collective_monotone_in_size_and_nic_bandwidth() -> None:
    m = _machine("gh200x4-alps", "cluster.gpus=16")
    sizes = [2**k for k in range(10, 34)]
    times = [collective_s(m, "reduce_scatter", s, 16, 4) for s in sizes]
    assert times == sorted(times)
    fast = _machine("gh200x4-alps", "cluster.gpus=16", "hardware.node.nics.GBps=50")
    assert collective_s(fast, "all_gather", 1e9, 16, 4) < collective_s(m, "all_gather", 1e9, 16, 4)


# ---- expanding a plan to the node's ranks ---------------------------------------------------------------------
def test_expand_ranks_gives_each_rank_its_resources_and_syncs_collectives() -> None:
    plan = Plan()
    a = plan.add(GPU, "fwd", 1.0, phase=Phase.FORWARD)
    c = plan.add(H2D, "copy", 2.0, [a], phase=Phase.FETCH)
    plan.add(NET, "allgather", 0.5, [c], phase=Phase.FETCH)
    plan.mark_iteration_start(a)
    node = expand_ranks(plan, 2)
    assert [(o.id, str(o.resource), o.deps) for o in node.ops] == [
        (0, "gpu", ()), (1, "gpu.1", ()), (2, "h2d", (0,)), (3, "h2d.1", (1,)),
        (4, "net", (2, 3)), (5, "net.1", (2, 3)),  # a collective starts when the last rank is there
    ]
    assert node.iteration_starts == [0]


def test_shared_uplink_costs_time_and_is_attributed() -> None:
    """Two GPUs behind one uplink as wide as one GPU's port: the data-parallel ZeRO-Offload step is slower
    than with private ports, and the extra time is charged to the uplink."""
    uplink = {"gpus": [0, 1], "h2d_GBps": 20.0, "d2h_GBps": 20.0, "bidir_GBps": 40.0,
              "sources": {k: SRC for k in ("gpus", "h2d_GBps", "d2h_GBps", "bidir_GBps")}}
    fabric = {"kind": "nvlink", "GBps": 100.0, "latency_us": 0.0, "sources": {"GBps": SRC, "latency_us": SRC}}
    base = tiny_scenario({"system": "zero3_offload", "implementation": "ideal"}, iterations=3)
    base["model"]["layers"] = 4
    base["cluster"] = {"gpus": 2, "bind_cores_to_rank": True}  # cores split: only the uplink is shared
    private = copy.deepcopy(base)
    private["hardware"] = _tiny_node(fabric=fabric)
    shared = copy.deepcopy(base)
    shared["hardware"] = _tiny_node(fabric=fabric, uplinks=[uplink])
    r_private = simulate(load_scenario(private))
    r_shared = simulate(load_scenario(shared))
    assert r_shared.metrics["step_time_s"] > r_private.metrics["step_time_s"]
    assert any(k.startswith("contention_uplink0") for k in r_shared.provenance)
    assert not any(k.startswith("contention_") for k in r_private.provenance)


def test_node_plan_simulates_one_rank_when_ranks_share_nothing() -> None:
    sc = load_scenario(SCENARIO, ["hardware=gh200x4-alps", "cluster.gpus=8", "model.layers=4"])
    m = Machine.from_scenario(sc)
    from sosim.run.simulate import make_cost_model
    from sosim.schedules.registry import SYSTEMS

    plan = SYSTEMS[sc.schedule.system].build_plan(sc, make_cost_model(sc), m)
    node, _, ranks = node_plan(m, plan)
    assert len(node.ops) == len(plan.ops) and ranks == 1


def test_nvme_throughput_follows_littles_law() -> None:
    """HGX volume: 8 drives, 48 GB/s read, 100 us per I/O. A 1 MiB block on one drive (6 GB/s) takes
    100 us + 174.8 us; 8 in flight move 8 MiB per 274.8 us = 30.5 GB/s, below the volume's 48: DeepSpeed's
    default queue depth leaves drives idle. Depth 32 saturates the volume."""
    from sosim.hardware.machine import nvme_s, nvme_throughput_Bps

    m = _machine("hgx-h100x8-x86", "cluster.gpus=8")
    block = 1 << 20
    block_s = 100e-6 + block / 6e9
    assert nvme_throughput_Bps(m, write=False) == pytest.approx(8 * block / block_s, rel=1e-12)
    assert nvme_throughput_Bps(m, write=False, queue_depth=32) == pytest.approx(48e9, rel=1e-12)
    assert nvme_s(m, 1e9, write=True) == pytest.approx(100e-6 + 1e9 / min(26e9, 8 * block / (100e-6 + block / 3.25e9)))
    with pytest.raises(ValueError, match="no NVMe"):
        nvme_throughput_Bps(_machine("gh200x4-alps"), write=False)
