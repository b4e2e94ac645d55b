"""The DeepSpeed step scripts' torch-free parts: shapes no table holds (--size L..h..a..kv..f..), ZeRO-Infinity
(offload_param cpu), the lease column, and the job runner's param=cpu and --skip-done."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_named_and_custom_sizes() -> None:
    step = _script("ds_train_step")
    assert step.parse_size("1.1b") == (22, 2048, 16, 4, 5632)
    assert step.parse_size("2.0b") == (10, 4096, 32, 8, 11008)  # Llama's 8/3 rule rounded up to 256
    assert step.parse_size("L12h2560a32kv8f6912") == (12, 2560, 32, 8, 6912)  # head_dim 80
    assert step.parse_size("3b") is None
    with pytest.raises(ValueError, match="multiple of heads"):
        step.parse_size("L2h1000a3kv1f256")


def test_zero_infinity_config_and_run_id() -> None:
    step = _script("ds_train_step")
    zero = step.ds_config("zero3", 4, 0.0, 10**8, 1.0, 0.8, offload_param=True)["zero_optimization"]
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["stage"] == 3
    with pytest.raises(ValueError, match="zero3"):
        step.ds_config("zero2", 4, 0.0, 10**8, 1.0, 0.8, offload_param=True)
    args = step.build_parser().parse_args(["--config", "zero3", "--size", "L8h3072a48kv48f8192", "--out", "x",
                                           "--offload-param", "--lease", "L1"])
    assert step.run_id_for(args, 1) == "L8h3072a48kv48f8192-s2048-mb4-zero3-clip0-offparam"
    assert args.lease == "L1" and {"offload_param", "lease"} <= set(step.CSV_COLUMNS)


def test_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    step = _script("ds_train_step")
    with pytest.raises(SystemExit) as info:
        step.build_parser().parse_args(["--config", "zero3", "--size", "huge", "--out", "x"])
    assert info.value.code == 2 and "unknown size 'huge'" in capsys.readouterr().err


def test_run_all_param_option_and_skip_done(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_all = _script("ds_run_all")
    argv = run_all.job_argv("L12h2560a32kv8f6912:2048:4:zero3:param=cpu:steps=5", tmp_path)
    assert "--offload-param" in argv and argv[argv.index("--size") + 1] == "L12h2560a32kv8f6912"
    (tmp_path / "done_jobs.txt").write_text("0.5b:2048:4:zero2\n")
    # The only job was finished by an earlier call: nothing is started, nothing fails.
    assert run_all.main(["--out", str(tmp_path), "--deadline-s", "60", "--skip-done", "0.5b:2048:4:zero2"]) == 0
    assert "done in an earlier call, skipped" in capsys.readouterr().out


def test_calibrate_report_replaces_only_its_marked_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _script("calibrate_report")
    monkeypatch.setattr(report, "sections", lambda folder, bands: {"a": lambda: "table A", "b": lambda: "B\nrow"})
    page = tmp_path / "p.md"
    page.write_text("intro\n<!-- generated:a -->\nold\n<!-- /generated:a -->\nkept\n<!-- generated:b -->\n"
                    "<!-- /generated:b -->\n")
    expected = ("intro\n<!-- generated:a -->\ntable A\n<!-- /generated:a -->\nkept\n<!-- generated:b -->\nB\nrow\n"
                "<!-- /generated:b -->\n")
    assert report.write(page, tmp_path, 0) == 0 and page.read_text() == expected
    assert report.write(page, tmp_path, 0) == 0 and page.read_text() == expected  # idempotent
    page.write_text("no markers\n")
    assert report.write(page, tmp_path, 0) == 1
