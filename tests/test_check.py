"""sosim check: a baseline of predictions, re-predicted and compared; exit codes, attribution, JUnit XML."""

from __future__ import annotations

import io
import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sosim.answers.check import parse_tolerances
from sosim.cli import main
from sosim.inputs.errors import SosimError

ROOT = Path(__file__).resolve().parents[1]
GH200 = "gh200_zero_offload_4b"  # on the gh200 profile (its table: published values)
H200 = "h200_x86_llama1.1b_zero2_measured"  # on the calibrated h200-pcie-gen5-x86 profile


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "ci" / "baseline.json"
    path.parent.mkdir()
    code, out, _ = _run(["check", "--write", str(path), GH200, H200], capsys)
    assert code == 0 and f"wrote {path}: 2 scenario(s)" in out
    return path


def _profile_copy(tmp_path: Path, old: str, new: str) -> Path:
    """The shipped gh200 profile copied into a folder of the user's, one line edited."""
    folder = tmp_path / "profiles"
    folder.mkdir(parents=True)
    text = (ROOT / "hardware_profiles" / "gh200.yaml").read_text()
    assert text.count(old) == 1
    (folder / "gh200.yaml").write_text(text.replace(old, new))
    return folder


def test_baseline_records_predictions_and_what_produced_them(baseline: Path) -> None:
    doc = json.loads(baseline.read_text())
    assert doc["format"] == "sosim-check/1"
    gh200, h200 = doc["scenarios"]
    assert gh200["id"] == GH200 and gh200["example"] is True
    assert set(gh200["metrics"]) >= {"tokens_per_s", "step_time_s", "mfu", "gpu_mem_peak_gib", "cpu_mem_peak_gib",
                                     "feasible"}
    # tokens/s and step time are one number seen two ways: tokens per step / step time.
    assert gh200["metrics"]["tokens_per_s"] * gh200["metrics"]["step_time_s"] == pytest.approx(8 * 2048)
    assert gh200["inputs"]["profile"] == "gh200"
    assert gh200["inputs"]["profile_file"] == str(ROOT / "hardware_profiles" / "gh200.yaml")
    # The GH200 profile's table holds published values (docs/gh200.md): it is an input like a measured one.
    assert [Path(c["file"]) for c in gh200["inputs"]["calibration"]] == [
        ROOT / "calibration" / "published-gh200" / "measurements.csv"]
    assert gh200["inputs"]["implementation"] == "deepspeed"
    assert len(gh200["inputs"]["profile_sha256"]) == 64 and len(gh200["inputs"]["scenario_sha256"]) == 64
    tables = [Path(c["file"]) for c in h200["inputs"]["calibration"]]
    assert tables and all(t.name == "measurements.csv" and t.parent.parent == ROOT / "calibration" for t in tables)


