"""Issue 26's reproductions, one by one: each exits 2 with a located message (or 0/1 where the input is legal)
within seconds, and no file changes that the user did not ask to change.

Classes: data loss (outputs, ``sweep --resume``), unbounded reads (FIFOs, devices, list-form tables), exit 70
from bad input (YAML tags, damaged resume files, names the file system refuses, hostile JSON), absurd results
(physical bounds, reserve past capacity), messages (capped, naming their --set), signals (tests/test_signals.py
has the worker pools; the first-instant handling is here).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sosim.cli import main

ROOT = Path(__file__).resolve().parent.parent
SWEEP = str(ROOT / "scenarios" / "sweeps" / "gh200_zero_offload_buckets.yaml")
GPT2 = str(ROOT / "scenarios" / "deepspeed" / "models" / "gpt2.json")
DS = ROOT / "scenarios" / "deepspeed" / "superoffload_gh200.json"
SECONDS = 10  # issue 26: every reproduction ends within 10 s


@pytest.fixture(autouse=True)
def _bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test in its own folder, and a blocked read or write fails the test instead of hanging it."""
    monkeypatch.chdir(tmp_path)

    def alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"ran past {SECONDS} s (a FIFO blocked?)")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(SECONDS * 3)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


# ------------------------------------------------------------------------------------------- data loss

