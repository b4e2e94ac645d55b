"""Problems as objects (issue 25, errors typed): a ConfigError carries each problem's location, key path,
message and kind, so that a sweep or the tuner acts on them without reading message text."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from sosim import ConfigError, load_scenario
from sosim.inputs.errors import KEY_PATH_KINDS, Problem

GOOD = """\
name: t
hardware: gh200
model: {layers: 2, hidden: 256, heads: 4}
training: {seq_len: 128, micro_batch: 1}
schedule: {system: zero_offload}
"""


def _problems(path: Path, overrides: list[str]) -> tuple[Problem, ...]:
    with pytest.raises(ConfigError) as err:
        load_scenario(path, overrides)
    assert err.value.problems == [str(p) for p in err.value.details]  # the lines are the objects, printed
    return err.value.details


def test_each_problem_says_where_which_key_what_and_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("micro_batch: 1}", "micro_batch: 1, micro_bach: 2}"))
    (unknown,) = _problems(path, [])
    assert (unknown.where, unknown.path, unknown.kind, unknown.overrides) == (
        f"{path}:4", "training.micro_bach", "unknown_key", ())
    assert str(unknown) == f"{path}:4: training.micro_bach: unknown key (check the spelling; see docs/scenarios.md)"
    path.write_text(GOOD)
    (bad,) = _problems(path, ["training.micro_batch=0"])
    assert (bad.where, bad.path, bad.kind, bad.overrides) == (
        "--set training.micro_batch=0", "training.micro_batch", "value", ("training.micro_batch=0",))
    assert bad.what == f"training.micro_batch: {bad.message}" and bad.kind not in KEY_PATH_KINDS


@pytest.mark.parametrize(("override", "kind", "message"), [
    ("model.layers.x.y=1", "not_a_mapping", "'model.layers.x' is not a mapping"),
    ("model.layers.x=1", "cannot_set", "cannot set 'model.layers.x'"),
    ("a..b=1", "empty_key", "empty key in 'a..b'"),
    ("training.micro_batch", "override_syntax", "expected key.path=value"),
])
def test_override_problems_have_their_kind(tmp_path: Path, override: str, kind: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD)
    (problem,) = _problems(path, [override])
    assert (problem.where, problem.path, problem.message, problem.kind, problem.overrides) == (
        f"--set {override}", "", message, kind, (override,))
    assert str(problem) == f"--set {override}: {message}"


def test_a_problem_given_as_text_is_kept_as_it_is() -> None:
    err = ConfigError(["x.yaml:3: a.b: bad", Problem("y.yaml:1", "c", "worse", "value")])
    assert err.problems == ["x.yaml:3: a.b: bad", "y.yaml:1: c: worse"]
    assert err.details[0] == Problem("", "", "x.yaml:3: a.b: bad", "other")
    assert str(err) == "x.yaml:3: a.b: bad\ny.yaml:1: c: worse"


def test_problems_cross_a_process_boundary_as_objects() -> None:
    err = ConfigError([Problem("--set a=1", "a", "bad", "unknown_key", ("a=1",))])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ConfigError and back.details == err.details and back.problems == err.problems
