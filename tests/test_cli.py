"""CLI contracts: one JSON object, plausible tables, maxsize, python -m sosim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sosim.cli import main

METRIC_KEYS = {"step_time_s", "tokens_per_s", "samples_per_s", "model_tflops", "hardware_tflops", "mfu",
               "gpu_busy_frac", "exposed_cpu_optimizer_s", "exposed_h2d_s", "exposed_d2h_s",
               "gpu_mem_peak_gib", "cpu_mem_peak_gib", "feasible"}


def test_run_json_is_one_object_with_the_contract_metrics(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(root / "scenarios/gh200_zero_offload_4b.yaml"), "--format", "json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert set(data) >= METRIC_KEYS
    assert out.count("\n") == 1


def test_run_table_and_set(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(root / "scenarios/h100_gpu_only_1b.yaml"), "--set", "training.micro_batch=2"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "MFU" in out


def test_profiles_lists_shipped_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--format", "json"]) == 0
    names = {p["name"] for p in json.loads(capsys.readouterr().out)["profiles"]}
    assert {"gh200", "h100-sxm-pcie5-x86", "h200-pcie-gen5-x86", "v100-dgx2"} <= names


def test_maxsize_paper_family(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["maxsize", str(root / "scenarios/gh200_gpu_only_2b.yaml"), "--grow", "paper",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_params_b"] < 6  # all model state in 96 GB HBM: a few billion parameters at most
    assert data["next_size_fails_because"].startswith("GPU memory")


def test_python_dash_m(root: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sosim", "profiles"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "gh200" in proc.stdout


def test_calibrate_passes_options_through_and_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI has no torch and no GPU: one line on stderr, exit 2, no traceback.
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "cal")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("torch" in err or "GPU" in err or "CUDA" in err)


def test_json_output_is_strict(capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from sosim.formats.output import print_json

    print_json({"a": float("nan"), "b": np.float64(1.5), "c": [np.int64(2), float("inf")], "d": None})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": 1.5, "c": [2, None], "d": None}


# ----------------------------------------------------------------------------- the run table and JSON


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_infeasible_run_says_so_before_any_speed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["run", "gh200_zero_offload_4b", "--set", "training.micro_batch=256"], capsys)
    assert code == 0
    lines = out.splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("INFEASIBLE: GPU memory"))
    speed = next(i for i, line in enumerate(lines) if "tokens/s" in line)
    assert verdict < speed and verdict <= 1
    assert "OVER" in out  # the side that does not fit is marked in the memory section


def test_table_names_provenance_mfu_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["run", "h200_x86_llama1.1b_zero2_measured"], capsys)
    assert code == 0 and out.splitlines()[1] == "feasible: fits in GPU and CPU memory"
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "zero_offload" in rows["system"] and "deepspeed" in rows["implementation"]
    assert "h200-pcie-gen5-x86" in rows["profile"]
    assert "measurements.csv" in rows["calibration"] and "sha256" in rows["calibration"]
    data = json.loads(_run(["run", "h200_x86_llama1.1b_zero2_measured", "--format", "json"], capsys)[1])
    # MFU as a percentage of the stated peak, and its definition printed with the table.
    assert f"{data['mfu']:.1%} of 989 TFLOPS peak bf16 x 1 GPU(s)" in rows["MFU"]
    assert "MFU = model FLOPs per step (6 x parameters x tokens + 6 x layers x hidden x seq_len x tokens" in out
    # Memory: used / usable on each side, usable = capacity - the profile's reserve.
    assert f"{data['gpu_mem_peak_gib']:,.1f} / {data['gpu_mem_usable_gib']:,.1f} GiB" in rows["GPU"]
    assert f"{data['cpu_mem_peak_gib']:,.1f} / {data['cpu_mem_usable_gib']:,.1f} GiB" in rows["CPU"]
    assert data["gpu_mem_usable_gib"] == pytest.approx(131.3 - 2.0)
    assert data["implementation"] == "deepspeed" and data["profile"] == "h200-pcie-gen5-x86"
    assert data["calibration"].endswith("measurements.csv")


def test_uncalibrated_run_says_analytic(capsys: pytest.CaptureFixture[str]) -> None:
    # gh200 names a table of published values (issue 16); gh200-480gb is the analytic one.
    out = _run(["run", "gh200_zero_offload_4b", "--set", "hardware=gh200-480gb"], capsys)[1]
    assert "calibration" in out and "none (analytic cost model" in out


# ------------------------------------------------------------------------- bad command-line inputs


@pytest.mark.parametrize(("extra", "message"), [
    (["--trace", "."], "--trace .: is a folder; give a file name"),
    (["--plot", "out.xyz"], "--plot out.xyz: unsupported file type '.xyz'"),
    (["--plot", "out"], "--plot out: unsupported file type '(none)'"),
    (["--trace", ""], "--trace: empty file name"),
])
def test_output_paths_are_checked_before_simulating(extra: list[str], message: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["run", "gh200_zero_offload_4b", *extra], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"sosim: {message}")


def test_output_under_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--trace", str(tmp_path / "afile" / "t.json")], capsys)
    assert code == 2 and "is not a folder" in err


def test_write_failure_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import sosim.formats.trace

    def fail(result: object, path: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sosim.formats.trace, "write_trace", fail)
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--trace", str(tmp_path / "t.json")], capsys)
    assert code == 2 and "cannot write: No space left on device" in err and "Traceback" not in err


def test_non_finite_result_is_refused(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import sosim

    real = sosim.simulate

    def nan_simulate(sc: object, **kwargs: str) -> object:
        result = real(sc, **kwargs)  # type: ignore[arg-type]
        result.metrics["step_time_s"] = float("nan")
        return result

    monkeypatch.setattr(sosim, "simulate", nan_simulate)
    code, out, err = _run(["run", "gh200_zero_offload_4b", "--format", "json"], capsys)
    assert code == 2 and out == ""
    assert "gh200_zero_offload_4b: the simulation gave non-finite step_time_s" in err


def test_internal_error_is_one_line_and_exit_70(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import sosim.cli

    def boom(args: object) -> int:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(sosim.cli, "cmd_examples", boom)
    code, _, err = _run(["examples"], capsys)
    assert code == 70 and err.count("\n") == 1
    assert "internal error: ZeroDivisionError: division by zero" in err and "SOSIM_DEBUG=1" in err


def test_interrupt_is_exit_130(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import sosim.cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(sosim.cli, "cmd_examples", interrupted)
    code, _, err = _run(["examples"], capsys)
    assert code == 130 and err == "sosim: interrupted\n"


def test_undecodable_argument_bytes_do_not_crash_the_output() -> None:
    # A Latin-1 byte in a shell argument arrives as a surrogate; an ASCII terminal cannot print it either.
    proc = subprocess.run([sys.executable, "-m", "sosim", "run", "gh200_zero_offload_4b", "--set", "name=x\udce9"],
                          capture_output=True, env={**os.environ, "PYTHONIOENCODING": "ascii"}, check=False)
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert b"not UTF-8 text" in proc.stderr


# ------------------------------------------------------------------------------- examples, profiles


def test_examples_lists_and_runs_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["examples"], capsys)[0] == 0
    out = _run(["examples", "--format", "json"], capsys)[1]
    names = {e["name"] for e in json.loads(out)["examples"]}
    assert {"gh200_zero_offload_4b", "sweeps/gh200_zero_offload_buckets"} <= names
    assert _run(["run", "gh200_zero_offload_4b", "--format", "json"], capsys)[0] == 0


def test_profiles_option_and_shadowing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sosim.inputs.resources import shipped_profiles_dir

    (tmp_path / "gh200.yaml").write_text((shipped_profiles_dir() / "gh200.yaml").read_text())
    code, out, _ = _run(["profiles", "--profiles", str(tmp_path), "--format", "json"], capsys)
    rows = {p["name"]: p for p in json.loads(out)["profiles"]}
    assert code == 0 and rows["gh200"]["origin"] == "--profiles"
    assert rows["gh200"]["shadows"] == [str(shipped_profiles_dir() / "gh200.yaml")]
    # Given before the sub-command, too; and the environment is restored afterwards.
    assert _run(["--profiles", str(tmp_path), "profiles"], capsys)[0] == 0
    assert "SOSIM_PROFILES" not in os.environ
    code, _, err = _run(["profiles", "--profiles", str(tmp_path / "nope")], capsys)
    assert code == 2 and "--profiles" in err and "not a folder" in err


def test_validate_malformed_row_is_exit_2_with_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refs = tmp_path / "refs.yaml"
    refs.write_text("rows:\n  - id: x\n    source: s\n    kind: metric\n"
                    "    scenario: scenarios/gh200_zero_offload_4b.yaml\n"
                    "    metric: mfu\n    published: abc\n    budget_rel: 0.1\n  - 5\n")
    code, _, err = _run(["validate", "--references", str(refs)], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"{refs}:7: rows[0].published: must be a number, got 'abc'" in err
    assert f"{refs}:9: rows[1]: must be a mapping" in err


def test_run_says_which_profile_it_used_when_a_name_is_ambiguous(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from sosim.inputs.resources import shipped_profiles_dir

    (tmp_path / "gh200.yaml").write_text((shipped_profiles_dir() / "gh200.yaml").read_text())
    code, _, err = _run(["run", "gh200_zero_offload_4b", "--profiles", str(tmp_path), "--format", "json"], capsys)
    assert code == 0
    assert err == (f"sosim: note: hardware profile 'gh200': using {tmp_path / 'gh200.yaml'} (--profiles), which "
                   f"shadows {shipped_profiles_dir() / 'gh200.yaml'} (shipped)\n")


def test_other_inputs_that_could_hurt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compare's --plot, a calibration table that is a device, JSON configs that are binary or too deep."""
    code, _, err = _run(["compare", "gh200_zero_offload_4b", "gh200_zero_offload_4b", "--plot", "x.xyz"], capsys)
    assert code == 2 and "--plot x.xyz: unsupported file type" in err
    if Path("/dev/zero").exists():
        code, _, err = _run(["run", "gh200_zero_offload_4b", "--set", "hardware.calibration=/dev/zero"], capsys)
        assert code == 2 and "calibration: /dev/zero: not a regular file" in err
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    code, _, err = _run(["run", "--ds-config", str(deep), "--model", str(deep), "--hardware", "gh200"], capsys)
    assert code == 2 and "JSON nested too deeply" in err
    binary = tmp_path / "b.json"
    binary.write_bytes(b"{\"a\": \"\xd0\"}")
    code, _, err = _run(["run", "--ds-config", str(binary), "--model", str(binary), "--hardware", "gh200"], capsys)
    assert code == 2 and f"{binary}:1: not UTF-8 text" in err


def test_mfu_definition_printed_is_the_one_computed() -> None:
    """The table's definition, by hand: (6 N tokens + 6 L h s tokens) / step / peak equals the metric."""
    from sosim import load_scenario, simulate
    from sosim.hardware.model import flop_params

    sc = load_scenario("gh200_zero_offload_4b")
    r = simulate(sc)
    m, t = sc.model, sc.training
    tokens = t.seq_len * t.micro_batch * t.grad_accum * sc.cluster.gpus
    flops = 6 * flop_params(m) * tokens + 6 * m.layers * m.hidden * t.seq_len * tokens
    peak = sc.hardware.gpu.peak_bf16_tflops * 1e12 * sc.cluster.gpus
    assert r.metrics["mfu"] == pytest.approx(flops / r.metrics["step_time_s"] / peak, rel=1e-12)