def test_resume_never_truncates_a_file_that_is_not_this_sweeps(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.csv"
    notes.write_text("my notes")
    code, _, err = _run(["sweep", SWEEP, "--out", str(notes), "--resume"], capsys)
    assert code == 2 and err.startswith(f"{notes}:1: not the output of this sweep") and notes.read_text() == "my notes"
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n3,4")  # another CSV, its last line unterminated: it used to lose that line
    code, _, err = _run(["sweep", SWEEP, "--out", str(other), "--resume"], capsys)
    assert code == 2 and "its columns differ" in err and other.read_text() == "a,b\n1,2\n3,4"


@pytest.mark.parametrize("damage", [b"\n", b"\xff\xfe\n", b'"abc,1\n'], ids=["blank line", "not UTF-8", "quote"])
def test_a_damaged_resume_file_is_located_and_left_as_it_was(damage: bytes, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    assert _run(["sweep", SWEEP, "--out", str(out)], capsys)[0] == 0
    lines = out.read_bytes().splitlines(keepends=True)
    damaged = b"".join([*lines[:2], damage, *lines[2:]])
    out.write_bytes(damaged)
    code, _, err = _run(["sweep", SWEEP, "--out", str(out), "--resume"], capsys)
    assert code == 2 and err.startswith(f"{out}:3: "), err
    assert out.read_bytes() == damaged


def test_resume_cuts_only_its_own_partial_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    assert _run(["sweep", SWEEP, "--out", str(out)], capsys)[0] == 0
    whole = out.read_bytes()
    out.write_bytes(whole[:-20])  # a crash in the middle of an append
    assert _run(["sweep", SWEEP, "--out", str(out), "--resume"], capsys)[0] == 0
    assert out.read_bytes() == whole  # the cut point ran again


@pytest.mark.parametrize("option", ["check --write", "--trace", "--plot", "--emit-ds-config", "--junit", "tune --out"])
def test_outputs_never_replace_a_file_sosim_did_not_write(option: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / ("out.xml" if option == "--junit" else "out.png" if option == "--plot" else "out.json")
    ds = tmp_path / "ds.json"
    ds.write_bytes(DS.read_bytes())
    if option == "--junit":
        assert _run(["check", "--write", "base.json", "gh200_zero_offload_4b"], capsys)[0] == 0
    args = {"check --write": ["check", "--write", str(target), "gh200_zero_offload_4b"],
            "--trace": ["run", "gh200_zero_offload_4b", "--trace", str(target)],
            "--plot": ["run", "gh200_zero_offload_4b", "--plot", str(target)],
            "--emit-ds-config": ["run", "--ds-config", str(ds), "--model", GPT2, "--hardware", "gh200",
                                 "--emit-ds-config", str(target)],
            "--junit": ["check", "base.json", "--junit", str(target)],
            "tune --out": ["tune", "gh200_zero_offload_4b", "--budget", "5", "--no-progress", "--out", str(target)],
            }[option]
    target.write_text("the user's file\n")
    code, _, err = _run(args, capsys)
    assert code == 2 and "--force" in err and target.read_text() == "the user's file\n"
    assert _run([*args, "--force"], capsys)[0] in (0, 1)  # check: a moved prediction is 1
    replaced = target.read_bytes()
    assert replaced != b"the user's file\n"
    assert _run(args, capsys)[0] in (0, 1)  # sosim's own previous output: replaced without --force


@pytest.mark.parametrize("kind", ["symlink", "fifo", "device", "input"])
def test_outputs_never_go_over_links_fifos_devices_or_inputs(kind: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds.json"
    ds.write_bytes(DS.read_bytes())
    real = tmp_path / "real.json"
    real.write_text("x")
    if kind == "symlink":
        target = tmp_path / "link.json"
        target.symlink_to(real)
    elif kind == "fifo":
        target = tmp_path / "f.json"
        os.mkfifo(target)
    elif kind == "device":
        target = Path("/dev/null")
    else:
        target = ds
    if kind == "input":  # an input of the command itself: even --force does not replace it
        scenario = tmp_path / "s.yaml"
        scenario.write_bytes((ROOT / "scenarios" / "gh200_zero_offload_4b.yaml").read_bytes())
        for args in (["run", "--ds-config", str(ds), "--model", GPT2, "--hardware", "gh200", "--emit-ds-config",
                      str(ds), "--force"], ["check", "--write", str(scenario), str(scenario), "--force"],
                     ["run", str(scenario), "--trace", str(scenario), "--force"]):
            code, _, err = _run(args, capsys)
            assert code == 2 and "is an input this command reads" in err, (args, err)
        assert ds.read_bytes() == DS.read_bytes()
        assert scenario.read_bytes() == (ROOT / "scenarios" / "gh200_zero_offload_4b.yaml").read_bytes()
        return
    for args in (["check", "--write", str(target), "gh200_zero_offload_4b", "--force"],
                 ["run", "gh200_zero_offload_4b", "--trace", str(target), "--force"],
                 ["run", "--ds-config", str(ds), "--model", GPT2, "--hardware", "gh200", "--emit-ds-config",
                  str(target), "--force"],
                 ["tune", "gh200_zero_offload_4b", "--budget", "5", "--no-progress", "--out", str(target), "--force"]):
        code, _, err = _run(args, capsys)
        assert code == 2 and str(target) in err, (args, err)
    assert real.read_text() == "x" and ds.read_bytes() == DS.read_bytes()
    if kind == "symlink":
        assert target.is_symlink()
    if kind == "fifo":
        assert target.is_fifo()


# ------------------------------------------------------------------------------------ unbounded reads

def test_named_pipes_are_refused_on_every_route(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    (tmp_path / "profiles").mkdir()
    os.mkfifo(tmp_path / "profiles" / "pipe.yaml")
    for args in (["run", str(fifo)],
                 ["run", "gh200_zero_offload_4b", "--set", "hardware=pipe", "--profiles", str(tmp_path / "profiles")],
                 ["run", "--ds-config", str(fifo), "--model", GPT2, "--hardware", "gh200"],
                 ["run", "--ds-config", str(DS), "--model", str(fifo), "--hardware", "gh200"],
                 ["check", str(fifo)], ["validate", "--references", str(fifo), "--no-measured"],
                 ["sweep", str(fifo)]):
        code, _, err = _run(args, capsys)
        assert code == 2 and "named pipe" in err, (args, err)


@pytest.mark.parametrize("value", ["[/dev/zero]", "/dev/zero", "[/tmp]", "[nosuch.csv]", "[5]", "[]"])
def test_list_form_tables_are_checked_and_named_by_their_set(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = f"hardware.calibration={value}"
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--set", text], capsys)
    assert code == 2 and err.startswith(f"--set {text}: calibration: "), err
    code, _, err = _run(["tune", "gh200_zero_offload_4b", "--budget", "5", "--no-write", "--no-progress",
                         "--set", text], capsys)
    assert code == 2 and "NO CONFIGURATION FITS" not in err and f"--set {text}" in err  # an input error


def test_a_baselines_overrides_and_a_sweep_point_go_through_the_same_checks(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["check", "--write", "b.json", "gh200_zero_offload_4b"], capsys)[0] == 0
    doc = json.loads(Path("b.json").read_text())
    doc["scenarios"][0]["overrides"] = ["hardware.calibration=[/dev/zero]"]
    Path("b.json").write_text(json.dumps(doc))
    code, _, err = _run(["check", "b.json"], capsys)
    assert code == 2 and "/dev/zero: not a regular file" in err
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"base: {ROOT / 'scenarios' / 'gh200_zero_offload_4b.yaml'}\npoints:\n"
                     "  - {hardware.calibration: [/dev/zero]}\n")
    code, out, _ = _run(["sweep", str(sweep), "--format", "json"], capsys)
    assert code == 0 and "/dev/zero: not a regular file" in out  # an error row, at once


# ---------------------------------------------------------------------------- exit 70 from bad input

@pytest.mark.parametrize("value", ["!!bool maybe", "!!int abc", "!!float abc", "!!int ''", "!!timestamp x",
                                   "!!int '0x'", "!!int '" + "9" * 5000 + "'", "!!python/object:os.system x",
                                   "!!set {a}", "2024-13-45", "! '" + "9" * 5000 + "'", "0x_", "-0b_"])
def test_yaml_tags_outside_the_core_or_unbuildable_are_located(value: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--set", f"model.layers={value}"], capsys)
    assert code == 2 and err.startswith("--set model.layers=") and ": model.layers: " in err, err
    scenario = tmp_path / "s.yaml"
    scenario.write_text((ROOT / "scenarios" / "gh200_zero_offload_4b.yaml").read_text()
                        + f"\nextra: {value}\n")
    code, _, err = _run(["run", str(scenario)], capsys)
    assert code == 2 and err.startswith(f"{scenario}:"), err


def test_names_the_file_system_refuses_are_located(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["run", "a" * 300 + ".yaml"], capsys)
    assert code == 2 and "longer than the file system allows" in err
    code, _, err = _run(["run", ""], capsys)
    assert code == 2 and "empty path" in err and "Is a directory" not in err
    monkeypatch.setenv("SOSIM_PROFILES", "b" * 5000)
    assert _run(["run", "gh200_zero_offload_4b"], capsys)[0] == 0  # a folder that cannot exist holds no profile


def test_hostile_json_and_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = json.loads(DS.read_text())
    big = tmp_path / "big.json"
    big.write_text(json.dumps(ds).replace('"train_micro_batch_size_per_gpu": 4',
                                          '"train_micro_batch_size_per_gpu": ' + "9" * 4300))
    code, _, err = _run(["run", "--ds-config", str(big), "--model", GPT2, "--hardware", "gh200"], capsys)
    assert code == 2 and err.startswith(f"{big}:1: a number of 4,300 characters"), err
    # head_dim: read for Llama-type (gated) configs, where {} was a TypeError (exit 70); GPT-2 does not read it.
    model = json.loads((ROOT / "scenarios" / "deepspeed" / "models" / "llama-3-8b.json").read_text())
    model["head_dim"] = {}
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps(model, indent=1))
    code, _, err = _run(["run", "--ds-config", str(DS), "--model", str(hf), "--hardware", "gh200"], capsys)
    assert code == 2 and "head_dim: expected a positive integer, got {}" in err
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--set", ".".join(["a"] * 5000) + "=1"], capsys)
    assert code == 2 and "a key of 5,000 parts" in err


def test_a_nul_in_a_profiles_table_name_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = (ROOT / "hardware_profiles" / "gh200-480gb.yaml").read_text() + '\ncalibration: "a\\0b.csv"\n'
    (tmp_path / "p.yaml").write_text(profile)
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--set", f"hardware={tmp_path / 'p.yaml'}"], capsys)
    assert code == 2 and "NUL character" in err and err.startswith(f"{tmp_path / 'p.yaml'}:"), err


# ----------------------------------------------------------------------------------- absurd results

@pytest.mark.parametrize("setting", [
    "gpu.peak_bf16_tflops=1e-300", "link.latency_us=1e300", "gpu.layer_overhead_us=1e300",
    "gpu.layer_min_fwd_us=1e300", "gpu.attention_bwd_factor=1e300", "gpu.hbm_efficiency=1e-300",
    "gpu.attention_efficiency=1e-300", "link.pageable_factor=1e-300", "gpu.reserved_gib=1000",
    "cpu.reserved_gib=1e5", "cpu.adam_s_by_gparams.cpu_adam=[[1, 1e300], [2, 2e300]]",
    "cpu.adam_s_by_gparams.cpu_adam=[[1, 1e-300], [2, 2e-300]]", "gpu.gemm_efficiency=[[1, 1e-300]]",
    "cpu.page_kib=1e300", "cpu.host_thread_speed=1e-300"])
def test_physical_constants_out_of_range_are_refused_at_their_set(setting: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    key = setting.split("=")[0]
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--set", f"hardware.{setting}"], capsys)
    assert code == 2 and err.startswith(f"--set hardware.{setting}: hardware.{key}: "), err


def test_a_calibration_row_of_absurd_time_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = ROOT / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv"
    lines = src.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[1].split(",")
    row[header.index("median_s")] = "1e300"
    table = tmp_path / "m.csv"
    table.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    code, _, err = _run(["run", "h200_x86_llama1.1b_zero2_measured", "--set", f"hardware.calibration={table}"], capsys)
    assert code == 2 and "line 2: column median_s" in err, err


def test_an_edited_baseline_of_zero_tokens_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["check", "--write", "b.json", "gh200_zero_offload_4b"], capsys)[0] == 0
    doc = json.loads(Path("b.json").read_text())
    doc["scenarios"][0]["metrics"]["tokens_per_s"] = 0
    Path("b.json").write_text(json.dumps(doc, indent=2))
    code, out, err = _run(["check", "b.json"], capsys)
    assert code == 2 and "scenarios[0].metrics.tokens_per_s: must be positive" in err and "inf" not in out + err


# ------------------------------------------------------------------------------------------ messages

def test_problems_are_capped_with_a_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    many = tmp_path / "many.yaml"
    many.write_text("hardware: gh200\n" + "".join(f"k{i}: 1\n" for i in range(2000)))  # + 3 sections missing
    code, _, err = _run(["run", str(many)], capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 51 and all(line.startswith(f"{many}:") for line in lines[:50])
    assert lines[-1] == "sosim: ... and 1,953 more problem(s) (the first 50 are shown)"


# ------------------------------------------------------------------------------------------- signals

@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signals")
@pytest.mark.parametrize(("command", "signum", "code"), [
    (["validate", "--no-measured"], signal.SIGTERM, 143), (["check", "--write", "b.json", "gh200_zero_offload_4b"],
                                                           signal.SIGTERM, 143),
    (["run", "gh200_zero_offload_4b"], signal.SIGINT, 130), (["tune", "gh200_zero_offload_4b", "--no-write"],
                                                            signal.SIGTERM, 143)])
def test_a_signal_in_the_first_instant_is_one_line_and_its_exit_status(command: list[str], signum: int, code: int,
                                                                       tmp_path: Path) -> None:
    """A signal while the CLI imports pandas (about the first second): one line, 130 / 143, no traceback. The
    process is started and signalled once its Python code runs (its first import of sosim.cli)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", "import sys, sosim.cli; sys.stderr.write('ready\\n'); "
                             "sys.stderr.flush(); sys.exit(sosim.cli.main(sys.argv[1:]))", *command],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    assert proc.stderr.readline() == "ready\n"
    time.sleep(0.05)  # inside main(): building the parser imports the commands (pandas...)
    proc.send_signal(signum)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_file_that_only_mentions_sosims_markers_is_not_its_output(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzz run: a text file holding the word 'matplotlib' passed for a figure sosim wrote."""
    for name, content in (("f.png", b"matplotlib"), ("b.json", b'notes: "format": "sosim-check/1"'),
                          ("j.xml", b'<testsuite name="sosim check x">')):
        (tmp_path / name).write_bytes(content)
    assert _run(["run", "gh200_zero_offload_4b", "--plot", "f.png"], capsys)[0] == 2
    assert _run(["check", "--write", "b.json", "gh200_zero_offload_4b"], capsys)[0] == 2
    assert _run(["check", "--write", "base.json", "gh200_zero_offload_4b"], capsys)[0] == 0
    assert _run(["check", "base.json", "--junit", "j.xml"], capsys)[0] == 2
    assert [(tmp_path / n).read_bytes() for n in ("f.png", "b.json", "j.xml")] == [
        b"matplotlib", b'notes: "format": "sosim-check/1"', b'<testsuite name="sosim check x">']


def test_a_sweep_base_no_file_can_have_is_located(tmp_path: Path) -> None:
    """Found by the fuzz run: load_sweep stat'ed a 5,000-character base name (OSError)."""
    from sosim.answers.sweep import load_sweep
    from sosim.inputs.errors import ConfigError

    path = tmp_path / "s.yaml"
    path.write_text(f"base: {'s' * 5000}.yaml\ngrid: {{training.micro_batch: [1]}}\n")
    with pytest.raises(ConfigError, match=r"s.yaml:1: base: a path of 5,005 bytes is longer"):
        load_sweep(path)


def test_a_shipped_examples_file_counts_as_an_input_of_its_command() -> None:
    """``check --write scenarios/x.yaml x --force`` must not replace the example it reads: the inputs an output
    is compared with include the file an example's name resolves to."""
    from sosim.run.loader import input_files

    found = input_files(["gh200_zero_offload_4b", None, ""])
    assert any(Path(p).resolve() == (ROOT / "scenarios" / "gh200_zero_offload_4b.yaml").resolve() for p in found)


@pytest.mark.parametrize(("name", "content"), [
    ("x.svg", b"%% Creator: Matplotlib"), ("x.pgf", b"%% Creator: Matplotlib, PGF backend\n"),
    ("x.png", b"\x89PNG\r\n\x1a\ntEXtSoftware\x00Matplotlib"), ("t.json", b'{"traceEvents":[]}')])
def test_a_file_holding_only_a_marker_is_not_sosims_output(name: str, content: bytes, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzz run (Hypothesis tries the literals of the code): a figure or a trace is recognised by
    its first bytes, its signature and its last bytes, each as its writer leaves them."""
    (tmp_path / name).write_bytes(content)
    option = "--trace" if name.endswith(".json") else "--plot"
    code, _, err = _run(["run", "gh200_zero_offload_4b", option, name], capsys)
    assert code == 2 and "--force" in err and (tmp_path / name).read_bytes() == content


def test_framework_inputs_and_outputs_go_through_the_same_reader_and_writer(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    frameworks = ROOT / "scenarios" / "frameworks"
    job, args = frameworks / "llama3_8b_torchtitan.toml", frameworks / "llama3_8b_megatron_args.txt"
    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    for option in ("--torchtitan", "--megatron-args"):
        code, _, err = _run(["run", option, str(fifo), "--hardware", "gh200"], capsys)
        assert code == 2 and "named pipe" in err, err
    mine = tmp_path / "u.toml"
    mine.write_text("mine\n")
    code, _, err = _run(["run", "--torchtitan", str(job), "--hardware", "gh200", "--emit-torchtitan", str(mine)],
                        capsys)
    assert code == 2 and "--force" in err and mine.read_text() == "mine\n"
    for option, source, emit, name in (("--torchtitan", job, "--emit-torchtitan", "o.toml"),
                                       ("--megatron-args", args, "--emit-megatron-args", "o.txt")):
        out = tmp_path / name
        for _ in range(2):  # the second run replaces sosim's own previous output
            assert _run(["run", option, str(source), "--hardware", "gh200", emit, str(out)], capsys)[0] == 0
        copy = tmp_path / f"in-{name}"
        copy.write_bytes(source.read_bytes())
        code, _, err = _run(["run", option, str(copy), "--hardware", "gh200", emit, str(copy), "--force"], capsys)
        assert code == 2 and "is an input this command reads" in err and copy.read_bytes() == source.read_bytes()


def test_calibrate_never_replaces_a_measured_table_unasked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`calibrate --out DIR` over an earlier calibration refuses before anything is measured (torch or not); the
    table is unchanged; --append and --force are the two ways to say otherwise."""
    from sosim.calibrate import cli as calcli

    cal = tmp_path / "cal"
    cal.mkdir()
    table = cal / "measurements.csv"
    table.write_text("op,variant\nmy,rows\n")
    assert calcli.main(["--quick", "--out", str(cal)]) == 2
    err = capsys.readouterr().err
    assert "measurements.csv exists: --append adds to it, --force replaces it" in err and "Traceback" not in err
    assert table.read_text() == "op,variant\nmy,rows\n"
    for allowed in ("--append", "--force"):  # past the guard: on to torch, which CI lacks (exit 2, other message)
        calcli.main(["--quick", "--out", str(cal), allowed])
        assert "exists: --append" not in capsys.readouterr().err
