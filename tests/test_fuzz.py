"""Structure-aware fuzzing of everything a user feeds sosim: scenario files, hardware profiles, sweep files and
``--set`` overrides.

Each input starts from a valid file and is damaged the way a user (or a bad editor) would: values replaced
by other types, extremes, inf/NaN, unknown or missing keys, duplicate keys, aliases that expand or recurse,
bytes that are not UTF-8, truncation. The contract, for every input:

- no traceback and no internal error: the exit status is 0 (a result) or 2 (an input problem);
- a result never holds a non-finite number (every metric of ``--format json`` is a finite number);
- every problem line names the file and line (``file:line: key: message``) or the override (``--set ...``);
  the one exception is a result that came out non-finite, which names the file (no single key is to blame).

Command lines of tune, validate, compare, calibrate, run and sweep are fuzzed too (their options and values:
bounds, unwritable outputs, hostile numbers); each example must also end within ``FUZZ_SECONDS``.

The fast run (``python -m pytest tests/test_fuzz.py``) tries a few dozen inputs of each kind; the full run
(``--slow``, ``FUZZ_EXAMPLES`` per kind, 2,500 by default: 10,000 files and overrides plus 2,500 command lines)
is run by hand. Issue 26's classes (YAML tags, FIFOs and devices on every route, list-form tables, damaged
``--resume`` files, huge and tiny physical constants, outputs over existing files) have their own generator in
tests/test_fuzz_hostile.py; this one mixes them in too (tags in the text, FIFOs, links and the user's files as
command-line paths) and checks that a feasible result is plausible (a step under a day, usable memory above
zero) and that no input file changes. FUZZ_TALLY=FILE appends one JSON line per example (docs/limits.md).

Why this module is over 500 lines: the mutators, the contract checks and the drivers of every input kind (scenario,
profile, --set, sweep file, command options) share one corpus and one contract; the slow variants are the same cases
at larger counts.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from helpers import TINY_PROFILE
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.answers.sweep import ERROR_COLUMN, load_sweep, point_id, sweep
from sosim.cli import main
from sosim.formats.output import non_finite_metrics
from sosim.inputs.errors import ConfigError, SosimError

FAST_EXAMPLES = 40
SLOW_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "2500"))


def _settings(n: int) -> Callable[[Any], Any]:
    return settings(max_examples=n, deadline=None, database=None, derandomize=n == FAST_EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------------------------------ inputs

# A small valid scenario: simulations take milliseconds, so thousands of examples stay affordable.
SCENARIO: dict[str, Any] = {
    "name": "fuzz",
    "hardware": "profile.yaml",
    "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1024},
    "training": {"seq_len": 128, "micro_batch": 2},
    "schedule": {"system": "zero_offload", "bucket_mb": 16},
}
PROFILE: dict[str, Any] = copy.deepcopy(TINY_PROFILE)

SCENARIO_KEYS = [
    "name", "hardware", "model", "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn",
    "model.ffn_kind", "model.vocab", "model.tied_embeddings", "training", "training.seq_len",
    "training.micro_batch", "training.grad_accum", "training.iterations", "training.activation_checkpointing",
    "training.gradient_clipping", "training.clip_rate", "training.loss_chunk_tokens", "training.precision",
    "schedule", "schedule.system", "schedule.implementation", "schedule.bucket_mb", "schedule.dpu",
    "schedule.cpu_adam", "schedule.cpu_adam_core_fraction", "schedule.sub_group_elements",
    "schedule.gpu_optimizer_fraction", "schedule.weight_placement", "schedule.cast", "schedule.speculation",
    "schedule.prefetch_layers", "cluster", "cluster.gpus", "cluster.sequence_parallel", "cluster.data_parallel",
    "hardware.gpu.peak_bf16_tflops", "hardware.gpu.hbm_gib", "hardware.gpu.gemm_efficiency",
    "hardware.link.h2d_GBps", "hardware.link.latency_us", "hardware.cpu.cores", "hardware.calibration",
    "hardware.cpu.adam_s_by_gparams.cpu_adam", "nosuch", "model.nosuch",
]
PROFILE_KEYS = [
    "name", "gpu", "gpu.peak_bf16_tflops", "gpu.hbm_gib", "gpu.hbm_GBps", "gpu.hbm_efficiency", "gpu.reserved_gib",
    "gpu.gemm_efficiency", "gpu.attention_efficiency", "gpu.layer_overhead_us", "gpu.sources",
    "gpu.sources.hbm_gib", "cpu.cores", "cpu.mem_gib", "cpu.adam_s_by_gparams", "cpu.adam_s_by_gparams.cpu_adam",
    "cpu.cast_GBps", "cpu.reserved_gib", "link.kind", "link.h2d_GBps", "link.bidir_GBps", "link.pageable_factor",
    "link.latency_us", "interconnect", "calibration", "nosuch",
]
WORDS = ["gpu_only", "zero_offload", "zero3_offload", "zero_infinity", "superoffload", "ideal", "deepspeed",
         "cpu_adam", "grace_adam", "torch", "gelu", "swiglu", "pcie", "c2c", "inf", "-inf", "nan", "1e999",
         "gh200", "nosuch-profile", "../x.csv", "", " ", "0x10", "1_000", "~", "null"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 2, 3, 4, 8, 64, 100_000, 10**9, -1, 0.5, 1e-300, 1e300, 1.7e308, -0.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    st.text(max_size=8),
)
hostile = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
# Values a careful user would write, so that a good share of the inputs load and run (and their results are
# checked for non-finite numbers) while the rest probe the error paths.
plausible = st.one_of(
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=0.001, max_value=1e4),
    st.booleans(),
    st.sampled_from(["zero_offload", "superoffload", "zero3_offload", "zero_infinity", "gpu_only", "ideal",
                     "deepspeed", "cpu_adam", "torch", "gelu", "swiglu", "gh200"]),
)
values = st.one_of(plausible, plausible, hostile)


def _set(data: dict[str, Any], dotted_key: str, value: Any) -> None:
    node: Any = data
    parts = dotted_key.split(".")
    for p in parts[:-1]:
        if not isinstance(node, dict):
            return
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    if isinstance(node, dict):
        node[parts[-1]] = value


def _delete(data: dict[str, Any], dotted_key: str) -> None:
    node: Any = data
    parts = dotted_key.split(".")
    for p in parts[:-1]:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(parts[-1], None)


edit = st.tuples(st.sampled_from(["set", "set", "set", "delete"]), st.integers(min_value=0, max_value=10**6), values)
# Edits a user makes on purpose: a key and a value of the right kind (they may still not fit in memory, or
# combine into something the model refuses).
GOOD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "model.layers": st.integers(1, 8),
    "model.hidden": st.sampled_from([64, 128, 256, 512]),
    "training.seq_len": st.sampled_from([16, 64, 128, 512]),
    "training.micro_batch": st.integers(1, 16),
    "training.grad_accum": st.integers(1, 4),
    "training.activation_checkpointing": st.booleans(),
    "training.gradient_clipping": st.sampled_from([0.0, 1.0]),
    "training.clip_rate": st.floats(0, 1),
    "schedule.system": st.sampled_from(["gpu_only", "zero_offload", "zero3_offload", "zero_infinity", "superoffload"]),
    "schedule.implementation": st.sampled_from(["ideal", "deepspeed"]),
    "schedule.bucket_mb": st.floats(0.001, 5000),
    "schedule.cpu_adam_core_fraction": st.floats(0.01, 1),
    "hardware.link.h2d_GBps": st.floats(0.001, 1000),
    "hardware.gpu.peak_bf16_tflops": st.floats(0.001, 5000),
    "hardware.gpu.hbm_gib": st.floats(0.5, 1000),
    "hardware.cpu.cores": st.integers(1, 256),
    "hardware.link.latency_us": st.floats(0, 1000),
}
good_edit = st.sampled_from(sorted(GOOD_VALUES)).flatmap(
    lambda key: GOOD_VALUES[key].map(lambda v: ("set-key", key, v)))
edits = st.one_of(st.lists(good_edit, max_size=3), st.lists(st.one_of(good_edit, edit), min_size=1, max_size=4))


def _apply(base: dict[str, Any], keys: list[str], edits: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for op, i, value in edits:
        if op == "set-key":  # a scenario key by name; profile files take the hardware.* ones without the prefix
            name = str(i)
            if keys is PROFILE_KEYS:
                if not name.startswith("hardware."):
                    continue
                name = name.removeprefix("hardware.")
            _set(data, name, value)
            continue
        key = keys[int(i) % len(keys)]
        if op == "set":
            _set(data, key, value)
        else:
            _delete(data, key)
    return data


# Damage done to the text itself, after dumping.
text_damage = st.one_of(
    st.just(("none", 0, b"")),
    st.just(("none", 0, b"")),
    st.just(("none", 0, b"")),
    st.tuples(st.just("duplicate-line"), st.integers(min_value=0, max_value=200), st.just(b"")),
    st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=2000), st.just(b"")),
    st.tuples(st.just("insert"), st.integers(min_value=0, max_value=2000),
              st.sampled_from([b"\xe9", b"\xff\xfe", b"\x00", b"\t", b"{", b"]", b": :", b"&a [*a]", b"*zz",
                               b"\nbomb: &b0 [x, x, x, x, x, x, x, x, x, x]\n"
                               + b"".join(b"b%d: &b%d [%s]\n" % (i, i, b", ".join([b"*b%d" % (i - 1)] * 10))
                                          for i in range(1, 9)),
                               b"\nr: &r {x: *r}\n", b"\n" + b"[" * 200 + b"\n",
                               # YAML tags (issue 26): outside the safe core, or values their tag cannot hold
                               b" !!bool maybe", b" !!int abc", b" !!timestamp x", b" !!int '0x'", b" !!float ''",
                               b" !!python/object:os.system", b" !!set", b" !foo", b" 2024-13-45",
                               b" !!int '" + b"9" * 5000 + b"'"])),
)


def _dump(data: Any, damage: tuple[str, int, bytes]) -> bytes:
    raw = yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
    kind, pos, blob = damage
    if kind == "duplicate-line":
        lines = raw.splitlines(keepends=True)
        if lines:
            i = pos % len(lines)
            lines.insert(i, lines[i])
        return b"".join(lines)
    if kind == "truncate":
        return raw[: pos % (len(raw) + 1)]
    if kind == "insert":
        i = pos % (len(raw) + 1)
        return raw[:i] + blob + raw[i:]
    return raw


# ------------------------------------------------------------------------------------------ checks

LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<rest>.+): .+")


def check_problems(err: str, files: list[Path], non_finite_ok: bool = True) -> None:
    """Every stderr line names a file and line (and then a key), or the --set override it came from."""
    names = [str(f) for f in files]
    for line in err.splitlines():
        if not line.strip():
            continue
        assert "Traceback" not in line and "internal error" not in line, err
        if line.startswith("--set "):
            continue
        if non_finite_ok and "the simulation gave non-finite" in line and any(n in line for n in names):
            continue
        m = LOCATED.match(line)
        assert m is not None and m["file"] in names, f"not located: {line!r}\n(files {names})"


# A feasible step longer than a day is absurd for the tiny fuzz scenario (issue 26: 1e300 s steps "fit").
MAX_FEASIBLE_STEP_S = 86_400.0


def tally(kind: str, code: int, outcome: str = "ok") -> None:
    """One JSON line per example in $FUZZ_TALLY (the counts in docs/limits.md come from these)."""
    path = os.environ.get("FUZZ_TALLY")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"class": kind, "exit": code, "outcome": outcome}) + "\n")


def check_result(out: str) -> None:
    """One strict JSON object whose numbers are all finite (NaN/inf would have been printed as null); a
    feasible one has a plausible step and memory left to use."""
    data = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "mfu", "model_tflops", "gpu_mem_peak_gib", "cpu_mem_peak_gib"):
        value = data[key]
        assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
    assert isinstance(data["feasible"], bool)
    if data["feasible"]:
        assert 0 < data["step_time_s"] < MAX_FEASIBLE_STEP_S, ("absurd feasible step", data["step_time_s"])
        assert data["gpu_mem_usable_gib"] > 0 and data["cpu_mem_usable_gib"] > 0, "feasible with no memory"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit status, stdout, stderr. argparse's own usage errors (an override that looks like an option,
    '--set -x') exit 2 with a usage line: that is the command line's grammar, not a file problem."""
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exc:
        captured = capsys.readouterr()
        assert exc.code == 2 and "error:" in captured.err and "Traceback" not in captured.err, captured.err
        return -2, captured.out, captured.err
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write_inputs(folder: Path, scenario: bytes, profile: bytes | None = None) -> tuple[Path, Path]:
    prof = folder / "profile.yaml"
    prof.write_bytes(profile if profile is not None else yaml.safe_dump(PROFILE).encode())
    scen = folder / "scenario.yaml"
    scen.write_bytes(scenario)
    return scen, prof


