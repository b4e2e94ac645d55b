"""Sweeps: grid expansion, validation before any work (file:line), error and infeasible rows, incremental
output with --resume, and the same code path on a process pool and on Dask."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sosim import load_scenario, simulate, sweep
from sosim.answers.sweep import expand_grid, load_sweep, point_id, run_sweep
from sosim.cli import main
from sosim.inputs.errors import ConfigError

# Refusals are checked for being quick, not timed: building what they refuse would take hours, so a
# bound 100x above the ~0.1 s they take on a loaded 2-core machine cannot flake and still catches them.
REFUSAL_MARGIN_S = 30.0

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "gh200_zero_offload_4b.yaml"


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _small(tmp_path: Path, grid: str = "  training.micro_batch: [1, 2]\n  schedule.bucket_mb: [64, 1000]\n",
           name: str = "sweep.yaml") -> Path:
    return _write(tmp_path, f"base: {BASE}\nset:\n  model.layers: 2\ngrid:\n{grid}", name)


def test_expand_grid_is_the_cartesian_product_last_key_fastest() -> None:
    points = expand_grid({"a": [1, 2], "b.c": ["x", "y", "z"]})
    assert len(points) == 6
    assert points[:3] == [{"a": 1, "b.c": "x"}, {"a": 1, "b.c": "y"}, {"a": 1, "b.c": "z"}]


def test_point_id_is_stable_and_order_independent() -> None:
    assert point_id({"a": 1, "b": 2.5}) == point_id({"b": 2.5, "a": 1})
    assert point_id({"a": 1}) != point_id({"a": 2})


def test_base_is_relative_to_the_sweep_file_and_points_cross_the_grid(tmp_path: Path) -> None:
    sub = tmp_path / "sweeps"
    sub.mkdir()
    (tmp_path / "base.yaml").write_text(BASE.read_text())
    path = _write(sub, """
        base: ../base.yaml
        grid:
          training.micro_batch: [1, 2, 4]
        points:
          - {model.layers: 2}
          - {model.layers: 3, model.hidden: 1024}
        """)
    spec = load_sweep(path)
    assert len(spec.points) == 6
    assert spec.keys == ["model.layers", "training.micro_batch", "model.hidden"]
    assert spec.points[3] == {"model.layers": 3, "model.hidden": 1024, "training.micro_batch": 1}


def test_unknown_key_path_is_rejected_with_file_and_line_before_any_work(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, f"""
        base: {BASE}
        grid:
          training.micro_batch: [1, 2]
          model.layerz: [2, 3]
          hardware.link.h2d_GBpz: [10]
        """)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert sorted(err.value.problems) == [
        f"{path}:4: model.layerz: unknown key (check the spelling; see docs/scenarios.md)",
        f"{path}:5: hardware.link.h2d_GBpz: unknown key (check the spelling; see docs/scenarios.md)",
    ]
    out = tmp_path / "r.csv"
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    assert not out.exists()  # nothing ran, nothing written
    stderr = capsys.readouterr().err
    assert f"{path}:4: model.layerz: unknown key" in stderr and "Traceback" not in stderr


def test_unknown_key_in_a_later_point_is_found_too(tmp_path: Path) -> None:
    path = _write(tmp_path, f"""
        base: {BASE}
        points:
          - {{training.micro_batch: 1}}
          - {{training.micro_batch: 2, schedule.bukcet_mb: 5}}
        """)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.problems == [f"{path}:4: schedule.bukcet_mb: unknown key (check the spelling; "
                                  "see docs/scenarios.md)"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("grid: {}\n", ":2: grid: empty grid"),
        ("grid:\n  training.micro_batch: []\n", ":3: grid.training.micro_batch: must be a non-empty list"),
        ("points: []\n", ":2: points: must be a non-empty list"),
        ("gird:\n  a: [1]\n", ":2: gird: unknown key"),
        ("set:\n  training.micro_batch: 0\ngrid:\n  model.layers: [2]\n", ":3: training.micro_batch: Input should be"),
    ],
)
def test_bad_sweep_files_name_file_and_line(tmp_path: Path, body: str, expected: str) -> None:
    path = _write(tmp_path, f"base: {BASE}\n{body}")
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert any(p.startswith(str(path)) and expected in p for p in err.value.problems), err.value.problems


def test_missing_base_names_the_base_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "# comment\nbase: nowhere.yaml\ngrid: {model.layers: [2]}\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: base: no such scenario file"):
        load_sweep(path)


def test_rows_hold_metrics_and_swept_values_bad_point_is_an_error_row_infeasible_a_row(tmp_path: Path) -> None:
    # 3 GiB: above gh200's 2 GiB reserve (a reserve at or past the capacity is an input error, issue 26), and
    # still too small for the model: an infeasible row.
    spec = load_sweep(_small(tmp_path, "  training.micro_batch: [0, 2]\n  hardware.gpu.hbm_gib: [3, 80]\n"))
    frame = sweep(spec)
    assert list(frame.columns[:3]) == ["point_id", "training.micro_batch", "hardware.gpu.hbm_gib"]
    assert len(frame) == 4
    bad = frame[frame["training.micro_batch"] == 0]
    assert bad["error"].str.contains("training.micro_batch").all()
    assert bad["tokens_per_s"].isna().all()
    good = frame[frame["training.micro_batch"] == 2].set_index("hardware.gpu.hbm_gib")
    assert good["error"].isna().all()
    assert not good.loc[3, "feasible"] and "GPU memory" in good.loc[3, "reason"]
    assert good.loc[80, "feasible"]
    direct = simulate(load_scenario(BASE, ["model.layers=2", "training.micro_batch=2", "hardware.gpu.hbm_gib=80"]))
    for key in ("step_time_s", "tokens_per_s", "gpu_mem_peak_gib", "exposed_cpu_optimizer_s"):
        assert good.loc[80, key] == pytest.approx(direct.metrics[key])


def test_sweep_of_scenario_objects_keeps_their_order() -> None:
    scs = [load_scenario(BASE, ["model.layers=2", f"training.micro_batch={mb}"]) for mb in (4, 1, 2)]
    frame = sweep(scs)
    expected = [simulate(sc).metrics["tokens_per_s"] for sc in scs]
    assert frame["tokens_per_s"].tolist() == pytest.approx(expected)
    assert frame["error"].isna().all()


def test_csv_output_resume_skips_finished_points(tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    first = run_sweep(load_sweep(_small(tmp_path)), out, chunk_size=1)
    assert (first["ran"], first["skipped"]) == (4, 0)
    # Simulate an interruption in the middle of writing the last row, and a grid that grew meanwhile.
    text = out.read_text()
    out.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + text.splitlines()[-1][:20])
    grown = _small(tmp_path, "  training.micro_batch: [1, 2, 4]\n  schedule.bucket_mb: [64, 1000]\n", "grown.yaml")
    second = run_sweep(load_sweep(grown), out, chunk_size=2, resume=True)
    assert (second["ran"], second["skipped"]) == (3, 3)  # 2 new + the cut row
    frame = pd.read_csv(out)
    assert len(frame) == 6 and frame["point_id"].is_unique
    third = run_sweep(load_sweep(grown), out, resume=True)
    assert third["ran"] == 0


def test_existing_output_without_resume_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    out.write_text("x\n")
    assert main(["sweep", str(_small(tmp_path)), "--out", str(out), "--workers", "1"]) == 2
    assert out.read_text() == "x\n"


def test_parquet_parts_resume_and_point_order(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    spec = load_sweep(_small(tmp_path))
    # A first run that covers the last two points only (as if interrupted), then the whole sweep resumed.
    partial = dataclasses.replace(spec, points=spec.points[2:])
    assert run_sweep(partial, out, chunk_size=1)["ran"] == 2
    assert run_sweep(spec, out, resume=True, chunk_size=1)["ran"] == 2
    # Finished: one part file, rows in point order whatever order the chunks ran in.
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet"]
    frame = pd.read_parquet(out)
    assert list(frame["point_id"]) == [point_id(spec.full_point(p)) for p in spec.points]
    assert frame["feasible"].all()
    assert run_sweep(spec, out, resume=True)["ran"] == 0


def test_cli_process_pool_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    assert main(["sweep", str(_small(tmp_path)), "--out", str(out), "--workers", "2", "--chunk-size", "1",
                 "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ran"] == 4 and summary["errors"] == 0
    assert summary["best"]["training.micro_batch"] == 2
    assert len(pd.read_csv(out)) == 4


def test_process_pool_and_in_process_agree(tmp_path: Path) -> None:
    spec = load_sweep(_small(tmp_path))
    with ProcessPoolExecutor(max_workers=2) as pool:
        pooled = sweep(spec, executor=pool, chunk_size=1)
    local = sweep(spec)
    pd.testing.assert_frame_equal(pooled, local)


def test_dask_executor_same_rows_as_local(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    distributed = pytest.importorskip("distributed")
    spec = load_sweep(_small(tmp_path))
    local = sweep(spec)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        on_dask = sweep(spec, executor=client.get_executor(), chunk_size=1)
        pd.testing.assert_frame_equal(on_dask, local)
        # The CLI path: --scheduler connects its own client to the running cluster.
        out = tmp_path / "dask.csv"
        assert main(["sweep", str(_small(tmp_path)), "--scheduler", cluster.scheduler_address,
                     "--out", str(out), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["ran"] == 4
        assert len(pd.read_csv(out)) == 4


# ------------------------------------------------------------------- inputs that could hurt (issue 8, §6)


def test_duplicate_grid_keys_name_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, f"""
        base: {BASE}
        grid:
          training.micro_batch: [1, 2]
          training.micro_batch: [4]
        """)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.problems == [f"{path}:4: grid.training.micro_batch: duplicate key (first at line 3); "
                                  "each key may appear once"]


def test_keys_must_be_strings_and_numbers_finite(tmp_path: Path) -> None:
    path = _write(tmp_path, f"""
        base: {BASE}
        grid:
          1: [1, 2]
          training.micro_batch: [1, .inf]
        set: {{schedule.bucket_mb: .nan}}
        """)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert sorted(err.value.problems) == sorted([
        f"{path}:3: grid.1: a key must be a key.path string, not 1",
        f"{path}:4: grid.training.micro_batch.1: not a finite number (inf); give a finite value",
        f"{path}:5: set.schedule.bucket_mb: not a finite number (nan); give a finite value",
    ])


def test_huge_grid_is_refused_before_it_is_built(tmp_path: Path) -> None:
    keys = "".join(f"  k{i}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n" for i in range(12))
    path = tmp_path / "huge.yaml"
    path.write_text(f"base: {BASE}\ngrid:\n{keys}")
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert time.perf_counter() - start < REFUSAL_MARGIN_S
    assert err.value.problems[0].startswith(f"{path}:2: grid: 10 x 10 x ")
    assert "= 1,000,000,000,000 points, more than the 1,000,000 one sweep runs" in err.value.problems[0]


@pytest.mark.parametrize(("option", "message"), [
    (["--workers", "-1"], "--workers -1: must be at least 1"),
    (["--workers", "0"], "--workers 0: must be at least 1"),
    (["--workers", "100000"], "--workers 100000: more than 4 per core"),
    (["--scheduler", "notaurl"], "--scheduler notaurl: expected a Dask scheduler address like tcp://HOST:8786"),
    (["--scheduler", "http://x:1"], "--scheduler http://x:1: expected a Dask scheduler address"),
    (["--chunk-size", "0"], "--chunk-size must be at least 1"),
    (["--out", "results.txt"], "--out results.txt: use a .csv or .parquet name"),
])
def test_bad_options_are_one_line_before_any_work(option: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(_small(tmp_path)), *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sosim: {message}") and "Traceback" not in err


def test_out_under_a_file_or_a_folder_named_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    assert main(["sweep", str(_small(tmp_path)), "--out", str(tmp_path / "afile" / "r.csv")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "d.csv").mkdir()
    assert main(["sweep", str(_small(tmp_path)), "--out", str(tmp_path / "d.csv"), "--resume"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_parquet_without_pyarrow_says_how_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    assert main(["sweep", str(_small(tmp_path)), "--out", str(tmp_path / "r.parquet")]) == 2
    assert "Parquet output needs pyarrow: pip install pyarrow" in capsys.readouterr().err


def test_resume_into_a_foreign_file_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    out.write_bytes(b"caf\xe9,x\n1,2\n")
    assert main(["sweep", str(_small(tmp_path)), "--out", str(out), "--resume"]) == 2
    assert "use another --out" in capsys.readouterr().err
    junk = tmp_path / "j.parquet"
    junk.mkdir()
    (junk / "part-00000.parquet").write_text("not parquet")
    assert main(["sweep", str(_small(tmp_path)), "--out", str(junk), "--resume"]) == 2
    assert "cannot read its part files" in capsys.readouterr().err


def test_rows_are_in_point_order_whatever_the_workers(tmp_path: Path) -> None:
    spec = load_sweep(_small(tmp_path))
    outs = []
    for workers, chunk in ((1, 1), (2, 1), (2, 3)):
        out = tmp_path / f"r{workers}{chunk}.csv"
        with ProcessPoolExecutor(max_workers=workers) as pool:
            run_sweep(spec, out, executor=pool, chunk_size=chunk)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]  # byte for byte
    ids = list(pd.read_csv(tmp_path / "r11.csv")["point_id"])
    assert ids == [point_id(spec.full_point(p)) for p in spec.points]


# Slow (runs a 1,200-point sweep to the end): tests/test_signals.py covers SIGTERM in the fast suite; this one
# also checks that --resume then completes the file in point order.
@pytest.mark.slow
def test_sigterm_stops_the_workers_and_prints_the_resume_hint(tmp_path: Path) -> None:
    # A sweep that takes a while: 1,200 points of a 32-layer scenario in chunks of 5, two workers (400 points
    # once finished before the signal on a fast run: the test then raced the sweep, not the signal handling).
    sweep_file = _write(tmp_path, f"""
        base: {BASE}
        grid:
          training.micro_batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
          schedule.bucket_mb: [50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200, 210, 220,
                               230, 240]
          training.grad_accum: [1, 2, 3]
        """)
    out = tmp_path / "r.csv"
    cmd = [sys.executable, "-m", "sosim", "sweep", str(sweep_file), "--out", str(out), "--workers", "2",
           "--chunk-size", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.stat().st_size > 0):
        time.sleep(0.1)
    children = _children(proc.pid)
    assert children, "the pool's workers should be running"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "Traceback" not in err
    assert "terminated (SIGTERM)" in err and "rerun the same command with --resume to continue" in err
    deadline = time.monotonic() + 30  # polled: a loaded machine may take a moment to reap them
    while [pid for pid in children if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)], "pool workers left running"
    # The hint works: --resume finishes the sweep and the file ends up complete and in point order.
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    spec = load_sweep(sweep_file)
    assert list(frame["point_id"]) == [point_id(spec.full_point(p)) for p in spec.points]


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_fastest_point_of_a_tie_is_the_earlier_point_whatever_the_completion_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    sweep_module = importlib.import_module("sosim.answers.sweep")  # the package's 'sweep' attribute is the function
    # Three points that differ only in their description: the same result, a three-way tie.
    spec = load_sweep(_write(tmp_path, f"base: {BASE}\nset:\n  model.layers: 2\ngrid:\n  description: [a, b, c]\n"))
    real = sweep_module.run_items
    best = []
    for reverse in (False, True):
        def completion_order(base, items, sink, reverse=reverse, **kwargs):  # type: ignore[no-untyped-def]
            chunks: list[list[dict[str, object]]] = []
            real(base, items, chunks.append, executor=None, chunk_size=1)
            for rows in (reversed(chunks) if reverse else chunks):  # as workers finishing in another order
                sink(rows)

        monkeypatch.setattr(sweep_module, "run_items", completion_order)
        summary = run_sweep(spec, tmp_path / f"r{reverse}.csv")
        best.append(summary["best"])
    assert best[0] == best[1] and best[0]["description"] == "a"


def test_out_on_a_pseudo_file_system_is_refused_before_any_work(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/proc/self").exists():
        pytest.skip("no /proc")
    assert main(["sweep", str(_small(tmp_path)), "--out", "/proc/sosim-x.csv", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sosim: --out /proc/sosim-x.csv: cannot write") and "--resume" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_shipped_sweep_by_name() -> None:
    spec = load_sweep("sweeps/gh200_zero_offload_buckets")
    assert len(spec.points) == 12


def test_rows_name_system_implementation_profile_and_calibration(tmp_path: Path) -> None:
    frame = sweep(load_sweep(_small(tmp_path)))
    implementation = load_scenario(BASE).schedule.implementation  # type: ignore[union-attr]
    assert set(frame["system"]) == {"zero_offload"} and set(frame["implementation"]) == {implementation}
    # gh200 names the table of published GH200 values (calibration/published-gh200, issue 16)
    assert set(frame["profile"]) == {"gh200"} and frame["calibration"].str.contains("published-gh200").all()
    calibrated = sweep("scenarios/h200_x86_llama1.1b_zero2_measured.yaml", [{"training.micro_batch": 1}])
    assert calibrated["calibration"].iloc[0].endswith("measurements.csv")


def test_profile_that_leaves_fields_at_their_defaults_sweeps(tmp_path: Path) -> None:
    """Found by the fuzz run: the resolved profile travelled with its defaulted fields, which then needed a
    source each, so every point of a sweep over such a profile was an error row."""
    from helpers import TINY_PROFILE, tiny_scenario

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY_PROFILE))
    scenario = tiny_scenario({"system": "zero_offload"})
    scenario["hardware"] = "tiny.yaml"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    path = _write(tmp_path, "base: s.yaml\ngrid:\n  training.micro_batch: [1, 2]\n")
    frame = sweep(load_sweep(path))
    assert frame["error"].isna().all(), list(frame["error"])
    assert sweep(load_scenario(tmp_path / "s.yaml"), [{"training.micro_batch": 1}])["error"].isna().all()


def test_every_shipped_sweep_has_valid_points() -> None:
    """A shipped sweep whose points the schema rejects would give a table of error rows: load a spread of
    points of each (every 97th, the first and the last) as the workers would."""
    from pathlib import Path

    from sosim.answers.sweep import load_sweep
    from sosim.run.loader import load_scenario

    for path in sorted((Path(__file__).resolve().parent.parent / "scenarios" / "sweeps").glob("*.yaml")):
        spec = load_sweep(path)
        picks = sorted({0, len(spec.points) - 1, *range(0, len(spec.points), 97)})
        for i in picks:
            load_scenario(spec.base, spec.overrides(spec.points[i]))
