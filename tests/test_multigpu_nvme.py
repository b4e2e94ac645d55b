"""ZeRO-Infinity on the NVMe tier: bytes per step, the aio settings, and NVMe time in breakdown and trace."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from sosim import load_scenario, simulate
from sosim.engine.plan import ResourceKind
from sosim.hardware.model import layer_params, total_params
from sosim.run.result import Result

ROOT = Path(__file__).resolve().parent.parent
NVME = ROOT / "scenarios" / "hgx_zero_infinity_nvme_13b.yaml"
SMALL = ["model.layers=8"]


def _nvme_bytes(r: Result, kind: ResourceKind) -> float:
    it = r.plan.measured_iteration
    return sum(op.n_bytes for op in r.plan.ops if op.iteration == it and op.resource.kind is kind)


def test_bytes_per_step_are_deepspeeds() -> None:
    """Per rank and step: read 16 B/param of optimizer state + the bf16 partition twice (forward, backward);
    write 4 B/param of gradients, 12 B/param of state and the updated bf16 partition."""
    r = simulate(load_scenario(NVME, SMALL))
    sc = r.scenario
    shard = total_params(sc.model) / 8
    layer_shard = layer_params(sc.model) * sc.model.layers / 8
    assert _nvme_bytes(r, ResourceKind.NVME_READ) == pytest.approx(16 * shard + 2 * 2 * layer_shard, rel=1e-9)
    assert _nvme_bytes(r, ResourceKind.NVME_WRITE) == pytest.approx((4 + 12 + 2) * shard, rel=1e-9)


def test_nvme_time_is_in_the_breakdown_and_the_trace(tmp_path: Path) -> None:
    from sosim.formats.trace import write_trace

    r = simulate(load_scenario(NVME, SMALL))
    assert r.metrics["exposed_nvme_s"] > 0
    assert r.metrics["idle_s"] == pytest.approx(0.0, abs=1e-9)
    out = tmp_path / "t.json"
    write_trace(r, out)
    names = {e.get("args", {}).get("name") for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "M"}
    assert {"NVMe reads", "NVMe writes"} <= names


@pytest.mark.parametrize("knob", ["hardware.node.nvme.read_GBps", "hardware.node.nvme.write_GBps"])
def test_a_faster_volume_never_slows_the_step(knob: str) -> None:
    base = simulate(load_scenario(NVME, SMALL)).metrics["step_time_s"]
    value = 96 if "read" in knob else 52
    fast = simulate(load_scenario(NVME, [*SMALL, f"{knob}={value}"])).metrics["step_time_s"]
    assert fast < base


def test_aio_depth_and_pipelining_help_until_the_volume_saturates() -> None:
    steps = [simulate(load_scenario(NVME, [*SMALL, f"schedule.aio_queue_depth={d}"])).metrics["step_time_s"]
             for d in (1, 4, 8, 32)]
    # Deeper queues never slow a step; one in flight leaves the volume idle; from depth 4 on the eight ranks
    # together saturate the volume and the engine's sharing, not the queue, sets the time.
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(steps)) and steps[0] > 1.2 * steps[-1]
    plain = simulate(load_scenario(NVME, SMALL)).metrics["step_time_s"]
    piped = simulate(load_scenario(NVME, [*SMALL, "schedule.pipeline_read=true", "schedule.pipeline_write=true"]))
    assert piped.metrics["step_time_s"] <= plain


def test_state_that_does_not_fit_the_volume_is_infeasible() -> None:
    r = simulate(load_scenario(NVME, [*SMALL, "hardware.node.nvme.capacity_gib=10"]))
    assert not r.metrics["feasible"] and "NVMe" in r.metrics["reason"]


def test_nvme_system_on_a_profile_without_nvme_is_a_clear_error() -> None:
    from sosim.inputs.errors import ConfigError

    with pytest.raises(ConfigError, match=r"no 'node\.nvme' volume"):
        load_scenario(NVME, ["hardware=gh200x4-alps", "cluster.gpus=4"])
