"""``loader.load_derived``: a scenario derived from a validated base by replacing whole sections is the
scenario ``load_scenario`` makes of the same data (same values, same fields set, same errors), without
re-validating the base's hardware profile and model. ``sosim tune`` derives every candidate this way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sosim.inputs.errors import SosimError
from sosim.run.loader import load_derived, load_scenario

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in (ROOT / "scenarios").glob("*.yaml"))
SECTIONS = ("training", "cluster", "schedule")


def _both(path: Path, change: dict[str, dict[str, Any]]) -> tuple[Any, Any]:
    """(load_scenario's outcome, load_derived's) for the base at ``path`` with sections updated by
    ``change``: a Scenario or the error text."""
    base = load_scenario(path)
    data = base.model_dump(mode="python", exclude_unset=True)
    sections = {name: {**data.get(name, {}), **change.get(name, {})} for name in SECTIONS}
    outcomes = []
    for load in (lambda: load_scenario({**data, **sections}), lambda: load_derived(base, sections)):
        try:
            outcomes.append(load())
        except SosimError as exc:
            outcomes.append(str(exc))
    return outcomes[0], outcomes[1]


def _assert_same(full: Any, derived: Any) -> None:
    if isinstance(full, str) or isinstance(derived, str):
        assert full == derived
        return
    assert full == derived
    assert full.model_dump() == derived.model_dump()
    assert full.model_dump(exclude_unset=True) == derived.model_dump(exclude_unset=True)
    for name in type(full).model_fields:
        assert getattr(full, name).__class__ is getattr(derived, name).__class__


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_scenario_derives_to_itself(path: Path) -> None:
    _assert_same(*_both(path, {}))


CHANGES = st.fixed_dictionaries({}, optional={
    "training": st.fixed_dictionaries({}, optional={
        "micro_batch": st.sampled_from([0, 1, 2, 8, -1]),
        "grad_accum": st.sampled_from([1, 4, 10**9]),
        "activation_checkpointing": st.booleans(),
        "gradient_clipping": st.sampled_from([0.0, 1.0, float("inf"), float("nan")]),
    }),
    "cluster": st.fixed_dictionaries({}, optional={
        "gpus": st.sampled_from([1, 2, 3, 8]),
        "sequence_parallel": st.sampled_from([1, 2, 3]),
        "bind_cores_to_rank": st.booleans(),
    }),
    "schedule": st.fixed_dictionaries({}, optional={
        "bucket_mb": st.sampled_from([16.0, 1000.0, -5.0, float("inf")]),
        "gpu_optimizer_fraction": st.sampled_from([0.0, 0.5, 1.5]),
        "no_such_knob": st.just(1),
        "implementation": st.sampled_from(["ideal", "deepspeed", "other"]),
    }),
})


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SHIPPED), CHANGES)
def test_derived_scenarios_and_their_errors_match_the_full_load(path: Path, change: dict[str, Any]) -> None:
    """Valid and invalid changes (bounds, unknown keys, non-finite numbers, too much work, cross-section
    checks): the same scenario, or the same message."""
    _assert_same(*_both(path, change))


def test_a_derived_scenario_reuses_the_validated_profile() -> None:
    base = load_scenario(ROOT / "scenarios" / "gh200_superoffload_8b.yaml")
    derived = load_derived(base, {"training": {**base.training.model_dump(exclude_unset=True), "micro_batch": 2}})
    assert derived.hardware is base.hardware and derived.model is base.model
    assert derived.training.micro_batch == 2 and base.training.micro_batch != 2