def _scenario_case(edits: list[tuple[str, Any, Any]], damage: tuple[str, int, bytes],
                   capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scen, prof = _write_inputs(Path(tmp), _dump(_apply(SCENARIO, SCENARIO_KEYS, edits), damage))
        code, out, err = run_cli(["run", str(scen), "--format", "json"], capsys)
        event(f"exit {code}")
        tally("scenario files", code, "ok" if code in (0, 2) else "internal")
        assert code in (0, 2), err
        if code == 0:
            check_result(out)
        else:
            check_problems(err, [scen, prof])


def _profile_case(edits: list[tuple[str, Any, Any]], damage: tuple[str, int, bytes],
                  capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        profile = _dump(_apply(PROFILE, PROFILE_KEYS, edits), damage)
        scen, prof = _write_inputs(Path(tmp), yaml.safe_dump(SCENARIO).encode(), profile)
        code, out, err = run_cli(["run", str(scen), "--format", "json"], capsys)
        event(f"exit {code}")
        tally("profile files", code, "ok" if code in (0, 2) else "internal")
        assert code in (0, 2), err
        if code == 0:
            check_result(out)
        else:
            check_problems(err, [scen, prof])


override_value = st.one_of(
    plausible.map(str),
    st.sampled_from([".inf", "-.inf", ".nan", "nan", "inf", "1e999", "&a [*a]", "{x: &a {y: *a}}", "[", "{",
                     "null", "~", "[1, 2]", "{a: 1}", "0", "-1", "1e-300", "1e300", "100000", "1000000", "1e9",
                     "'quoted'", "a: b", "!!python/object:os.system", "\udce9", "é",
                     # issue 26: tags, dates that are not dates, list-form tables of special files
                     "!!bool maybe", "!!int abc", "!!int ''", "!!timestamp x", "!!float abc", "2024-13-45",
                     "[/dev/zero]", "[/dev/null, x.csv]", "[]", "[5]", "a\x00b.csv", "x" * 300]),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=10),
)
override_key = st.one_of(st.sampled_from(SCENARIO_KEYS), st.sampled_from(SCENARIO_KEYS), st.text(max_size=10),
                         st.sampled_from(["", ".", "a..b", "model.0", "hardware.gpu.gemm_efficiency.0.1",
                                          "hardware.gpu.gemm_efficiency.99", "model.layers.x"]))


def _override_case(overrides: list[tuple[str, str]], with_equals: list[bool],
                   capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scen, prof = _write_inputs(Path(tmp), yaml.safe_dump(SCENARIO).encode())
        args = ["run", str(scen), "--format", "json"]
        for (key, value), eq in zip(overrides, with_equals):
            args += ["--set", f"{key}={value}" if eq else key]
        code, out, err = run_cli(args, capsys)
        event("argparse usage error" if code == -2 else f"exit {code}")
        tally("--set overrides", code, "ok" if code in (0, 2, -2) else "internal")
        assert code in (0, 2, -2), err
        if code == 0:
            check_result(out)
        elif code == 2:
            check_problems(err, [scen, prof])


SWEEP_KEYS = ["training.micro_batch", "schedule.bucket_mb", "model.layers", "hardware.link.h2d_GBps",
              "schedule.system", "hardware", "nosuch.key", "model", "training.iterations", "schedule.implementation",
              "training.grad_accum", "hardware.cpu.cores"]
sweep_values = st.one_of(st.lists(plausible, min_size=1, max_size=3), st.lists(values, min_size=0, max_size=3))


@st.composite
def sweep_files(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {"base": draw(st.sampled_from(["scenario.yaml"] * 6 + ["nosuch.yaml", 5]))}
    if draw(st.booleans()):  # a grid a user would write: known keys, values of the right kind
        keys = draw(st.lists(st.sampled_from(sorted(GOOD_VALUES)), min_size=1, max_size=2, unique=True))
        data["grid"] = {k: draw(st.lists(GOOD_VALUES[k], min_size=1, max_size=2)) for k in keys}
        return data
    if draw(st.booleans()):
        grid = {}
        for key in draw(st.lists(st.one_of(st.sampled_from(SWEEP_KEYS), st.sampled_from(SWEEP_KEYS),
                                           st.integers(0, 3), st.text(max_size=5)), max_size=3)):
            grid[key] = draw(sweep_values)
        if draw(st.integers(0, 9)) == 0:  # a grid far too large to build: 10^13 points from 130 values
            grid = {f"k{i}": list(range(10)) for i in range(13)}
        data["grid"] = grid
    if draw(st.booleans()):
        data["points"] = draw(st.lists(st.one_of(
            st.dictionaries(st.sampled_from(SWEEP_KEYS), values, max_size=2), values), max_size=3))
    if draw(st.booleans()):
        data["set"] = draw(st.one_of(st.dictionaries(st.sampled_from(SWEEP_KEYS), values, max_size=2), values))
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.text(max_size=5))] = draw(values)
    return data


def _sweep_case(data: dict[str, Any], damage: tuple[str, int, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scen, prof = _write_inputs(Path(tmp), yaml.safe_dump(SCENARIO).encode())
        path = Path(tmp) / "sweep.yaml"
        path.write_bytes(_dump(data, damage))
        try:
            spec = load_sweep(path)
        except ConfigError as exc:
            event("refused at load")
            tally("sweep files", 2)
            check_problems("\n".join(exc.problems), [path, scen, prof, Path(tmp) / "nosuch.yaml"],
                           non_finite_ok=False)
            return
        frame = sweep(spec)  # in this process: no pool per example
        tally("sweep files", 0)
        errors = int(frame[ERROR_COLUMN].notna().sum()) if ERROR_COLUMN in frame else 0
        event("ran: every point ok" if errors == 0 else "ran: some points are error rows")
        # A point is an error row exactly when loading the base file with its overrides fails: the sweep adds
        # no failure of its own (a profile name relative to the base file is the one known difference).
        first = spec.points[0]
        if isinstance(data.get("base"), str) and not any(k == "hardware" for k in spec.full_point(first)):
            try:
                sc = load_scenario(Path(tmp) / data["base"], spec.overrides(first))
                direct_ok = not non_finite_metrics(simulate(sc).metrics)
            except SosimError:
                direct_ok = False
            row = frame[frame["point_id"] == point_id(spec.full_point(first))].iloc[0]
            row_ok = ERROR_COLUMN not in row or pd.isna(row[ERROR_COLUMN])
            assert direct_ok == row_ok, (row.get(ERROR_COLUMN), spec.full_point(first))
        assert len(frame) == len({point_id(spec.full_point(p)) for p in spec.points})  # identical points run once
        ok = frame[frame[ERROR_COLUMN].isna()] if ERROR_COLUMN in frame else frame
        for col in ("step_time_s", "tokens_per_s", "mfu"):
            if col in ok:
                assert ok[col].map(lambda v: isinstance(v, (int, float)) and math.isfinite(v)).all(), ok[col]


# ------------------------------------------------------------------------------------------- tests


@_settings(FAST_EXAMPLES)
@given(edits=edits, damage=text_damage)
def test_fuzz_scenario_files(edits: list[tuple[str, Any, Any]], damage: tuple[str, int, bytes],
                             capsys: pytest.CaptureFixture[str]) -> None:
    _scenario_case(edits, damage, capsys)


@_settings(FAST_EXAMPLES)
@given(edits=edits, damage=text_damage)
def test_fuzz_profile_files(edits: list[tuple[str, Any, Any]], damage: tuple[str, int, bytes],
                            capsys: pytest.CaptureFixture[str]) -> None:
    _profile_case(edits, damage, capsys)


good_override = good_edit.map(lambda e: (e[1], json.dumps(e[2])))
overrides = st.one_of(st.lists(good_override, min_size=1, max_size=3),
                      st.lists(st.one_of(good_override, st.tuples(override_key, override_value)), min_size=1,
                               max_size=3))


@_settings(FAST_EXAMPLES)
@given(overrides=overrides,
       with_equals=st.lists(st.booleans(), min_size=3, max_size=3))
def test_fuzz_set_overrides(overrides: list[tuple[str, str]], with_equals: list[bool],
                            capsys: pytest.CaptureFixture[str]) -> None:
    _override_case(overrides, with_equals, capsys)


@_settings(FAST_EXAMPLES)
@given(data=sweep_files(), damage=text_damage)
def test_fuzz_sweep_files(data: dict[str, Any], damage: tuple[str, int, bytes]) -> None:
    _sweep_case(data, damage)


# ------------------------------------------------------------------- command-line options of every command
#
# Each example is one command line of tune, validate, compare, calibrate, run or sweep: a valid start plus
# 0-4 options drawn from that command's own, with values a user might type (and hostile ones: 5,000 digits,
# negatives, inf, unwritable paths such as /proc/x). Contract: exit 0, 1 (tune: nothing fits; validate: rows
# out of budget) or 2 (an input problem; argparse's usage errors too), never a traceback or an internal error,
# and every example ends within CLI_SECONDS (an unbounded run fails the test). Local worker pools are thread
# pools here: the fuzz probes input handling; the real pools are tested in tests/test_signals.py.

CLI_SECONDS = float(os.environ.get("FUZZ_SECONDS", "60"))  # per example: generous, it only catches runaways
FAST_CLI_EXAMPLES = 8

# Mostly values a user would type (so that most command lines run), the rest hostile.
usual_int = st.integers(1, 8).map(str)
int_text = st.one_of(
    usual_int, usual_int, usual_int,
    st.sampled_from(["0", "1", "2", "3", "1000000000", "9" * 5000, "-1", "1.5", "1e3", "0x10", "", " 4", "nan",
                     "inf", "2000", "2001", "100000", "1_000"]),
    st.integers(-(10**20), 10**20).map(str),
)
float_text = st.one_of(st.floats(0.5, 1e4).map(repr), st.floats(0.5, 1e4).map(repr), int_text,
                       st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.sampled_from(["1e-300", "1e300", "0.5", "-0.0", "1e999"]))
word_text = st.one_of(st.sampled_from(WORDS), st.text(max_size=8))
# OUT/ is a fresh folder, IN/ holds the inputs (_cli_inputs).
out_path = st.sampled_from(["OUT/x.json", "OUT/x.csv", "OUT/x.parquet", "OUT/sub/deeper/x.json", "OUT/x.png",
                            "OUT/x.svg", "OUT/x.txt", "OUT", "", "/proc/sosim-fuzz.json", "/sys/sosim-fuzz.csv",
                            "/dev/null", "IN/scenario.yaml/x.json", "OUT/\udce9.json",
                            # issue 26: never over a FIFO, a link, the user's file or an input
                            "IN/fifo.json", "IN/fifo.csv", "IN/link.json", "IN/notes.json", "IN/notes.csv",
                            "IN/ds.json", "IN/scenario.yaml", "IN/zero.csv", "x" * 300 + ".json"])
in_path = st.sampled_from(["IN/scenario.yaml", "IN/profile.yaml", "IN/refs.yaml", "IN/ds.json", "IN/model.json",
                           "IN/measured", "IN/empty", "IN/nosuch", "IN", "", "/proc/self/status", "/dev/zero",
                           "IN/garbage.yaml", "IN/fifo.json", "IN/fifo.yaml", "IN/zero.csv", "x" * 300])
flag = None  # an option without a value
override_text = st.one_of(overrides.map(lambda o: f"{o[0][0]}={o[0][1]}"), st.text(max_size=12))

COMMON: list[tuple[str, st.SearchStrategy[Any] | None]] = [
    ("--format", st.sampled_from(["json", "table", "json", "table", "csv", ""]))]
CLI_OPTIONS: dict[str, list[tuple[str, st.SearchStrategy[Any] | None]]] = {
    "tune": [("--jobs", int_text), ("--budget", int_text), ("--gpus", int_text), ("--global-batch", int_text),
             ("--top", int_text), ("--objective", st.one_of(st.sampled_from(["tokens_per_s", "time_to_tokens"]),
                                                            word_text)),
             ("--token-budget", float_text), ("--systems", st.one_of(st.sampled_from(
                 ["gpu_only,zero_offload", "superoffload", "zero3_offload,nosuch", ",", ""]), word_text)),
             ("--implementation", st.sampled_from(["ideal", "deepspeed", "x"])), ("--max-host-ram", float_text),
             ("--max-hbm", float_text), ("--out", out_path), ("--no-write", flag), ("--set", override_text),
             ("--ds-config", in_path), ("--model", in_path), ("--hardware", st.one_of(in_path, word_text)),
             ("--seq", int_text), ("--micro-batch", int_text), ("--grad-accum", int_text),
             ("--precision", st.sampled_from(["bf16", "fp16", "fp8"])), *COMMON],
    "validate": [("--references", in_path), ("--measured", in_path), ("--no-measured", flag),
                 ("--band-replays", int_text), *COMMON],
    "compare": [("--set", override_text), ("--plot", out_path), *COMMON],
    "calibrate": [("--out", out_path), ("--quick", flag), ("--append", flag),
                  ("--only", st.one_of(st.sampled_from(["gemm", "copy,cpu_adam", "nosuch", "", ",", "nccl"]),
                                       word_text))],
    "run": [("--band-replays", int_text), ("--band-seed", int_text), ("--bands", flag), ("--no-bands", flag),
            ("--trace", out_path), ("--plot", out_path), ("--set", override_text), *COMMON],
    "sweep": [("--workers", int_text), ("--chunk-size", int_text), ("--out", out_path), ("--resume", flag),
              *COMMON],
}
CLI_START: dict[str, list[str]] = {
    "tune": ["tune", "IN/scenario.yaml", "--budget", "30", "--no-progress"],
    "validate": ["validate", "--references", "IN/refs.yaml"],
    "compare": ["compare", "IN/scenario.yaml", "IN/scenario.yaml"],
    "calibrate": ["calibrate"],
    "run": ["run", "IN/scenario.yaml"],
    "sweep": ["sweep", "IN/sweep.yaml"],
}
# The first words of a command line: the valid start, or another (a missing or extra positional).
starts = {
    "tune": st.sampled_from([*[CLI_START["tune"]] * 6, ["tune", "--budget", "30"], ["tune", "IN/nosuch", "IN/x"]]),
    "compare": st.sampled_from([*[CLI_START["compare"]] * 4, ["compare", "IN/scenario.yaml"], ["compare"],
                                ["compare", "IN/scenario.yaml", "IN/garbage.yaml", "IN/nosuch"]]),
}


@st.composite
def command_lines(draw: st.DrawFn, command: str) -> list[str]:
    args = list(draw(starts[command]) if command in starts else CLI_START[command])
    for name, value in draw(st.lists(st.sampled_from(CLI_OPTIONS[command]), max_size=4)):
        if draw(st.integers(0, 39)) == 0:
            name = draw(st.sampled_from(["--nosuch", "-x", "--", "--set=", "--jobs=2"]))
        args.append(name)
        if value is not None:
            args.append(draw(value))
    if command == "validate" and "--measured" not in args and "--no-measured" not in args:
        args.append("--no-measured")  # every shipped measured run takes seconds: one example is not the place
    return args


REFS = {"rows": [{"id": "tiny", "source": "fuzz", "kind": "metric", "scenario": "SCEN", "metric": "tokens_per_s",
                  "published": 1000.0, "budget_rel": 0.5}]}
SWEEP_TINY = {"base": "scenario.yaml", "grid": {"training.micro_batch": [1, 2], "schedule.bucket_mb": [8, 16]}}


def _cli_inputs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    scen, _ = _write_inputs(folder, yaml.safe_dump(SCENARIO).encode())
    refs = copy.deepcopy(REFS)
    refs["rows"][0]["scenario"] = str(scen)
    (folder / "refs.yaml").write_text(yaml.safe_dump(refs))
    (folder / "sweep.yaml").write_text(yaml.safe_dump(SWEEP_TINY))
    (folder / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                                "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    (folder / "model.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "intermediate_size": 512,
                                                   "vocab_size": 1024}))
    (folder / "garbage.yaml").write_bytes(b"\xff\xfe{[: :")
    (folder / "empty").mkdir(exist_ok=True)
    (folder / "measured").mkdir(exist_ok=True)
    (folder / "measured" / "deepspeed_steps.csv").write_text("run,step_s\nx,notanumber\n")
    for fifo in ("fifo.json", "fifo.yaml", "fifo.csv"):  # a reader or writer that opens one blocks for ever
        os.mkfifo(folder / fifo)
    (folder / "notes.json").write_text("the user's notes\n")
    (folder / "notes.csv").write_text("a,b\n1,2\n")
    os.symlink(folder / "notes.json", folder / "link.json")
    os.symlink("/dev/zero", folder / "zero.csv")


def _in_snapshot(folder: Path) -> dict[str, tuple[int, bytes | str]]:
    """Kind and bytes (a link: its target) of everything in IN/: the command lines must leave it as it was."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for p in sorted(folder.rglob("*")):
        st_ = os.lstat(p)
        body: bytes | str = (os.readlink(p) if Path(p).is_symlink()
                             else p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        out[str(p)] = (st_.st_mode & 0o170000, body)
    return out


class _Unbounded(BaseException):
    """An example ran past CLI_SECONDS (a BaseException: the CLI's own handlers must not swallow it)."""


def _alarm(signum: int, frame: object) -> None:
    raise _Unbounded(f"an example ran past {CLI_SECONDS:.0f} s")


@pytest.fixture
def thread_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import sosim.answers.workers

    class ThreadPool(ThreadPoolExecutor):
        def __init__(self, workers: int) -> None:
            super().__init__(max_workers=min(2, max(1, workers)))

    monkeypatch.setattr(sosim.answers.workers, "WorkerPool", ThreadPool)
    monkeypatch.setattr(sosim.answers.workers, "start_pool", ThreadPool)


def _cli_case(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _cli_inputs(root / "IN")
        (root / "OUT").mkdir()
        args = [a.replace("IN/", f"{root}/IN/").replace("OUT", f"{root}/OUT") if a.startswith(("IN", "OUT"))
                else a for a in args]
        cwd = os.getcwd()
        os.chdir(root)  # tune's default --out is ./ds_config.tuned.json
        before = _in_snapshot(root / "IN")
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, CLI_SECONDS)
        try:
            code, _, err = run_cli(args, capsys)
        except _Unbounded:
            tally(f"command lines: {args[0]}", -1, "hang")
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            os.chdir(cwd)
        lost = [p for p, v in _in_snapshot(root / "IN").items() if before.get(p) != v]
        lost += [p for p in before if not os.path.lexists(p)]
    bad = code not in (0, 1, 2, -2) or "Traceback" in err or "internal error" in err
    tally(f"command lines: {args[0]}", code, "lost" if lost else "internal" if bad else "ok")
    assert not lost, ("an input changed", args, lost, err[-1000:])
    event(f"{args[0]}: " + ("argparse usage error" if code == -2 else f"exit {code}"))
    assert code in (0, 1, 2, -2), (code, args, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, (args, err[-2000:])
    if code == 2:
        assert err.strip(), args  # a refused input says why


CLI_COMMANDS = sorted(CLI_OPTIONS)


@pytest.mark.parametrize("command", CLI_COMMANDS)
@_settings(FAST_CLI_EXAMPLES)
@given(data=st.data())
def test_fuzz_command_options(command: str, data: st.DataObject, capsys: pytest.CaptureFixture[str],
                              thread_pools: None) -> None:
    _cli_case(data.draw(command_lines(command), label="args"), capsys)


# The full run: >= 10,000 examples over the four kinds (FUZZ_EXAMPLES each) and the command lines (FUZZ_EXAMPLES
# over all commands). Run with --slow.


@pytest.mark.slow
@pytest.mark.parametrize("command", CLI_COMMANDS)
@_settings(max(1, SLOW_EXAMPLES // len(CLI_COMMANDS)))
@given(data=st.data())
def test_fuzz_command_options_slow(command: str, data: st.DataObject, capsys: pytest.CaptureFixture[str],
                                   thread_pools: None) -> None:
    _cli_case(data.draw(command_lines(command), label="args"), capsys)


@pytest.mark.slow
@_settings(SLOW_EXAMPLES)
@given(edits=edits, damage=text_damage)
def test_fuzz_scenario_files_slow(edits: list[tuple[str, Any, Any]], damage: tuple[str, int, bytes],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    _scenario_case(edits, damage, capsys)


@pytest.mark.slow
@_settings(SLOW_EXAMPLES)
@given(edits=edits, damage=text_damage)
def test_fuzz_profile_files_slow(edits: list[tuple[str, Any, Any]], damage: tuple[str, int, bytes],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    _profile_case(edits, damage, capsys)


@pytest.mark.slow
@_settings(SLOW_EXAMPLES)
@given(overrides=overrides,
       with_equals=st.lists(st.booleans(), min_size=3, max_size=3))
def test_fuzz_set_overrides_slow(overrides: list[tuple[str, str]], with_equals: list[bool],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    _override_case(overrides, with_equals, capsys)


@pytest.mark.slow
@_settings(SLOW_EXAMPLES)
@given(data=sweep_files(), damage=text_damage)
def test_fuzz_sweep_files_slow(data: dict[str, Any], damage: tuple[str, int, bytes]) -> None:
    _sweep_case(data, damage)
