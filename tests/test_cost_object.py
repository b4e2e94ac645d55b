"""The one cost object (sosim/costs/model.py): its cache, its topology, and that every system asks it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sosim import load_scenario
from sosim.answers.bands import sampled_cost_models
from sosim.costs import collectives
from sosim.costs.analytic import AnalyticCostModel, CollectiveKind
from sosim.costs.model import Costs
from sosim.engine.plan import Plan, ResourceKind
from sosim.hardware.machine import Machine, nvme_s
from sosim.inputs.config import Scenario
from sosim.run.simulate import make_cost_model, make_costs, simulate
from sosim.schedules.registry import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent
ZEROPP = ROOT / "scenarios" / "dgx2x24_zeropp_18b.yaml"  # legacy profile (interconnect), 16 GPUs per node
NVME = ROOT / "scenarios" / "hgx_zero_infinity_nvme_13b.yaml"  # node block with an NVMe volume
MEASURED = ROOT / "scenarios" / "h200_x86_llama1.1b_zero2_measured.yaml"  # a calibration table with spread


@dataclass(frozen=True)
class _Counting(AnalyticCostModel):
    """The analytic model, counting how often each cost is computed."""

    calls: dict[str, int] = field(default_factory=dict, compare=False)

    def copy_s(self, n_bytes: float, direction: Any, pinned: bool) -> float:
        self.calls["copy_s"] = self.calls.get("copy_s", 0) + 1
        return super().copy_s(n_bytes, direction, pinned)


class _SlowNet(Costs):
    """The cost object with every collective twice as long."""

    def collective_s(self, kind: CollectiveKind, n_bytes: float, ranks: int, per_node: int | None = None) -> float:
        return 2.0 * super().collective_s(kind, n_bytes, ranks, per_node)


class _SlowDisk(Costs):
    """The cost object with every disk access twice as long."""

    def disk_s(self, n_bytes: float, write: bool, block_bytes: float = 1 << 20, queue_depth: int = 8,
               threads: int = 1) -> float:
        return 2.0 * super().disk_s(n_bytes, write, block_bytes, queue_depth, threads)


def _plan(sc: Scenario, costs: Costs) -> Plan:
    assert costs.machine is not None
    return SYSTEMS[sc.schedule.system].build_plan(sc, costs, costs.machine)


def _durations(plan: Plan, kinds: tuple[ResourceKind, ...]) -> list[float]:
    return [op.duration_s for op in plan.ops if op.resource.kind in kinds]


def test_each_distinct_call_is_computed_once() -> None:
    sc = load_scenario(NVME, ["model.layers=2"])
    inner = make_cost_model(sc)
    counting = _Counting(inner.hw, inner.model, inner.training, inner.tokens_per_gpu)
    costs = Costs(counting, Machine.from_scenario(sc))
    first = costs.copy_s(1e6, "h2d", True)
    assert costs.copy_s(1e6, "h2d", True) == first == counting.copy_s(1e6, "h2d", True)
    assert counting.calls["copy_s"] == 2  # one through the object (then cached), one direct
    costs.copy_s(2e6, "h2d", True)
    costs.copy_s(1e6, "d2h", True)
    assert counting.calls["copy_s"] == 4 and costs.cache_sizes() == {"copy_s": 3}


def test_every_cost_of_the_object_is_cached_and_a_components_cost() -> None:
    """The object the systems are given (no protocol besides it): each cost it offers has its cache, and is
    the components' cost of that name (the analytic model's, a table model's override)."""
    offered = {n for n in vars(Costs) if n.endswith("_s") and not n.startswith("_")}
    sc = load_scenario(NVME, ["model.layers=2"])
    costs = make_costs(sc)
    assert offered == set(costs._cache)  # one explicit dict per cost the schedules may ask
    assert all(callable(getattr(AnalyticCostModel, n, None)) for n in offered)
    assert "__getattr__" not in vars(Costs)  # no attribute interception: every method is written out


def test_collectives_run_on_the_node_topology() -> None:
    sc = load_scenario(NVME)  # 8 GPUs in one node: the fabric (or its measured NCCL curve)
    m = Machine.from_scenario(sc)
    costs = make_costs(sc)
    assert costs.topology and costs.provenance["collectives"].startswith("topology")
    n = 256e6
    assert costs.collective_s("all_gather", n, 8) == collectives.collective_s(m, "all_gather", n, 8, 8)
    assert costs.collective_s("all_gather", n, 1) == 0.0
    # Explicit groups: 4 ranks of 2 per node (as hpZ / qgZ shape them) is the two-level model at that shape.
    assert costs.collective_s("reduce_scatter", n, 4, 2) == collectives.collective_s(m, "reduce_scatter", n, 4, 2)


