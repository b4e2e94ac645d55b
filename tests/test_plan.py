"""The typed plan: every op's fields are enums and numbers the outputs can trust, and the metric schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import tiny_scenario

from sosim import load_scenario, simulate
from sosim.engine.plan import (
    D2H,
    H2D,
    Category,
    Phase,
    Plan,
    Resource,
    ResourceKind,
)
from sosim.engine.simpy_engine import Contention, run_plan
from sosim.hardware import model as tm
from sosim.hardware.model import tokens_per_gpu
from sosim.run.result import METRIC_NAMES, METRICS, link_bytes, metric_schema

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.fixture(scope="module", params=[p.stem for p in SHIPPED])
def shipped(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return simulate(load_scenario(ROOT / "scenarios" / f"{request.param}.yaml", ["training.iterations=3"]))


def test_every_op_is_typed(shipped) -> None:  # type: ignore[no-untyped-def]
    for op in shipped.plan.ops:
        assert isinstance(op.resource, Resource) and isinstance(op.resource.kind, ResourceKind)
        assert isinstance(op.phase, Phase) and isinstance(op.category, Category)
        assert op.n_bytes >= 0 and op.flops >= 0
        # Only GPU compute does FLOPs; only copies and collectives move bytes across their resource.
        if op.flops:
            assert op.resource.kind is ResourceKind.GPU and op.category is Category.COMPUTE
        if op.category is Category.TRANSFER:
            assert op.n_bytes > 0


def test_metrics_follow_the_declared_schema(shipped) -> None:  # type: ignore[no-untyped-def]
    m = shipped.metrics
    assert tuple(m) == METRIC_NAMES
    for name, dtype in metric_schema().items():
        assert isinstance(m[name], dtype), name
    # Link bytes of the measured iteration, by direction, from the ops' typed bytes.
    it = shipped.plan.measured_iteration
    assert m["link_h2d_gb_per_step"] == pytest.approx(link_bytes(shipped.plan, ResourceKind.H2D, it) / 1e9)
    assert m["link_gb_per_step"] == pytest.approx(m["link_h2d_gb_per_step"] + m["link_d2h_gb_per_step"])


def test_provenance_names_system_implementation_profile_calibration(shipped) -> None:  # type: ignore[no-untyped-def]
    p = shipped.provenance
    sc = shipped.scenario
    assert p["system"] == sc.schedule.system
    assert p["profile"] == sc.hardware.name
    assert p["implementation"] in ("ideal", "deepspeed", "n/a")
    paths = [Path(c) for c in sc.hardware.calibration_paths]
    expected = ("none" if not paths else paths[0].name if len(paths) == 1
                else ", ".join(f"{c.parent.name}/{c.name}" for c in paths))
    assert p["calibration"] == expected


def test_metric_schema_has_units() -> None:
    assert len(set(METRIC_NAMES)) == len(METRICS)
    for spec in METRICS:
        if spec.name.endswith("_s") and not spec.name.endswith("_per_s"):
            assert spec.unit == "s"
        if spec.name.endswith("_gib"):
            assert spec.unit == "GiB"


def test_gpu_flops_of_a_step_are_the_hardware_flops_of_the_metrics() -> None:
    # The GPU ops carry exactly the FLOPs the hardware_tflops metric counts (one convention: 2 FLOPs per
    # parameter per token except the untied input-embedding lookup, causal attention, recompute included),
    # so a step at the peak reports the peak and no more. Hand count for the tiny GPT (untied).
    for ckpt in (False, True):
        r = simulate(load_scenario(tiny_scenario({"system": "gpu_only"}, activation_checkpointing=ckpt)))
        sc = r.scenario
        m = sc.model
        tokens = tokens_per_gpu(sc)
        assert not m.tied_embeddings
        counted = tm.total_params(m) - m.vocab * m.hidden
        attention_fwd = 0.5 * 4.0 * tokens * sc.training.seq_len * m.hidden * m.layers
        recompute = (2.0 * tokens * m.layers * tm.layer_params(m) + attention_fwd) if ckpt else 0.0
        expected = 6.0 * counted * tokens + 3.0 * attention_fwd + recompute
        assert tm.hardware_flops_per_step(m, sc.training, tokens) == pytest.approx(expected, rel=1e-12)
        it = r.plan.measured_iteration
        got = sum(op.flops for op in r.plan.ops if op.iteration == it)
        assert got == pytest.approx(expected, rel=1e-12)


def test_phases_of_a_zero_offload_step() -> None:
    r = simulate(load_scenario(tiny_scenario({"system": "zero_offload", "implementation": "ideal", "bucket_mb": 1e6})))
    it = r.plan.measured_iteration
    by_phase: dict[Phase, set[ResourceKind]] = {}
    for op in r.plan.ops:
        if op.iteration == it:
            by_phase.setdefault(op.phase, set()).add(op.resource.kind)
    assert by_phase[Phase.FORWARD] == {ResourceKind.GPU}
    assert ResourceKind.D2H in by_phase[Phase.GRADIENT]
    assert ResourceKind.CPU_OPT in by_phase[Phase.OPTIMIZER]
    assert ResourceKind.H2D in by_phase[Phase.REFRESH]


def test_duplex_slowdown_only_between_directions_of_the_same_link_instance() -> None:
    """A link's bidirectional total is a shared resource of that link only (sosim/engine/contention.py builds one
    per rank's link); the engine contends it. Directions 1 GB/s each, 1 GB/s together: 'down' and 'up link
    0' share it at half speed until 'up' is done (2 s); 'down' then runs its last second alone (3 s)."""
    f = Phase.GRADIENT
    plan = Plan()
    plan.add(D2H, "down link 0", 2.0, phase=f)
    plan.add(Resource(ResourceKind.H2D, 1), "up link 1", 1.0, phase=f)  # another link: full speed
    plan.add(H2D, "up link 0", 1.0, phase=f)  # same link as 'down': half speed while both run
    gb = 1e9
    link = Contention(("link0.bidir", "link1.bidir"), (gb, gb), {0: ((0, gb),), 1: ((1, gb),), 2: ((0, gb),)})
    _start, end = run_plan(plan, link)
    assert end.tolist() == pytest.approx([3.0, 1.0, 2.0], rel=1e-12)


def test_resource_labels() -> None:
    assert Resource(ResourceKind.GPU).label == "gpu"
    assert Resource(ResourceKind.NET, 3).label == "net.3"


def test_plan_rejects_bad_ops() -> None:
    plan = Plan()
    with pytest.raises(ValueError, match="invalid duration"):
        plan.add(H2D, "x", float("nan"), phase=Phase.FORWARD)
    with pytest.raises(ValueError, match="later op"):
        plan.add(H2D, "x", 1.0, [0], phase=Phase.FORWARD)
