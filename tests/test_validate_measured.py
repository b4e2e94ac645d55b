"""Measured DeepSpeed runs as validation rows: reading, the dsconfig mapping, the harness's barriers."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sosim.answers.validate_measured import (
    BACKWARD,
    FORWARD,
    STEP,
    BarrierError,
    Report,
    RunResult,
    harness_replay,
    measured_timers,
    op_sections,
    predicted_timers,
    profile_for,
    read_runs,
    run_engine,
    scenario_for,
    validate_measured,
    with_barriers,
)
from sosim.cli import main
from sosim.engine.plan import CPU_OPT, D2H, GPU, H2D, Category, Phase, Plan
from sosim.hardware import model as tm
from sosim.inputs.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RUNS_1129 = ROOT / "calibration" / "nvidia-h200-2026-11-29"


@pytest.fixture(scope="module")
def runs_1129() -> list:
    runs, skipped = read_runs(RUNS_1129)
    assert skipped == []
    return runs


def test_reads_every_run_of_2026_11_29(runs_1129: list) -> None:
    assert len(runs_1129) == 17
    by_id = {r.run_id: r for r in runs_1129}
    so = by_id["1.1b-s2048-mb4-superoffload-clip0"]
    assert so.config == "superoffload" and so.step.median == 2.281159 and so.step.p90 == 2.695859
    assert so.phases["forward"].median == 0.214098 and so.phases["step"].median == 1.083913
    assert so.ds_config == RUNS_1129 / "deepspeed_runs" / "1.1b-s2048-mb4-superoffload-clip0.ds_config.json"
    assert by_id["1.1b-s2048-mb4-floor"].ds_config is None


def test_each_scenario_has_the_knobs_of_its_deepspeed_config(runs_1129: list) -> None:
    systems = {"zero2": "zero_offload", "zero3": "zero3_offload", "superoffload": "superoffload", "floor": "gpu_only"}
    for run in runs_1129:
        sc = scenario_for(run, "h200-pcie-gen5-x86")
        assert sc.schedule.system == systems[run.config], run.run_id
        assert sc.hardware.name == "h200-pcie-gen5-x86"
        t = sc.training
        assert (t.seq_len, t.micro_batch, t.activation_checkpointing) == (run.seq, run.micro_batch, True)
        # The model built from the CSV's shape columns has exactly the measured parameter count.
        assert tm.total_params(sc.model) == _params(run), run.run_id
        if run.config == "floor":
            continue
        ds = json.loads(run.ds_config.read_text())
        assert t.gradient_clipping == ds["gradient_clipping"] == run.clip
        assert t.micro_batch == ds["train_micro_batch_size_per_gpu"]
        s = sc.schedule
        assert getattr(s, "implementation", "deepspeed") == "deepspeed"
        if run.config in ("zero3", "superoffload"):
            assert s.sub_group_elements == ds["zero_optimization"]["sub_group_size"]  # type: ignore[union-attr]
        if run.config == "superoffload":
            off = ds["zero_optimization"]["offload_optimizer"]
            assert s.gpu_optimizer_fraction == pytest.approx(1.0 - off["ratio"])  # type: ignore[union-attr]
            assert s.cpu_adam_core_fraction == off["cpuadam_cores_perc"]  # type: ignore[union-attr]


def _params(run: object) -> int:
    import csv

    with (RUNS_1129 / "deepspeed_steps.csv").open() as f:
        for row in csv.DictReader(f):
            if row["run_id"] == run.run_id:  # type: ignore[attr-defined]
                return int(row["params"])
    raise AssertionError("run not found")


def test_profile_by_machine_folder() -> None:
    assert profile_for("nvidia-h200-2026-11-30") == "h200-pcie-gen5-x86"
    assert profile_for("nvidia-h200x2-2026-11-30") == "h200x2-pcie-gen5-x86"
    assert profile_for("gh200-2027-01-01") is None


# ---- the harness's barriers on a hand-built plan ---------------------------------------------------------
def _plan(iterations: int = 3) -> Plan:
    """Per iteration: fwd on the GPU (1 s), a forward-section D2H copy (3 s) after it, backward (2 s) after
    fwd, CPU Adam (1 s) after backward, a refresh H2D (0.5 s) after Adam."""
    plan = Plan()
    for it in range(iterations):
        f = plan.add(GPU, "fwd", 1.0, phase=Phase.FORWARD, iteration=it)
        plan.mark_iteration_start(f)
        plan.add(D2H, "act_copy", 3.0, [f], phase=Phase.FORWARD, iteration=it)
        b = plan.add(GPU, "bwd", 2.0, [f], phase=Phase.BACKWARD, iteration=it)
        a = plan.add(CPU_OPT, "adam", 1.0, [b], phase=Phase.OPTIMIZER, category=Category.OPTIMIZER, iteration=it)
        plan.add(H2D, "refresh", 0.5, [a], phase=Phase.REFRESH, iteration=it)
    return plan


def test_barriers_by_hand() -> None:
    plan = _plan()
    # No barriers: the copy overlaps backward; the next forward starts when the GPU is free (t = 3).
    start, _ = run_engine(plan)
    assert start[plan.iteration_starts[1]] == 3.0
    # End-of-step barrier: the next iteration waits for the refresh (ends at 4.5).
    unsynced = with_barriers(plan, phased=False)
    start, _ = run_engine(unsynced)
    assert start[unsynced.iteration_starts[1]] == 4.5
    # Phased: backward waits for the copy (B1 = 4), Adam after backward (6-7), refresh 7-7.5.
    replay = harness_replay(plan)
    assert replay.step_s == 4.5
    assert replay.phases_s == {"forward": 4.0, "backward": 2.0, "step": 1.5}
    assert replay.phased_total_s == 7.5


def test_timers_inside_step_by_hand(runs_1129: list) -> None:
    view = harness_replay(_plan()).view
    assert view is not None and (view.b1 - view.t0, view.b2 - view.t0, view.t_end - view.t0) == (4.0, 6.0, 7.5)
    zero3 = dataclasses.replace(runs_1129[0], config="zero3", clip=0.0)
    assert predicted_timers(view, zero3) == {"adam+unscale": 1.0, "refresh": 0.5, "fixed": 0.0}
    so = dataclasses.replace(zero3, config="superoffload")
    # The worker's Adam ends 1 s after backward's barrier: step() waits that long for it.
    assert predicted_timers(view, so) == {"unscale": 0.0, "refresh": 0.5, "worker wait": 1.0, "fixed": 0.0}
    so_clip = dataclasses.replace(so, clip=1.0)
    assert predicted_timers(view, so_clip) == {"unscale": 0.0, "refresh": 0.5, "worker Adam": 1.0, "fixed": 0.0}
    zero2 = dataclasses.replace(zero3, config="zero2")
    assert predicted_timers(view, zero2) == {"adam+unscale": 1.0, "fixed": 0.5}  # ZeRO-2's refresh is inline
    # Measured counterparts: sums of the step script's timers; missing timers give no value.
    timed = dataclasses.replace(zero3, timers={"optimizer": 0.3, "unscale_clip": 0.1, "refresh": 0.2, "fixed": 0.15})
    assert measured_timers(timed) == pytest.approx({"adam+unscale": 0.4, "refresh": 0.2, "fixed": 0.05})
    assert measured_timers(zero3) == {}


def test_barrier_contradicting_queue_order_is_reported() -> None:
    plan = Plan()
    for it in range(3):
        b = plan.add(GPU, "bwd", 1.0, phase=Phase.BACKWARD, iteration=it)
        plan.mark_iteration_start(b)
        plan.add(GPU, "fwd", 1.0, phase=Phase.FORWARD, iteration=it)
    with pytest.raises(BarrierError, match="contradict"):
        with_barriers(plan, phased=True)


def test_fetch_ops_take_the_section_of_their_user() -> None:
    plan = Plan()
    f = plan.add(GPU, "fwd", 1.0, phase=Phase.FORWARD)
    fetch = plan.add(H2D, "fetch_for_bwd", 1.0, [f], phase=Phase.FETCH)
    plan.add(GPU, "bwd", 1.0, [fetch], phase=Phase.BACKWARD)
    lonely = plan.add(H2D, "fetch_unused", 1.0, [f], phase=Phase.CHECKPOINT)
    sections = op_sections(plan)
    assert sections[fetch] == BACKWARD and sections[f] == FORWARD and sections[lonely] == FORWARD
    assert STEP == 2


def test_barrier_plan_keeps_every_op_and_resource_order() -> None:
    plan = _plan()
    out = with_barriers(plan, phased=True)
    assert sorted(op.name for op in out.ops) == sorted(op.name for op in plan.ops)
    for res in plan.resources:
        assert [(o.name, o.iteration) for o in plan.ops if o.resource == res] == \
               [(o.name, o.iteration) for o in out.ops if o.resource == res]
    assert all(d < op.id for op in out.ops for d in op.deps)


# ---- the real runs --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report() -> Report:
    return validate_measured([RUNS_1129], bands=0)


def test_predictions_and_summaries(report: Report) -> None:
    assert len(report.results) == 17 and report.skipped == []
    for r in report.results:
        assert r.predicted_s > 0 and np.isfinite(r.error)
        if r.run.config != "floor":
            # DeepSpeed's paths have no overlap across steps in the model: the per-step barrier changes nothing.
            assert r.predicted_s == pytest.approx(r.simulate_step_s, rel=1e-9)
            assert set(r.phases_pred) == {"forward", "backward", "step"}
            assert sum(r.phases_pred.values()) == pytest.approx(r.phased_total_pred, rel=1e-9)
    systems = report.systems()
    assert set(systems) == {"floor", "zero2", "zero3", "superoffload", "offloaded (all)"}
    assert systems["offloaded (all)"]["runs"] == 13
    zero2 = [r for r in report.results if r.run.config == "zero2"]
    assert systems["zero2"]["mean_abs_error"] == pytest.approx(np.mean([abs(r.error) for r in zero2]))


def test_effect_pairs(report: Report) -> None:
    effects = {(e["effect"], e["run_id"]): e for e in report.effects()}
    so = effects[("clipping 1 vs 0", "1.1b-s2048-mb4-superoffload-clip1")]
    assert so["measured_s"] == pytest.approx(2.801508 - 2.281159)
    assert so["base_run_id"] == "1.1b-s2048-mb4-superoffload-clip0"
    assert ("clipping 1 vs 0", "1.1b-s2048-mb4-zero2-clip1") in effects
    ratio = effects[("ratio 0.9 vs 1", "1.1b-s2048-mb4-superoffload-clip0-ratio0.9")]
    assert ratio["measured_s"] == pytest.approx(2.009473 - 2.281159)
    assert ratio["phases"]["forward"]["measured_s"] == pytest.approx(0.264685 - 0.214098)


def test_band_coverage_of_a_report(report: Report) -> None:
    fake = [RunResult(r.run, r.profile, r.predicted_s, r.simulate_step_s,
                      band=(r.run.step.median * 0.95, r.run.step.median, r.run.step.median * (1.05 if i % 2 else 0.99)))
            for i, r in enumerate(report.results[:4])]
    cov = Report(fake, []).coverage()
    assert (cov["runs_with_band"], cov["inside"]) == (4, 2)
    assert cov["half_width_max"] == pytest.approx(0.05)
    assert len(cov["outside"]) == 2


# ---- bad input -------------------------------------------------------------------------------------------
def test_bad_number_names_file_line_and_column(tmp_path: Path) -> None:
    folder = tmp_path / "nvidia-h200-bad"
    shutil.copytree(RUNS_1129, folder)
    path = folder / "deepspeed_steps.csv"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].replace(",2048,4,", ",20x48,4,", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"deepspeed_steps.csv:5: seq: expected a number"):
        validate_measured([folder])


def test_missing_ds_config_is_skipped_with_reason(tmp_path: Path) -> None:
    folder = tmp_path / "nvidia-h200-missing"
    shutil.copytree(RUNS_1129, folder)
    (folder / "deepspeed_runs" / "1.1b-s2048-mb4-zero3-clip0.ds_config.json").unlink()
    rep = validate_measured([folder])
    assert [s.run_id for s in rep.skipped] == ["1.1b-s2048-mb4-zero3-clip0"]
    assert "not found" in rep.skipped[0].reason


def test_unknown_machine_folder_is_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "some-other-box"
    shutil.copytree(RUNS_1129, folder)
    rep = validate_measured([folder])
    assert rep.results == [] and len(rep.skipped) == 17
    assert "no hardware profile" in rep.skipped[0].reason


def test_cli_validate_json_carries_measured_runs_and_bands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refs = tmp_path / "refs.yaml"
    refs.write_text(
        "rows:\n"
        "  - id: one\n    source: test\n    kind: metric\n"
        f"    scenario: {ROOT / 'scenarios' / 'h200_x86_llama1.1b_zero2_measured.yaml'}\n"
        "    metric: step_time_s\n    published: 0.7482\n    budget_rel: 0.1\n"
    )
    folder = tmp_path / "nvidia-h200-x"
    folder.mkdir()
    shutil.copytree(RUNS_1129 / "deepspeed_runs", folder / "deepspeed_runs")
    lines = (RUNS_1129 / "deepspeed_steps.csv").read_text().splitlines()
    (folder / "deepspeed_steps.csv").write_text("\n".join([lines[0], *lines[3:5]]) + "\n")  # the ZeRO-2 run only
    code = main(["validate", "--references", str(refs), "--measured", str(folder), "--band-replays", "8",
                 "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    measured = out["measured"]
    assert [r["run_id"] for r in measured["runs"]] == ["1.1b-s2048-mb4-zero2-clip0"]
    row = measured["runs"][0]
    assert row["band_p10_s"] <= row["predicted_s"] * 1.05 and row["band_p90_s"] >= row["predicted_s"] * 0.95
    assert measured["bands"]["runs_with_band"] == 1
    assert measured["systems"]["zero2"]["within_10pct"] == 1
    assert out["checked"] == {"published": 1, "measured": 1, "measured_skipped": 0}


def test_cli_validate_zero_measured_runs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder whose runs all skip (no profile for its machine) compares nothing: exit 2 naming it, not a pass."""
    folder = tmp_path / "some-other-box"
    shutil.copytree(RUNS_1129, folder)
    code = main(["validate", "--measured", str(folder), "--band-replays", "0", "--format", "json"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{folder}: 0 measured runs could be compared (17 skipped)" in err
    assert "no hardware profile" in err and "Traceback" not in err


def test_cli_validate_without_shipped_runs_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Where the shipped calibration folders are not found (the installed-wheel bug of issue 15), validate
    says so and exits 2 instead of checking 0 measured runs."""
    from sosim.answers import validate_measured as vm

    empty = tmp_path / "calibration"
    empty.mkdir()
    monkeypatch.setattr(vm, "find_run_folders", lambda: [])
    monkeypatch.setattr(vm, "CALIBRATION_DIR", empty)
    assert main(["validate", "--band-replays", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{empty}: no measured runs found" in err and "--no-measured" in err


def test_shipped_runs_are_found_from_the_data_root() -> None:
    from sosim.answers import validate_measured as vm
    from sosim.inputs.resources import data_root

    assert data_root() / "calibration" == vm.CALIBRATION_DIR
    folders = vm.find_run_folders()
    assert RUNS_1129 in folders and len(folders) == len(list(ROOT.glob("calibration/*/deepspeed_steps.csv")))


def test_report_script_replaces_only_marked_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("validation_report", ROOT / "scripts" / "validation_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "sections", lambda: {"a": lambda: "table A", "b": lambda: "table B\nrow"})
    page = tmp_path / "v.md"
    page.write_text("intro\n<!-- generated:a -->\nold\nlines\n<!-- /generated:a -->\nprose kept\n"
                    "<!-- generated:b -->\n<!-- /generated:b -->\n## Many GPUs\nkept too\n")
    assert module.write(page) == 0
    expected = ("intro\n<!-- generated:a -->\ntable A\n<!-- /generated:a -->\nprose kept\n"
                "<!-- generated:b -->\ntable B\nrow\n<!-- /generated:b -->\n## Many GPUs\nkept too\n")
    assert page.read_text() == expected
    assert module.write(page) == 0 and page.read_text() == expected  # idempotent
    page.write_text("no markers\n")
    assert module.write(page) == 1


def test_runs_of_2026_11_30_with_timers_and_sessions() -> None:
    folder = ROOT / "calibration" / "nvidia-h200-2026-11-30"
    runs, skipped = read_runs(folder)
    assert skipped == [] and len(runs) == 12
    by_id = {r.run_id: r for r in runs}
    z3 = by_id["1.1b-s2048-mb4-zero3-clip0"]
    # The CSV names runs/...; the committed folder keeps the configs in deepspeed_runs/.
    assert z3.ds_config == folder / "deepspeed_runs" / "1.1b-s2048-mb4-zero3-clip0.ds_config.json"
    assert z3.n_steps == 10 and z3.timers["refresh"] > 0 and "fixed" in z3.timers
    assert set(measured_timers(z3)) == {"adam+unscale", "refresh", "fixed"}
    # Call D measured the clipping run; its clip-0 partner came from another device session.
    rep = validate_measured([folder])
    effects = {(e["effect"], e["run_id"]): e for e in rep.effects()}
    assert effects[("clipping 1 vs 0", "0.5b-s2048-mb4-superoffload-clip1")]["same_session"] is False
    assert effects[("ratio 0.5 vs 1", "0.5b-s2048-mb4-superoffload-clip0-ratio0.5")]["same_session"] is True


def test_timer_counterparts_use_the_time_an_op_really_ran() -> None:
    """Ranks sharing a host stretch their CPU ops: a timer around an op measures its run time (end - start),
    not its uncontended duration."""
    from sosim.answers.validate_measured import PhasedView

    plan = Plan()
    plan.add(CPU_OPT, "adam", 1.0, phase=Phase.OPTIMIZER, category=Category.OPTIMIZER)
    plan.add(CPU_OPT, "adam2", 0.5, phase=Phase.OPTIMIZER, category=Category.OPTIMIZER)
    start, end = np.array([0.0, 2.0]), np.array([2.0, 3.0])  # the first ran at half speed
    view = PhasedView(plan, start, end, [2, 2], 0, 0.0, 0.0, 0.0, 3.0)
    assert view.busy(lambda op: True) == pytest.approx(3.0)
    assert view.busy(lambda op: op.name == "adam", section=2) == pytest.approx(2.0)
