"""Per-system plan snapshots (issue 25 item 4): each system's one-iteration plan (the template its runs repeat) on
a two-layer model, one op a line, in tests/golden/plans/<system>.txt, so that a change to a block is reviewed as
a diff of ops. A deliberate change regenerates them with ``pytest tests/test_plan_snapshots.py --update-golden``
(and the diff is reviewed in the commit, as the golden table's is).

A line: ``id resource name duration_s [deps] phase category layer n_bytes flops group``; a dependency ``d < 0`` is a
carry slot (an earlier iteration's ops, :class:`sosim.engine.plan.Template`). Durations are printed to 4
significant digits: the snapshot is about the ops and their order; the golden table holds the numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sosim import load_scenario
from sosim.engine.plan import Op
from sosim.hardware.machine import Machine
from sosim.run.simulate import make_costs
from sosim.schedules.registry import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "tests" / "golden" / "plans"
SIZE = ("model.layers=2",)
# The shipped scenario each system's snapshot starts from; a system not named here: the first shipped scenario
# that runs it (by file name).
BASES = {"gpu_only": "gh200_gpu_only_2b", "zero_offload": "gh200_zero_offload_4b",
         "zero3_offload": "gh200_zero3_offload_4b", "zero_infinity": "gh200_zero_infinity_13b",
         "superoffload": "gh200_superoffload_deepspeed_8b", "zero_infinity_nvme": "hgx_zero_infinity_nvme_13b",
         "zero3": "dgx2x24_zeropp_18b"}


def _base(system: str) -> str | None:
    if system in BASES:
        return BASES[system]
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if (yaml.safe_load(path.read_text()).get("schedule") or {}).get("system") == system:
            return path.stem
    return None


def _line(op: Op) -> str:
    return (f"{op.id} {op.resource.label} {op.name} {op.duration_s:.4g} [{','.join(map(str, op.deps))}] "
            f"{op.phase.value} {op.category.value} {op.layer} {op.n_bytes:.4g} {op.flops:.4g} {op.group}")


def snapshot(system: str, base: str) -> str:
    impls = list(SYSTEMS[system].presets) or [None]
    out = [f"# {system}: scenarios/{base}.yaml with {' '.join(SIZE)}, the one-iteration template of each "
           "implementation", "# id resource name duration_s [deps] phase category layer n_bytes flops group"]
    for impl in impls:
        sc = load_scenario(base, [*SIZE, *([f"schedule.implementation={impl}"] if impl else [])])
        machine = Machine.from_scenario(sc)
        plan = SYSTEMS[system].build_plan(sc, make_costs(sc, machine=machine), machine)
        template = plan.template
        assert template is not None, "every system's plan repeats one iteration (sosim/schedules/blocks/driver.py)"
        out.append(f"## {impl or 'the one implementation'}: {len(template.ops)} ops, {plan.copies} copies; "
                   f"lag {dict(sorted(template.lag.items()))}; optimizer core share {plan.optimizer_core_share:g}")
        out += [_line(op) for op in template.ops]
        out += [f"carry {slot} <- {list(refs)}" for slot, refs in sorted(template.carry_out.items())]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_plan_snapshot(system: str, request: pytest.FixtureRequest) -> None:
    base = _base(system)
    if base is None:
        pytest.skip(f"no shipped scenario runs {system}")
    fresh = snapshot(system, base)
    path = PLANS / f"{system}.txt"
    if request.config.getoption("--update-golden"):
        PLANS.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh)
        pytest.skip("plan snapshot rewritten")
    assert path.exists(), f"no snapshot of {system}: run pytest tests/test_plan_snapshots.py --update-golden"
    old, new = path.read_text().splitlines(), fresh.splitlines()
    changed = [f"line {i + 1}: {a!r} -> {b!r}" for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b]
    assert old == new, (f"{system}'s plan changed ({len(old)} -> {len(new)} lines; review the diff after "
                        "--update-golden):\n" + "\n".join(changed[:20]))


def test_the_snapshots_are_of_the_registered_systems() -> None:
    stale = sorted(p.stem for p in PLANS.glob("*.txt") if p.stem not in SYSTEMS)
    assert not stale, f"snapshots of systems that no longer exist: {stale}"
