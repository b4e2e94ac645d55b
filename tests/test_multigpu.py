"""Many-GPU behaviour end to end: shared hosts cost time where they should, every busy resource is in the
breakdown, and the 1,024-GPU cluster runs as one node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sosim import load_scenario, simulate
from sosim.run.result import Result

ROOT = Path(__file__).resolve().parent.parent
MULTI = [
    ROOT / "scenarios" / "alps_gh200x4_superoffload_6.7b.yaml",
    ROOT / "scenarios" / "alps_gh200x1024_zero3_offload_6.7b.yaml",
    ROOT / "scenarios" / "h200x2_zero3_offload_llama2.0b.yaml",
]
X2 = ROOT / "scenarios" / "h200x2_zero3_offload_llama2.0b.yaml"


def _busy_s(r: Result) -> float:
    """Seconds of the steady window during which any op of rank 0 runs (computed from the spans alone)."""
    t0, t1 = r.steady_window_s
    s = np.clip(r.start_s, t0, t1)
    e = np.clip(r.end_s, t0, t1)
    keep = e > s
    bounds = np.unique(np.concatenate([s[keep], e[keep], [t0, t1]]))
    mids = (bounds[:-1] + bounds[1:]) / 2
    active = np.zeros(mids.shape, dtype=bool)
    for a, b in zip(s[keep], e[keep], strict=True):
        active |= (mids >= a) & (mids < b)
    return float(np.diff(bounds)[active].sum())


@pytest.mark.parametrize("path", [*MULTI, X2.with_name("gh200_zero3_offload_4b.yaml")], ids=lambda p: p.stem)
def test_no_busy_resource_lands_in_idle(path: Path) -> None:
    r = simulate(load_scenario(path))
    m = r.metrics
    assert m["idle_s"] == pytest.approx(m["step_time_s"] - _busy_s(r), abs=1e-9)


@pytest.mark.parametrize("system", ["zero_offload", "zero3_offload", "superoffload"])
@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0])
def test_more_shared_dram_bandwidth_never_slows_two_ranks(system: str, factor: float) -> None:
    """Two ranks on the lent machine's one socket: a wider shared resource never makes the step slower, a
    narrower one never faster (strictly slower where the step is contended: ZeRO-2 offload's copies overlap
    its Adam)."""
    # Bound ranks: the cores are split, so the socket's DRAM is what the two ranks contend for.
    sets = [f"schedule={{system: {system}, implementation: deepspeed}}", "cluster.bind_cores_to_rank=true"]
    base = simulate(load_scenario(X2, sets)).metrics["step_time_s"]
    wide = simulate(load_scenario(X2, [*sets, f"hardware.node.dram_GBps={210 * factor}"])).metrics["step_time_s"]
    narrow = simulate(load_scenario(X2, [*sets, f"hardware.node.dram_GBps={210 / factor}"])).metrics["step_time_s"]
    assert wide <= base * (1 + 1e-9)
    assert narrow >= base * (1 - 1e-9)
    if system == "zero_offload":
        assert narrow > base


def test_fewer_cores_never_speed_up_the_lent_machine() -> None:
    steps = [simulate(load_scenario(X2, [f"hardware.cpu.cores={n}"])).metrics["step_time_s"] for n in (32, 16, 8)]
    assert steps == sorted(steps)


def test_dram_contention_is_attributed_on_a_shared_socket() -> None:
    r = simulate(load_scenario(X2, ["schedule={system: zero_offload, implementation: deepspeed}",
                                    "cluster.bind_cores_to_rank=true"]))
    assert float(r.provenance.get("contention_dram0_s", 0.0)) > 0
    assert r.provenance["cpu_threads_per_rank"] == "16"
    # DeepSpeed's launcher binds nothing by default: each rank's pool has every core of the node.
    unbound = simulate(load_scenario(X2, ["schedule={system: zero_offload, implementation: deepspeed}"]))
    assert unbound.provenance["cpu_threads_per_rank"] == "32"


def test_every_resource_kind_has_a_breakdown_bucket() -> None:
    """A resource kind the breakdown does not know would have its time reported as idle."""
    from sosim.engine.plan import ResourceKind
    from sosim.run.result import EXPOSED_ORDER, GPU_KINDS

    covered = set(GPU_KINDS).union(*(kinds for _, kinds, _ in EXPOSED_ORDER))
    assert covered == set(ResourceKind)
