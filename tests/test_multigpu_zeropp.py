"""ZeRO-3 without offload and ZeRO++ (qwZ, hpZ, qgZ): bytes on the wire, where each switch acts, memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from sosim import load_scenario, simulate
from sosim.engine.plan import Phase, ResourceKind
from sosim.hardware.model import total_params
from sosim.run.result import Result

ROOT = Path(__file__).resolve().parent.parent
ALPS = ROOT / "scenarios" / "alps_gh200x4_superoffload_6.7b.yaml"
ZPP = ("schedule={system: zero3, zero_quantized_weights: true, zero_hpz_partition_size: 4, "
       "zero_quantized_gradients: true}")
Z3 = "schedule={system: zero3}"
SMALL = ["model.layers=4"]


def _net_bytes(r: Result, phase: Phase) -> float:
    it = r.plan.measured_iteration
    return sum(o.n_bytes for o in r.plan.ops
               if o.iteration == it and o.resource.kind is ResourceKind.NET and o.phase is phase)


def test_wire_bytes_per_rank_by_hand() -> None:
    """16 GH200 (4 nodes x 4). ZeRO-3: each gather and the reduce-scatter send 15/16 of 2 B x P (the layers'
    and the embedding/head's weights, the gradients). ZeRO++: the forward gather sends int8 (+ an fp32 scale per
    2048 elements); the backward gather 3/4 of 2 B x P inside the node (hpZ = 4); qgZ sends 3/4 of 0.5 B x P
    inside the node and 3/4 of 0.5 B x P / 4 across nodes."""
    z3 = simulate(load_scenario(ALPS, [*SMALL, Z3, "cluster.gpus=16"]))
    zpp = simulate(load_scenario(ALPS, [*SMALL, ZPP, "cluster.gpus=16"]))
    p = total_params(z3.scenario.model)
    assert _net_bytes(z3, Phase.FORWARD) == pytest.approx(15 / 16 * 2 * p, rel=1e-9)
    assert _net_bytes(z3, Phase.BACKWARD) == pytest.approx(15 / 16 * 2 * p, rel=1e-9)
    assert _net_bytes(z3, Phase.GRADIENT) == pytest.approx(15 / 16 * 2 * p, rel=1e-9)
    assert _net_bytes(zpp, Phase.FORWARD) == pytest.approx(15 / 16 * (1 + 4 / 2048) * p, rel=1e-9)
    assert _net_bytes(zpp, Phase.BACKWARD) == pytest.approx(3 / 4 * 2 * p, rel=1e-9)
    assert _net_bytes(zpp, Phase.GRADIENT) == pytest.approx(3 / 4 * 0.5 * p + 3 / 4 * 0.5 * p / 4, rel=1e-9)


def test_qgz_only_across_nodes_and_zeropp_pays_off_across_nodes() -> None:
    one_node = [simulate(load_scenario(ALPS, [*SMALL, s, "cluster.gpus=4"])) for s in (Z3, ZPP)]
    assert "qgZ inactive on one node" in one_node[1].provenance["zeropp"]
    assert _net_bytes(one_node[1], Phase.GRADIENT) == pytest.approx(_net_bytes(one_node[0], Phase.GRADIENT))
    four_nodes = [simulate(load_scenario(ALPS, [*SMALL, s, "cluster.gpus=16"])) for s in (Z3, ZPP)]
    assert four_nodes[1].metrics["step_time_s"] < four_nodes[0].metrics["step_time_s"]


def test_hpz_costs_a_secondary_partition_in_hbm() -> None:
    r = simulate(load_scenario(ALPS, [*SMALL, ZPP, "cluster.gpus=16"]))
    p = total_params(r.scenario.model)
    assert r.memory.gpu_bytes["hpz_secondary_partition"] == pytest.approx(2 * p / 4)
    assert r.memory.cpu_bytes == {}


@pytest.mark.parametrize("nic", [12.5, 25.0, 50.0])
def test_zeropp_gain_shrinks_as_the_network_widens(nic: float) -> None:
    def ratio(bw: float) -> float:
        sets = [*SMALL, "cluster.gpus=64", f"hardware.node.nics.GBps={bw}"]
        z3 = simulate(load_scenario(ALPS, [*sets, Z3])).metrics["step_time_s"]
        return z3 / simulate(load_scenario(ALPS, [*sets, ZPP])).metrics["step_time_s"]

    assert ratio(nic) >= ratio(nic * 4) * (1 - 1e-9)


def test_unfused_quantize_kernels_cost_more() -> None:
    """The measured torch implementation of the quantizers is an upper bound on the fused kernels' cost."""
    sets = [*SMALL, ZPP, "cluster.gpus=16"]
    fused = simulate(load_scenario(ALPS, sets)).metrics["step_time_s"]
    torch = simulate(load_scenario(ALPS, [*sets, "schedule.quantize_kernels=torch"])).metrics["step_time_s"]
    assert torch > fused
