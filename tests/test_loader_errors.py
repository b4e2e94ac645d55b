"""Bad input: every problem reported as file:line: key.path: message, all at once, no traceback."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from helpers import TINY_PROFILE, tiny_scenario

from sosim import ConfigError, load_scenario
from sosim.cli import main

# Refusals are checked for being quick, not timed: building what they refuse would take hours, so a
# bound 100x above the ~0.1 s they take on a loaded 2-core machine cannot flake and still catches them.
REFUSAL_MARGIN_S = 30.0


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = """\
name: t
hardware: gh200
model: {layers: 2, hidden: 256, heads: 4}
training: {seq_len: 128, micro_batch: 1}
schedule: {system: zero_offload}
"""


def test_good_file_loads(tmp_path: Path) -> None:
    sc = load_scenario(_write(tmp_path, "s.yaml", GOOD))
    assert sc.hardware.name == "gh200" and sc.schedule.system == "zero_offload"


def test_all_problems_at_once_with_lines(tmp_path: Path) -> None:
    text = GOOD.replace("training: {seq_len: 128, micro_batch: 1}",
                        "training:\n  seq_len: -5\n  micro_bach: 1\n  micro_batch: 1")
    text = text.replace("schedule: {system: zero_offload}", "schedule:\n  system: zero_offload\n  bucket_mb: 0")
    path = _write(tmp_path, "s.yaml", text)
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    problems = exc.value.problems
    assert f"{path}:5: training.seq_len: Input should be greater than 0" in problems
    assert f"{path}:6: training.micro_bach: unknown key (check the spelling; see docs/scenarios.md)" in problems
    assert any(p.startswith(f"{path}:10: schedule.bucket_mb:") for p in problems)


def test_heads_must_divide_hidden(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", GOOD.replace("heads: 4", "heads: 3"))
    with pytest.raises(ConfigError, match=r"s.yaml:3: model: heads \(3\) must divide hidden \(256\)"):
        load_scenario(path)


def test_kv_heads_must_divide_heads() -> None:
    d = tiny_scenario({"system": "gpu_only"})
    d["model"]["kv_heads"] = 3
    with pytest.raises(ConfigError, match=r"kv_heads \(3\) must divide heads \(8\)"):
        load_scenario(d)


def test_unknown_profile_lists_available(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", GOOD.replace("gh200", "gh300"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert f"{path}:2: hardware: unknown hardware profile 'gh300'" in msg
    assert "gh200" in msg and "v100-dgx2" in msg


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", GOOD + "model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"s.yaml:\d+: YAML syntax error"):
        load_scenario(path)


def test_profile_errors_point_into_the_profile_file(tmp_path: Path) -> None:
    prof = dict(TINY_PROFILE)
    prof["link"] = {**TINY_PROFILE["link"], "h2d_GBps": -3}
    ppath = _write(tmp_path, "myprof.yaml", yaml.safe_dump(prof, sort_keys=False))
    spath = _write(tmp_path, "s.yaml", GOOD.replace("hardware: gh200", "hardware: myprof.yaml"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(spath)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{ppath}:")
    assert "hardware.link.h2d_GBps: Input should be greater than or equal to 0.001" in problem


def test_number_without_source_is_rejected() -> None:
    d = tiny_scenario({"system": "gpu_only"})
    del d["hardware"]["cpu"]["sources"]["cast_GBps"]
    with pytest.raises(ConfigError, match="no source given for cast_GBps"):
        load_scenario(d)


def test_override_errors_name_the_override() -> None:
    with pytest.raises(ConfigError) as exc:
        load_scenario(tiny_scenario({"system": "gpu_only"}), ["training.seq_len=zero", "model.layrs=3"])
    assert any("--set training.seq_len=zero: training.seq_len: Input should be a valid integer" in p
               for p in exc.value.problems)
    assert any("--set model.layrs=3: model.layrs: unknown key" in p for p in exc.value.problems)


def test_cpu_adam_impl_must_exist_in_profile() -> None:
    with pytest.raises(ConfigError, match="'grace_adam' has no timing in profile 'tiny'"):
        load_scenario(tiny_scenario({"system": "zero_offload", "cpu_adam": "grace_adam"}))


def test_cli_bad_input_exits_nonzero_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "s.yaml", GOOD.replace("layers: 2", "layers: 0"))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}:3: model.layers: Input should be greater than 0" in err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_profile_with_missing_or_malformed_calibration_table(tmp_path: Path) -> None:
    prof = dict(TINY_PROFILE)
    prof["calibration"] = "nowhere.csv"
    ppath = _write(tmp_path, "calprof.yaml", yaml.safe_dump(prof, sort_keys=False))
    spath = _write(tmp_path, "s.yaml", GOOD.replace("hardware: gh200", "hardware: calprof.yaml"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(spath)
    msg = str(exc.value)
    assert f"{ppath}:" in msg and "calibration" in msg and "nowhere.csv" in msg
    (tmp_path / "bad.csv").write_text("op,variant\ngemm,fwd\n")
    prof["calibration"] = "bad.csv"
    ppath.write_text(yaml.safe_dump(prof, sort_keys=False))
    with pytest.raises(ConfigError, match=r"bad\.csv"):
        load_scenario(spath)


# ------------------------------------------------------------------ inputs that could hurt (issue 8, section 6)


def test_duplicate_keys_name_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", GOOD + "model: {layers: 3, hidden: 256, heads: 4}\n")
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.problems == [f"{path}:6: model: duplicate key (first at line 3); each key may appear once"]


def test_duplicate_keys_inside_one_flow_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", GOOD.replace("{seq_len: 128,", "{seq_len: 128, seq_len: 64,"))
    with pytest.raises(ConfigError, match=r"s.yaml:4: training.seq_len: duplicate key \(first at column 12\)"):
        load_scenario(path)


def test_latin1_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(GOOD.replace("name: t", "name: caf\xe9").encode("latin-1"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.problems[0].startswith(f"{path}:1: not UTF-8 text: byte 0xe9")


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", "&a [*a]")
    with pytest.raises(ConfigError, match=r"s.yaml:1: 0: recursive alias \*a"):
        load_scenario(path)


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    # 10 levels of 10 aliases each: 10^10 values once expanded, from ~450 bytes.
    text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))
    path = _write(tmp_path, "s.yaml", text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to more than 1,000,000 values"):
        load_scenario(path)
    assert time.perf_counter() - start < REFUSAL_MARGIN_S


def test_deep_nesting_is_refused_by_sosim_with_file_line_and_key(tmp_path: Path) -> None:
    # 100 levels: under any PyYAML's own limit, so sosim's check is the one that answers.
    path = _write(tmp_path, "s.yaml", "a: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.problems[0].startswith(f"{path}:1: a.0.0")
    assert exc.value.problems[0].endswith("nested more than 64 levels deep")


def test_very_deep_nesting_is_refused_not_a_crash(tmp_path: Path) -> None:
    # 5,000 levels: PyYAML >= 6.0.4 refuses this itself while scanning (its own wording), older versions reach
    # sosim's check; either way sosim must answer with a located ConfigError, not a RecursionError.
    path = _write(tmp_path, "s.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.problems[0].startswith(f"{path}:1: ")
    assert "nest" in exc.value.problems[0]


def test_oversized_input_is_not_read_to_the_end(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    # A device is refused by its kind before it is opened (issue 26: one reader, regular files only)...
    with pytest.raises(ConfigError, match="/dev/zero: cannot read file: it is a character device"):
        load_scenario("/dev/zero")
    # ...and a regular file past the cap by its size (a sparse 17 MiB file: nothing is read).
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(17 * 2**20)
    with pytest.raises(ConfigError, match="larger than 16 MiB"):
        load_scenario(big)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "'inf'", "1e999"])
def test_non_finite_numbers_are_refused_with_file_line_and_key(tmp_path: Path, value: str) -> None:
    path = _write(tmp_path, "s.yaml", GOOD.replace("schedule: {system: zero_offload}",
                                                   f"schedule:\n  system: zero_offload\n  bucket_mb: {value}"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert exc.value.problems[0].startswith(f"{path}:7: schedule.bucket_mb: not a finite number")


def test_non_finite_override_names_the_override() -> None:
    with pytest.raises(ConfigError) as exc:
        load_scenario("gh200_zero_offload_4b", ["hardware.link.h2d_GBps=.inf"])
    assert exc.value.problems == ["--set hardware.link.h2d_GBps=.inf: hardware.link.h2d_GBps: not a finite number "
                                  "(inf); give a finite value"]


def test_plan_too_large_is_refused_before_simulating() -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as exc:
        load_scenario("gh200_zero_offload_4b", ["model.layers=1000000"])
    assert time.perf_counter() - start < REFUSAL_MARGIN_S
    (problem,) = exc.value.problems
    assert problem.startswith("--set model.layers=1000000: model.layers: 1,000,000 layers x 1 micro-batches")
    assert "3,000,000 layer passes" in problem
    # Just under the bound still loads.
    assert load_scenario("gh200_zero_offload_4b", ["model.layers=33333"]).model.layers == 33333


def test_override_values_get_the_same_protection() -> None:
    with pytest.raises(ConfigError, match=r"--set name=&a \[\*a\]: name.0: recursive alias"):
        load_scenario("gh200_zero_offload_4b", ["name=&a [*a]"])
    with pytest.raises(ConfigError, match=r"--set name=\\r: expected|--set a\\rb: expected"):
        load_scenario("gh200_zero_offload_4b", ["a\rb"])
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_scenario("gh200_zero_offload_4b", ["name=\udce9"])


def test_control_character_names_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", GOOD.replace("name: t", "name: t\x01"))
    with pytest.raises(ConfigError, match=r"s.yaml:1: YAML syntax error: character U\+0001"):
        load_scenario(path)


# ------------------------------------------------------------------------------ profile folders


def test_user_profile_folder_shadows_the_shipped_profile_and_says_so(tmp_path: Path) -> None:
    from sosim.inputs.resources import shipped_profiles_dir

    mine = tmp_path / "profiles"
    mine.mkdir()
    text = re.sub(r"(?m)^  hbm_gib: .*$", "  hbm_gib: 144", (shipped_profiles_dir() / "gh200.yaml").read_text())
    (mine / "gh200.yaml").write_text(text)
    notes: list[str] = []
    sc = load_scenario("gh200_zero_offload_4b", profile_dirs=[mine], notes=notes)
    assert sc.hardware.gpu.hbm_gib == 144
    assert len(notes) == 1 and f"using {mine / 'gh200.yaml'} (--profiles)" in notes[0] and "shadows" in notes[0]
    assert load_scenario("gh200_zero_offload_4b").hardware.gpu.hbm_gib != 144  # nothing global changed


def test_profiles_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = dict(TINY_PROFILE, name="envprof")
    (tmp_path / "envprof.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    monkeypatch.setenv("SOSIM_PROFILES", str(tmp_path))
    path = _write(tmp_path, "s.yaml", GOOD.replace("hardware: gh200", "hardware: envprof"))
    assert load_scenario(path).hardware.name == "envprof"


def test_copied_calibrated_profile_keeps_its_table(tmp_path: Path) -> None:
    """A shipped profile copied elsewhere names its table relative to the shipped folder: still found."""
    from sosim.inputs.resources import shipped_profiles_dir

    (tmp_path / "mine.yaml").write_text((shipped_profiles_dir() / "h200-pcie-gen5-x86.yaml").read_text())
    sc = load_scenario("h200_x86_llama1.1b_zero2_measured", ["hardware=" + str(tmp_path / "mine.yaml")])
    paths = sc.hardware.calibration_paths
    assert paths and all(Path(p).is_file() and Path(p).name == "measurements.csv" for p in paths)


def test_shipped_examples_load_by_name() -> None:
    assert load_scenario("gh200_zero_offload_4b").name == load_scenario("scenarios/gh200_zero_offload_4b.yaml").name
    with pytest.raises(ConfigError, match="nor a shipped example"):
        load_scenario("no_such_example")


def test_unicode_digits_in_a_key_path_are_names_not_indices() -> None:
    # '²'.isdigit() is True but int('²') fails: found by the fuzz run.
    with pytest.raises(ConfigError, match=r"--set model.²=1: model.²: unknown key"):
        load_scenario("gh200_zero_offload_4b", ["model.²=1"])



# ------------------------------------------------------------------------ bounds (docs/limits.md)

BLOCK = """\
name: t
hardware: gh200
model:
  layers: 2
  hidden: 256
  heads: 4