def test_legacy_profile_keeps_its_ring_unless_the_schedule_shapes_the_group() -> None:
    sc = load_scenario(ZEROPP)
    m = Machine.from_scenario(sc)
    assert m.legacy
    costs = make_costs(sc)
    ring = costs.components.collective_s("all_gather", 1e8, 32)
    assert costs.collective_s("all_gather", 1e8, 32) == ring
    assert "collectives" not in costs.provenance
    assert costs.collective_s("all_gather", 1e8, 32, 16) == collectives.collective_s(m, "all_gather", 1e8, 32, 16)


def test_zero3_collectives_go_through_the_cost_object() -> None:
    # Before the cost object ZeRO-3 timed its gathers and reduce-scatters on the machine directly: a cost
    # model's collectives (and so tables, what-if and bands) never reached them.
    sc = load_scenario(ZEROPP, ["model.layers=2", "cluster.gpus=32"])  # 2 nodes: qgZ's all-to-alls are on
    m = Machine.from_scenario(sc)
    plain, slow = _plan(sc, make_costs(sc)), _plan(sc, _SlowNet(make_cost_model(sc), m))
    a, b = _durations(plain, (ResourceKind.NET,)), _durations(slow, (ResourceKind.NET,))
    assert len(a) == len(b) > 0 and any(x > 0 for x in a)
    assert b == pytest.approx([2.0 * x for x in a], rel=1e-12)
    assert {op.name.split(":")[0] for op in plain.ops if op.resource.kind is ResourceKind.NET} >= {
        "allgather_fwd", "qgz_all_to_all_intra", "qgz_all_to_all_inter"}


def test_nvme_tier_goes_through_the_cost_object() -> None:
    sc = load_scenario(NVME, ["model.layers=2"])
    m = Machine.from_scenario(sc)
    costs = make_costs(sc)
    plain, slow = _plan(sc, costs), _plan(sc, _SlowDisk(make_cost_model(sc), m))
    kinds = (ResourceKind.NVME_READ, ResourceKind.NVME_WRITE)
    a, b = _durations(plain, kinds), _durations(slow, kinds)
    assert len(a) == len(b) > 0
    assert b == pytest.approx([2.0 * x for x in a], rel=1e-12)
    # The volume at the scenario's aio settings (DeepSpeed's defaults here), by hand from nvme_s.
    read = next(op for op in plain.ops if op.resource.kind is ResourceKind.NVME_READ and op.n_bytes > 0)
    assert read.duration_s == nvme_s(m, read.n_bytes, False)
    assert costs.cache_sizes()["disk_s"] >= 2  # reads and writes of several sizes, each computed once


def test_band_replays_are_cost_objects_on_sampled_tables() -> None:
    sc = load_scenario(MEASURED)
    base = make_costs(sc)
    replays = list(sampled_cost_models(sc, 2, seed=4))
    for costs in replays:
        assert isinstance(costs, Costs) and costs.machine is not None
        table = costs.measured_table()
        assert table is not None and table is not base.measured_table()  # the replay's own draw
    assert replays[0].layer_fwd_s() != replays[1].layer_fwd_s()
    # A replay's object is what simulate() runs: the same object gives the same result twice (cache hits).
    r1, r2 = simulate(sc, costs=replays[0]), simulate(sc, costs=replays[0])
    assert r1.metrics == r2.metrics


def test_the_default_object_is_what_simulate_uses() -> None:
    sc = load_scenario(ZEROPP, ["model.layers=2"])
    assert simulate(sc).metrics == simulate(sc, costs=make_costs(sc)).metrics
    assert math.isfinite(simulate(sc).metrics["step_time_s"])


def test_zeropp_quantization_kernels_are_the_cost_objects() -> None:
    sc = load_scenario(ZEROPP)  # V100: 900 GB/s HBM2 (its profile)
    costs = make_costs(sc)
    hbm_GBps = sc.hardware.gpu.hbm_GBps
    # torch kernels: the H200's measured 1.520576 ms per 99,999,744 elements (int8 quantize) at 4.8 TB/s, by HBM.
    by_hand = 1e8 * 1.520576e-3 / 99_999_744 * 4800.0 / hbm_GBps
    assert costs.gpu_quantize_s(1e8, "int8", fused=False) == pytest.approx(by_hand, rel=1e-12)
    # fused int4 quantize: read 2 B + write 0.5 B per element, at the rate of a 6 B per element GPU cast.
    assert costs.gpu_quantize_s(1e8, "int4", fused=True) == pytest.approx(costs.gpu_cast_s(1e8) * 2.5 / 6.0,
                                                                          rel=1e-12)
    small = load_scenario(ZEROPP, ["model.layers=2", "cluster.gpus=32"])
    small_costs = make_costs(small)
    plan = _plan(small, small_costs)
    quant = [op for op in plan.ops if op.name.startswith(("qwz_", "qgz_quantize", "qgz_dequantize"))]
    assert quant and small_costs.cache_sizes()["gpu_quantize_s"] >= 3  # asked of the object, each size once
