"""Bad input: every problem reported as file:line: key.path: message, all at once, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import TINY_PROFILE, tiny_scenario

from sosim import ConfigError, load_scenario
from sosim.cli import main


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
    assert problem.startswith(f"{ppath}:") and "hardware.link.h2d_GBps: Input should be greater than 0" in problem


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