training:
  seq_len: 128
  micro_batch: 1
  activation_checkpointing: true
schedule:
  system: zero_offload
cluster:
  gpus: 1
"""


@pytest.mark.parametrize(("old", "new", "line", "key", "message"), [
    ("layers: 2", "layers: true", 4, "model.layers", "expected a number, got a boolean"),
    ("heads: 4", "heads: yes", 6, "model.heads", "expected a number, got a boolean"),
    ("activation_checkpointing: true", "activation_checkpointing: 1", 10, "training.activation_checkpointing",
     "expected true or false, got 1"),
    ("layers: 2", "layers: " + "9" * 30, 4, "model.layers", "an integer of 30 digits is beyond 9,007,199,254,740,992"),
    ("layers: 2", "layers: " + "9" * 5000, 4, "model.layers", "a number of 5,000 characters"),
    ("gpus: 1", "gpus: 1000000000", 14, "cluster.gpus", "less than or equal to 1000000 (at most 1,000,000 GPUs"),
])
def test_bounds_name_file_line_and_key(tmp_path: Path, old: str, new: str, line: int, key: str,
                                       message: str) -> None:
    assert old in BLOCK
    path = _write(tmp_path, "s.yaml", BLOCK.replace(old, new))
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{path}:{line}: {key}: ") and message in problem, problem


def test_link_speed_bound_points_into_the_profile(tmp_path: Path) -> None:
    prof = {**TINY_PROFILE, "link": {**TINY_PROFILE["link"], "h2d_GBps": 1e-300}}
    ppath = _write(tmp_path, "p.yaml", yaml.safe_dump(prof, sort_keys=False))
    spath = _write(tmp_path, "s.yaml", GOOD.replace("hardware: gh200", "hardware: p.yaml"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(spath)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{ppath}:") and "hardware.link.h2d_GBps: " in problem
    assert "greater than or equal to 0.001 (a bandwidth between 0.001 and 1e+06 GB/s" in problem


@pytest.mark.parametrize(("override", "message"), [
    ("model.layers=true", "--set model.layers=true: model.layers: expected a number, got a boolean"),
    ("cluster.gpus=1000000000", "--set cluster.gpus=1000000000: cluster.gpus: Input should be less than or equal"),
    ("hardware.link.h2d_GBps=1e-300", "--set hardware.link.h2d_GBps=1e-300: hardware.link.h2d_GBps: Input should "
                                      "be greater than or equal to 0.001"),
    # Problems a section or the whole scenario finds in a combination: on the override the message names.
    ("model.heads=7", "--set model.heads=7: model: heads (7) must divide hidden (256)"),
    ("hardware.gpu.gemm_efficiency=[[1,2]]", "--set hardware.gpu.gemm_efficiency=[[1,2]]: hardware.gpu: "
                                             "gemm_efficiency values must be at most 1.0"),
    ("cluster.gpus_per_node=3", "--set cluster.gpus_per_node=3: (top level): cluster.gpus: 1 GPUs do not fill"),
])
def test_set_problems_name_the_option_not_the_file(tmp_path: Path, override: str, message: str) -> None:
    path = _write(tmp_path, "s.yaml", GOOD)
    with pytest.raises(ConfigError) as exc:
        load_scenario(path, [override, "training.micro_batch=2"])
    (problem,) = exc.value.problems
    assert problem.startswith(message), problem


def test_a_set_the_message_does_not_name_is_listed_beside_the_file(tmp_path: Path) -> None:
    # The file's own hidden (256) with an override elsewhere in the section: the file is to blame, and the
    # message says which overrides took part.
    path = _write(tmp_path, "s.yaml", GOOD.replace("heads: 4", "heads: 3"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(path, ["model.vocab=512"])
    (problem,) = exc.value.problems
    assert problem.startswith(f"{path}:3: model: heads (3) must divide"), problem
    assert problem.endswith(" (with --set model.vocab=512)"), problem


def test_a_huge_override_is_refused_and_shown_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "s.yaml", GOOD)
    assert main(["run", str(path), "--set", "model.layers=" + "9" * 5000]) == 2
    err = capsys.readouterr().err
    assert "a number of 5,000 characters" in err and "(5,013 characters)" in err and len(err) < 400, err


def test_bf16_is_refused_on_a_gpu_without_bf16_and_the_peak_names_the_precision(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        load_scenario("v100_zero_offload_1b", ["training.precision=bf16"])
    (problem,) = exc.value.problems
    assert problem.startswith("--set training.precision=bf16: training.precision: bf16, but the V100"), problem
    assert main(["run", "v100_zero_offload_1b"]) == 0
    out = capsys.readouterr().out
    assert "TFLOPS peak fp16 x 1 GPU(s)" in out and "peak bf16" not in out


def test_bf16_in_a_v100_file_points_at_the_precision_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "s.yaml", BLOCK.replace("hardware: gh200", "hardware: v100-dgx2")
                  .replace("  micro_batch: 1\n", "  micro_batch: 1\n  precision: bf16\n"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{path}:10: training.precision: bf16, but the V100"), problem


@pytest.mark.parametrize(("args", "message"), [
    (["run", "h200_x86_zero_offload_llama3b", "--band-replays", "1000000000"], "<= 2,000"),
    (["run", "h200_x86_zero_offload_llama3b", "--band-seed", "-1"], "from 0 to 2^63 - 1"),
    (["validate", "--band-replays", "-3"], "0 (no band) or a whole number >= 2"),
    (["tune", "gh200_zero_offload_4b", "--jobs", "100000"], "per core"),
    (["tune", "gh200_zero_offload_4b", "--gpus", "1000000000"], "more than 1,000,000"),
    (["tune", "gh200_zero_offload_4b", "--global-batch", "9" * 5000], "(5,000 characters)"),
])
def test_option_bounds_are_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "Traceback" not in err, err


def test_an_unknown_profile_name_with_control_characters_stays_one_line(tmp_path: Path) -> None:
    # Found by the slow fuzz run: a raw carriage return in the name split the message in two.
    with pytest.raises(ConfigError) as exc:
        load_scenario(_write(tmp_path, "s.yaml", GOOD), ["hardware=\r\x08"])
    (problem,) = exc.value.problems
    assert problem.startswith("--set hardware=\\r\\x08: hardware: unknown hardware profile '\\r\\x08'")
    assert len(problem.splitlines()) == 1