def test_unchanged_inputs_pass(baseline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junit = tmp_path / "junit.xml"
    code, out, err = _run(["check", str(baseline), "--junit", str(junit)], capsys)
    assert code == 0, out
    assert "2 ok, 0 moved, 0 error(s)" in out
    assert err == ""  # stderr is not a terminal here: no progress bar
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    # An identical profile copy in a user folder: another file, the same bytes, the same predictions.
    same = _profile_copy(tmp_path, "peak_bf16_tflops: 989", "peak_bf16_tflops: 989")
    code, out, _ = _run(["--profiles", str(same), "check", str(baseline)], capsys)
    assert code == 0, out


def test_a_2pct_slower_profile_fails_and_names_the_profile(baseline: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # 940 instead of 989 peak TFLOPS (-5%): the GPU-bound part of the step grows, tokens/s drops ~2%.
    slower = _profile_copy(tmp_path, "peak_bf16_tflops: 989", "peak_bf16_tflops: 940")
    junit = tmp_path / "junit.xml"
    code, out, _ = _run(["--profiles", str(slower), "check", str(baseline), "--junit", str(junit),
                         "--format", "json"], capsys)
    assert code == 1
    rows = {r["id"]: r for r in json.loads(out)["scenarios"]}
    moved = rows[GH200]
    assert moved["status"] == "moved"
    assert -0.025 < moved["changes_rel"]["tokens_per_s"] < -0.015
    assert moved["moved"][0].startswith("tokens/s")
    assert [m.split(" ")[0:2] for m in moved["inputs_moved"]] == [["hardware", "profile"]]
    assert str(slower / "gh200.yaml") in moved["inputs_moved"][0]
    assert rows[H200]["status"] == "ok"  # another profile: untouched

    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("errors") == "0"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {GH200, H200}
    failure = cases[GH200].find("failure")
    assert failure is not None and "tokens/s" in str(failure.get("message"))
    assert "hardware profile gh200" in str(failure.text)
    assert cases[H200].find("failure") is None

    # Within a stated 4% tolerance it holds (its inputs moved: said, not failed). 3% is not enough: MFU is
    # measured against the lowered peak, so it rises (+3.2%) while tokens/s falls.
    code, out, _ = _run(["--profiles", str(slower), "check", str(baseline), "--tolerance", "4%"], capsys)
    assert code == 0, out
    assert "input moved, predictions held: hardware profile gh200" in out
    # --only-worse: a faster GPU passes, a slower one still fails. (A higher peak lowers MFU, measured against
    # that peak: a falling MFU is "worse", so MFU gets its own wide tolerance here.)
    faster = _profile_copy(tmp_path / "faster", "peak_bf16_tflops: 989", "peak_bf16_tflops: 1100")
    assert _run(["--profiles", str(faster), "check", str(baseline)], capsys)[0] == 1
    assert _run(["--profiles", str(faster), "check", str(baseline), "--only-worse"], capsys)[0] == 1
    assert _run(["--profiles", str(faster), "check", str(baseline), "--only-worse", "--tolerance", "mfu=20%"],
                capsys)[0] == 0
    assert _run(["--profiles", str(slower), "check", str(baseline), "--only-worse"], capsys)[0] == 1


def test_scenario_file_relative_to_the_baseline_and_its_edits(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "scenarios" / f"{GH200}.yaml", scen)
    base = tmp_path / "ci" / "base.json"
    base.parent.mkdir()
    assert _run(["check", "--write", str(base), str(scen), "--set", "training.micro_batch=4"], capsys)[0] == 0
    entry = json.loads(base.read_text())["scenarios"][0]
    assert entry["source"] == "../mine.yaml" and entry["overrides"] == ["training.micro_batch=4"]
    # A comment changes the file, not the prediction: passes, and says the scenario file moved.
    scen.write_text(scen.read_text() + "# a comment\n")
    code, out, _ = _run(["check", str(base)], capsys)
    assert code == 0 and "input moved, predictions held: scenario file" in out
    # Checking with another micro-batch on top: predictions move, the overrides are named.
    code, out, _ = _run(["check", str(base), "--set", "training.micro_batch=8"], capsys)
    assert code == 1
    assert "input moved: overrides ['training.micro_batch=4'] -> ['training.micro_batch=4', " in out


def test_profile_written_inline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A scenario carrying its profile as a mapping: fingerprinted as that mapping; an edit of it moves both
    the scenario file and the profile."""
    import yaml

    data = yaml.safe_load((ROOT / "scenarios" / f"{GH200}.yaml").read_text())
    # gh200-480gb: a profile without a table (a table named relative to a profile file has no place inline).
    data["hardware"] = yaml.safe_load((ROOT / "hardware_profiles" / "gh200-480gb.yaml").read_text())
    scen = tmp_path / "inline.yaml"
    scen.write_text(yaml.safe_dump(data))
    base = tmp_path / "base.json"
    assert _run(["check", "--write", str(base), str(scen)], capsys)[0] == 0
    inputs = json.loads(base.read_text())["scenarios"][0]["inputs"]
    assert inputs["profile_file"] is None and inputs["profile"] == "gh200-480gb"
    assert _run(["check", str(base)], capsys)[0] == 0
    data["hardware"]["gpu"]["peak_bf16_tflops"] = 940
    scen.write_text(yaml.safe_dump(data))
    code, out, _ = _run(["check", str(base), "--format", "json"], capsys)
    assert code == 1
    (row,) = json.loads(out)["scenarios"]
    assert [m.split(" sha256")[0].split(" (")[0] for m in row["inputs_moved"]] == [
        f"scenario file {scen}:", "hardware profile gh200-480gb"]


def test_scenario_that_no_longer_loads_is_an_error_naming_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "scenarios" / f"{GH200}.yaml", scen)
    base = tmp_path / "base.json"
    assert _run(["check", "--write", str(base), str(scen), H200], capsys)[0] == 0
    scen.write_text(scen.read_text().replace("micro_batch: 8", "micro_batch: eight"))
    junit = tmp_path / "j.xml"
    code, _, err = _run(["check", str(base), "--junit", str(junit)], capsys)
    assert code == 2
    assert f"{scen}:" in err and "micro_batch" in err and "Traceback" not in err
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    (error,) = [c.find("error") for c in suite.iter("testcase") if c.find("error") is not None]
    assert error is not None and "micro_batch" in str(error.get("message"))
    scen.unlink()
    code, _, err = _run(["check", str(base)], capsys)
    assert code == 2 and str(scen) in err


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read"),
    ('{"format": "sosim-check/1", "scenarios": [', "JSON syntax error"),
    ('{"scenarios": []}', "not a sosim check baseline"),
    ('{"format": "sosim-check/1", "scenarios": [{"id": "x"}]}', "scenarios[0].source: missing"),
])
def test_bad_baseline_is_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                content: str | None, message: str) -> None:
    path = tmp_path / "base.json"
    if content is not None:
        path.write_text(content)
    code, out, err = _run(["check", str(path)], capsys)
    assert code == 2 and out == ""
    assert str(path) in err and message in err and "Traceback" not in err


def test_bad_metric_in_baseline_names_its_line(baseline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(baseline.read_text())
    doc["scenarios"][1]["metrics"]["tokens_per_s"] = "fast"
    baseline.write_text(json.dumps(doc, indent=2))
    line = next(i for i, t in enumerate(baseline.read_text().splitlines(), 1) if '"fast"' in t)
    code, _, err = _run(["check", str(baseline)], capsys)
    assert code == 2
    assert f"{baseline}:{line}: scenarios[1].metrics.tokens_per_s: must be a finite number, got 'fast'" in err


def test_bad_recorded_inputs_are_named(baseline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(baseline.read_text())
    doc["scenarios"][0]["inputs"]["calibration"] = 3.5
    doc["scenarios"][0]["inputs"]["profile_sha256"] = None
    doc["scenarios"][1]["overrides"] = [{"a": 1}]
    baseline.write_text(json.dumps(doc, indent=2))
    code, out, err = _run(["check", str(baseline)], capsys)
    assert code == 2 and out == "" and "internal error" not in err
    assert "scenarios[0].inputs.calibration: must be a list of" in err
    assert "scenarios[0].inputs.profile_sha256: must be a string" in err
    assert "scenarios[1].overrides: must be a list of strings" in err


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--help"])
    assert exc.value.code == 0 and "default 1%)" in capsys.readouterr().out
    assert _run(["check"], capsys)[0] == 2
    assert _run(["check", "--write", str(tmp_path / "b.json")], capsys)[0] == 2
    assert _run(["check", "--write", str(tmp_path / "b.json"), GH200, GH200], capsys)[0] == 2
    assert _run(["check", "--write", str(tmp_path / "b.json"), "no_such_scenario"], capsys)[0] == 2
    code, _, err = _run(["check", "--write", str(tmp_path / "b.json"), "9" * 5000], capsys)  # name too long
    assert code == 2 and "(5000 characters): cannot read scenario" in err
    assert not (tmp_path / "b.json").exists()


def test_tolerances() -> None:
    tol = parse_tolerances([])
    assert set(tol.values()) == {0.01}
    tol = parse_tolerances(["2%", "tokens_per_s=0.5%", "mfu=0.03"])
    assert tol["tokens_per_s"] == pytest.approx(0.005) and tol["mfu"] == pytest.approx(0.03)
    assert tol["step_time_s"] == pytest.approx(0.02)
    for bad in ("fast", "speed=1%", "-1%", "nan"):
        with pytest.raises(SosimError, match="--tolerance"):
            parse_tolerances([bad])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(baseline: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["check", str(baseline)]) == 0
    assert "check:" in term.getvalue() and "/2 [" in term.getvalue()  # tqdm: "check:   0%|...| 0/2 [..."
    assert "check:" not in capsys.readouterr().out
