"""``sosim tune``: the search finds known optima, never ranks what does not fit, keeps the global batch,
emits a DeepSpeed config that maps back to the winner, and keeps the best so far on Ctrl-C."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from sosim import load_scenario, simulate
from sosim.answers.tune import SCORE_DIGITS, TuneOptions, Tuner, memory_check, tune
from sosim.answers.tune.report import bottleneck, format_text, to_json, why_loses
from sosim.answers.tune.space import Knob, refine_values, search_space
from sosim.cli import main
from sosim.formats import dsconfig
from sosim.formats.hf_model import HfModel
from sosim.formats.jsonio import read_json
from sosim.schedules import registry
from tests.helpers import SRC, tiny_scenario

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "scenarios" / "deepspeed" / "measured"
MODELS = ROOT / "scenarios" / "deepspeed" / "models"


def _tiny(system: str = "zero_offload", **training: Any) -> dict[str, Any]:
    return tiny_scenario({"system": system}, **training)


def _with_interconnect(data: dict[str, Any], gpus_per_node: int = 4) -> dict[str, Any]:
    data = copy.deepcopy(data)
    data["hardware"]["interconnect"] = {
        "gpu_gpu_GBps": 100.0, "node_node_GBps": 25.0, "gpus_per_node": gpus_per_node, "latency_us": 5.0,
        "sources": {k: SRC for k in ("gpu_gpu_GBps", "node_node_GBps", "gpus_per_node", "latency_us")}}
    return data


# --------------------------------------------------------------------------------------- search space


def test_refine_values_midpoints_edges_bounds() -> None:
    lin = Knob("schedule.x", "x", "x", (0.0, 0.2, 0.4), refine="linear", bounds=(0.0, 0.5))
    assert refine_values(lin, [0.0, 0.2, 0.4], 0.2) == [0.1, 0.3]
    # At the upper end: the midpoint below and one step out, clamped to the bound.
    assert refine_values(lin, [0.0, 0.2, 0.4], 0.4) == [0.3, 0.5]
    # At the lower bound already: the step out is clamped onto a tried value, so only the midpoint.
    assert refine_values(lin, [0.0, 0.2, 0.4], 0.0) == [0.1]
    log = Knob("schedule.y", "y", "y", (1e8, 4e8), refine="log", bounds=(1e7, 1e10), integer=True)
    assert refine_values(log, [1e8, 4e8], 4e8) == [200_000_000, 1_600_000_000]
    assert refine_values(Knob("schedule.z", "z", "z", (True, False)), [True, False], True) == []


def _replace_space(monkeypatch: pytest.MonkeyPatch, system: str, knobs: tuple[Knob, ...]) -> None:
    """The system's registry entry with another tuning space, for one test."""
    monkeypatch.setitem(registry._REGISTERED, system, registry.SYSTEMS[system]._replace(tune_space=knobs))


def test_every_table_knob_names_a_section_and_has_values() -> None:
    for system, entry in registry.SYSTEMS.items():
        assert entry.tune_space, system  # every system moves its own knobs (zero_infinity_nvme too)
        for knob in entry.tune_space:
            assert knob.key.split(".")[0] in ("schedule", "training", "cluster"), (system, knob.key)
            assert knob.values, (system, knob.key)
            if knob.refine is not None:
                assert all(isinstance(v, (int, float)) for v in knob.values)


# -------------------------------------------------------------------------- known optimum (synthetic)


def _synthetic(peak_fraction: float = 0.2, peak_cores: float = 0.8) -> Any:
    """An evaluator with a known optimum: superoffload only, tokens/s peaks at the given ratio knobs and
    the largest micro-batch; the breakdown is filled so the report can read it."""

    def evaluate(sc: Any) -> dict[str, Any]:
        s = sc.schedule
        tps = 1000.0
        if s.system == "superoffload":
            # Steep enough that a refinement step off the peak costs more than the tuner's 4-digit resolution.
            tps = 2000.0 / (1.0 + 100.0 * (s.gpu_optimizer_fraction - peak_fraction) ** 2
                            + 20.0 * (s.cpu_adam_core_fraction - peak_cores) ** 2) + 10.0 * sc.training.micro_batch
        tokens = sc.training.micro_batch * sc.training.grad_accum * sc.training.seq_len
        step = tokens / tps
        m = simulate(sc).metrics
        return {**m, "step_time_s": step, "tokens_per_s": tps, "gpu_compute_s": step, "idle_s": 0.0}

    return evaluate


def test_finds_the_known_optimum_of_a_synthetic_objective() -> None:
    sc = load_scenario(_tiny("superoffload", micro_batch=4), ["schedule.cpu_adam=cpu_adam"])
    opts = TuneOptions(systems=("superoffload",), implementation="deepspeed")
    result = Tuner(sc, opts, evaluate=_synthetic()).run()
    best = result.best
    assert best is not None
    assert best.settings["schedule.gpu_optimizer_fraction"] == pytest.approx(0.2)
    assert best.settings["schedule.cpu_adam_core_fraction"] == pytest.approx(0.8)
    assert best.settings["training.micro_batch"] == 4  # the largest that fits at global batch 4
    # An optimum between grid values is approached by refinement (0.25 is between the grid's 0.2 and 0.3).
    result = Tuner(sc, opts, evaluate=_synthetic(peak_fraction=0.25)).run()
    assert result.best is not None
    assert result.best.settings["schedule.gpu_optimizer_fraction"] == pytest.approx(0.25)


def test_staged_search_matches_exhaustive_search_on_a_real_tiny_space(monkeypatch: pytest.MonkeyPatch) -> None:
    # A smaller grid for SuperOffload (DeepSpeed's knobs) so that the exhaustive search stays quick.
    small = {"schedule.gpu_optimizer_fraction": (0.0, 0.1, 0.3), "schedule.sub_group_elements": (1e8, 1e9),
             "schedule.cpu_adam_core_fraction": (0.5, 1.0)}
    knobs = tuple(dataclasses.replace(k, values=small.get(k.key, k.values)) for k in search_space("superoffload"))
    _replace_space(monkeypatch, "superoffload", knobs)
    base = _tiny("superoffload", micro_batch=4)
    overrides = ["schedule.cpu_adam=cpu_adam", "training.gradient_clipping=0"]
    opts = TuneOptions(systems=("superoffload",), implementation="deepspeed", exhaustive_limit=0, refine_rounds=0)
    staged = tune(base, opts, overrides=overrides)
    exhaustive = tune(base, dataclasses.replace(opts, exhaustive_limit=10**6, budget=10**5), overrides=overrides)
    assert staged.best is not None and exhaustive.best is not None
    assert staged.simulated < exhaustive.simulated / 2
    # Coordinate descent from the best structural points reaches the grid's optimum.
    assert staged.best.score == pytest.approx(exhaustive.best.score, rel=1e-9)


# --------------------------------------------------------------------------------- memory and batches


def test_infeasible_configurations_never_win() -> None:
    # A tiny GPU: the fastest configurations (no checkpointing, everything resident) do not fit.
    data = _tiny(micro_batch=8)
    data["hardware"]["gpu"]["hbm_gib"] = 0.12
    sc = load_scenario(data)
    result = tune(sc, TuneOptions())
    assert result.best is not None
    assert result.memory_rejected > 0
    for ev in result.ranked:
        assert ev.fits and ev.metrics is not None and ev.metrics["feasible"]
    # Not vacuous: some configuration that does not fit would have been faster than the winner.
    rejected = [e for e in result.evaluations if not e.fits and e.scenario is not None]
    faster = [e for e in rejected if simulate(e.scenario).metrics["tokens_per_s"] > result.best.metrics["tokens_per_s"]]
    assert faster


def test_memory_check_is_the_simulations_verdict_without_simulating(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _tiny("superoffload", micro_batch=8)
    data["hardware"]["gpu"]["hbm_gib"] = 0.2
    sc = load_scenario(data, ["schedule.cpu_adam=cpu_adam"])
    expected = simulate(sc).metrics

    def boom(*_: Any) -> None:
        raise AssertionError("memory_check simulated")

    import sys

    monkeypatch.setattr(sys.modules["sosim.run.simulate"], "simulate", boom)
    gpu, cpu, fits, _, klass = memory_check(sc)
    assert fits == expected["feasible"]
    assert gpu == pytest.approx(expected["gpu_mem_peak_gib"])
    assert cpu == pytest.approx(expected["cpu_mem_peak_gib"])
    assert (klass.startswith("GPU memory (largest item: ") if not fits else klass == "")


def test_max_host_ram_caps_every_ranked_configuration() -> None:
    free = tune(_tiny(micro_batch=4), TuneOptions(systems=("zero_offload", "superoffload", "zero3_offload")),
                overrides=["schedule.cpu_adam=cpu_adam"])
    assert free.best is not None
    needs = [e.cpu_mem_gib for e in free.ranked if e.cpu_mem_gib]
    cap = sorted(needs)[len(needs) // 2]
    capped = tune(_tiny(micro_batch=4), TuneOptions(systems=("zero_offload", "superoffload", "zero3_offload"),
                                                     max_host_ram_gib=cap), overrides=["schedule.cpu_adam=cpu_adam"])
    assert capped.ranked
    assert all((e.cpu_mem_gib or 0) <= cap for e in capped.ranked)
    assert any("--max-host-ram" in k for k, _ in capped.infeasible_summary())


def test_will_it_fit_answer_is_the_host_ram_threshold() -> None:
    """The 'fits with >= X GiB host RAM' answer is exact: with X installed the system fits, with less not."""
    base = _tiny("zero_offload", micro_batch=2)
    base["hardware"]["cpu"]["mem_gib"] = 0.05  # far too small: no offload system fits
    first = tune(base, TuneOptions(systems=("zero_offload",)))
    assert not first.ranked
    sm = first.systems[0]
    assert sm.best is None and sm.min_host_installed_gib is not None
    enough = tune(base, TuneOptions(systems=("zero_offload",)),
                  overrides=[f"hardware.cpu.mem_gib={sm.min_host_installed_gib * 1.0001}"])
    assert enough.ranked
    short = tune(base, TuneOptions(systems=("zero_offload",)),
                 overrides=[f"hardware.cpu.mem_gib={sm.min_host_installed_gib * 0.999}"])
    assert not short.ranked


def test_global_batch_is_fixed_over_micro_batch_accumulation_and_data_parallel() -> None:
    data = _with_interconnect(_tiny(micro_batch=2, seq_len=1024))
    result = tune(data, TuneOptions(gpus=4, global_batch=8))
    assert result.best is not None
    seen_dp, seen_mb = set(), set()
    for ev in result.evaluations:
        if ev.scenario is None:
            continue
        t, c = ev.scenario.training, ev.scenario.cluster
        assert t.micro_batch * t.grad_accum * c.dp == 8
        assert c.dp * c.sequence_parallel == 4
        seen_dp.add(c.dp)
        seen_mb.add(t.micro_batch)
    assert {1, 2, 4} <= seen_dp  # sequence parallel 4, 2 and 1 were all tried
    assert len(seen_mb) > 1
    assert result.tokens_per_step == 8 * 1024
    # Same tokens per step everywhere: the ranking by tokens/s is a ranking by step time (scores are compared
    # to SCORE_DIGITS significant digits, so near-ties may come in either order).
    steps = [e.metrics["step_time_s"] for e in result.ranked]
    assert all(b >= a * (1 - 10.0 ** (1 - SCORE_DIGITS)) for a, b in itertools.pairwise(steps))


def test_a_global_batch_no_split_can_make_is_a_clear_error() -> None:
    # 3 sequences over 4 GPUs: data parallel 4 or 2 does not divide 3, and an odd sequence rules out
    # sequence parallel 2 and 4.
    data = _with_interconnect(_tiny(micro_batch=2, seq_len=511))
    from sosim.inputs.errors import ConfigError

    with pytest.raises(ConfigError, match="global batch 3"):
        tune(data, TuneOptions(gpus=4, global_batch=3))


def test_deepspeed_implementation_never_searches_paper_only_knobs() -> None:
    result = tune(_tiny("superoffload", micro_batch=4), TuneOptions(implementation="deepspeed"),
                  overrides=["schedule.cpu_adam=cpu_adam"])
    keys = {k for e in result.evaluations for k in e.settings}
    assert "schedule.cast" not in keys and "schedule.dpu" not in keys
    assert "schedule.gpu_optimizer_fraction" in keys and "schedule.cpu_adam_core_fraction" in keys
    assert all(getattr(e.scenario.schedule, "implementation", "deepspeed") == "deepspeed"
               for e in result.evaluations if e.scenario is not None and not e.is_base)


def test_knobs_missing_from_the_schema_are_dropped_and_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    ghost = Knob("schedule.not_a_knob_yet", "ghost", "a knob a later schema adds", (1, 2))
    _replace_space(monkeypatch, "zero_offload", (*search_space("zero_offload"), ghost))
    result = tune(_tiny(micro_batch=2), TuneOptions(systems=("zero_offload",)))
    assert "schedule.not_a_knob_yet" in result.dropped_knobs["zero_offload"]
    assert all("schedule.not_a_knob_yet" not in e.settings for e in result.evaluations)


def test_time_to_tokens_objective_rounds_steps_up() -> None:
    budget = 10_000_000
    result = tune(_tiny(micro_batch=4), TuneOptions(objective="time_to_tokens", token_budget=budget,
                                                    systems=("zero_offload",)))
    best = result.best
    assert best is not None
    steps = math.ceil(budget / result.tokens_per_step)
    assert best.score == pytest.approx(-steps * best.metrics["step_time_s"])
    by_tps = tune(_tiny(micro_batch=4), TuneOptions(systems=("zero_offload",)))
    assert by_tps.best is not None and by_tps.best.key == best.key  # same tokens per step: same winner


def test_budget_stops_the_search_and_says_so() -> None:
    result = tune(_tiny(micro_batch=4), TuneOptions(budget=7))
    assert result.simulated == 7
    assert result.budget_exhausted
    assert any("budget" in n for n in result.notes)


def test_output_order_is_deterministic() -> None:
    a = tune(_tiny(micro_batch=4), TuneOptions())
    b = tune(_tiny(micro_batch=4), TuneOptions())
    assert [e.key for e in a.ranked] == [e.key for e in b.ranked]
    assert format_text(a) == format_text(b)


def test_parallel_evaluation_gives_the_same_ranking() -> None:
    from concurrent.futures import ThreadPoolExecutor

    serial = tune(_tiny(micro_batch=4), TuneOptions())
    with ThreadPoolExecutor(max_workers=2) as pool:
        parallel = tune(_tiny(micro_batch=4), TuneOptions(jobs=2), executor=pool)
    assert [e.key for e in parallel.ranked] == [e.key for e in serial.ranked]
    assert parallel.simulated == serial.simulated


# ---------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_keeps_the_best_so_far() -> None:
    calls: list[str] = []

    def evaluate(sc: Any) -> dict[str, Any]:
        if len(calls) == 12:
            raise KeyboardInterrupt
        calls.append(sc.schedule.system)
        return dict(simulate(sc).metrics)

    result = Tuner(load_scenario(_tiny(micro_batch=4)), TuneOptions(), evaluate=evaluate).run()
    assert result.interrupted
    assert result.simulated == 12
    assert result.best is not None
    simulated = [e for e in result.evaluations if e.metrics is not None and e.fits]
    assert result.best.score == pytest.approx(max(e.score for e in simulated if e.score is not None), rel=1e-9)
    assert "interrupted" in format_text(result)


def test_cli_ctrl_c_prints_best_so_far_and_exits_130(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import sosim.answers.tune.candidate_eval as tune_module

    real = tune_module.simulate_metrics
    count = [0]

    def flaky(sc: Any, *runs: Any) -> dict[str, Any]:
        count[0] += 1
        if count[0] > 5:
            raise KeyboardInterrupt
        return real(sc, *runs)

    monkeypatch.setattr(tune_module, "simulate_metrics", flaky)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(_tiny(micro_batch=4)))
    out = tmp_path / "ds.json"
    rc = main(["tune", str(scenario), "--jobs", "1", "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 130
    assert "interrupted" in text and " 1  " in text
    assert out.exists()


# ----------------------------------------------------------------------------- DeepSpeed round trip


def test_emitted_config_maps_back_to_the_winner(tmp_path: Path) -> None:
    ds = MEASURED / "1.1b-s2048-mb4-superoffload-clip0.ds_config.json"
    model = MODELS / "measured-llama-1.1b.json"
    out = tmp_path / "tuned.json"
    rc = main(["tune", "--ds-config", str(ds), "--model", str(model), "--hardware", "h200-pcie-gen5-x86",
               "--systems", "superoffload,zero_offload", "--budget", "150", "--jobs", "1", "--out", str(out),
               "--format", "json", "--no-progress"])
    assert rc == 0
    emitted = read_json(out).data
    # The user's own keys the scenario does not decide are kept.
    assert emitted["optimizer"]["params"]["lr"] == read_json(ds).data["optimizer"]["params"]["lr"]
    sc_args = dsconfig.RunInputs(hardware="h200-pcie-gen5-x86")
    base = load_scenario(dsconfig.load_ds_mapping(ds, model, sc_args).scenario)
    result = tune(base, TuneOptions(systems=("superoffload", "zero_offload"), budget=150))
    winner = result.best
    assert winner is not None and winner.scenario is not None
    w = winner.scenario
    inputs = dsconfig.RunInputs(hardware="h200-pcie-gen5-x86", seq_len=w.training.seq_len,
                                activation_checkpointing=w.training.activation_checkpointing)
    back = load_scenario(dsconfig.map_ds_config(read_json(out), HfModel(model=w.model.model_dump(), origin="m"),
                                                inputs).scenario)
    assert back.schedule == w.schedule
    assert back.training == w.training
    assert back.cluster.dp == w.cluster.dp and back.cluster.gpus == w.cluster.gpus
    assert simulate(back).metrics["step_time_s"] == pytest.approx(winner.metrics["step_time_s"], rel=1e-12)


# ------------------------------------------------------------------------------------ CLI and report


def test_cli_json_is_one_object_and_out_is_announced_when_replaced(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(_tiny(micro_batch=4)))
    out = tmp_path / "ds.json"
    out.write_text("{}")
    # A file sosim did not write is replaced only with --force (issue 26); it is left as it was without.
    assert main(["tune", str(scenario), "--out", str(out), "--jobs", "1"]) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "{}"
    rc = main(["tune", str(scenario), "--format", "json", "--out", str(out), "--jobs", "1", "--top", "3", "--force"])
    assert rc == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ds_config_written"]["overwrote"] is True
    assert 1 <= len(payload["top"]) <= 3
    assert payload["simulated"] > 0 and payload["top"][0]["rank"] == 1
    assert json.loads(out.read_text()) != {}
    rc = main(["tune", str(scenario), "--out", str(out), "--jobs", "1"])
    text = capsys.readouterr().out
    assert rc == 0 and "(overwrote the existing file)" in text
    assert "candidates simulated" in text and "bottlenecks:" in text and "memory per GPU" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "--model", "m.json"], "--model: only with --ds-config"),
    (["tune", "--ds-config", "x.json"], "--ds-config needs --model and --hardware"),
    (["tune", "SCEN", "--objective", "time_to_tokens"], "needs --token-budget"),
    (["tune", "SCEN", "--systems", "warp_drive"], "unknown system(s) warp_drive"),
])
def test_cli_bad_input_is_a_message_not_a_traceback(argv: list[str], message: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(_tiny(micro_batch=4)))
    argv = [str(scenario) if a == "SCEN" else a for a in argv]
    rc = main([*argv, "--no-write"])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert "Traceback" not in err


def test_no_fit_exits_1_with_the_memory_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny(micro_batch=2)
    data["hardware"]["gpu"]["hbm_gib"] = 0.001
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(data))
    rc = main(["tune", str(scenario), "--jobs", "1", "--out", str(tmp_path / "x.json")])
    text = capsys.readouterr().out
    assert rc == 1
    assert "NO CONFIGURATION FITS" in text and "needs >= " in text
    assert not (tmp_path / "x.json").exists()


def test_bottleneck_and_runner_up_in_words() -> None:
    m = {"step_time_s": 1.2, "gpu_compute_s": 0.7, "gpu_other_s": 0.0, "exposed_cpu_optimizer_s": 0.41,
         "exposed_cpu_cast_s": 0.0, "exposed_d2h_s": 0.09, "exposed_h2d_s": 0.0, "exposed_comm_s": 0.0, "idle_s": 0.0}
    assert bottleneck(m) == ("CPU Adam exposed 0.41 s of 1.2 s; then device-to-host copies exposed 0.09 s "
                             "(GPU compute 58%)")
    compute = {**m, "exposed_cpu_optimizer_s": 0.0, "exposed_d2h_s": 0.0, "gpu_compute_s": 1.2}
    assert bottleneck(compute).startswith("compute-bound: GPU compute 1.2 s of 1.2 s (100%)")
    from sosim.answers.tune import Evaluation

    fast = Evaluation("superoffload", {"schedule.gpu_optimizer_fraction": 0.1}, "a",
                      metrics={**compute, "tokens_per_s": 1000.0}, score=1000.0)
    # Same tokens per step: twice the step, half the tokens/s, the extra second is CPU Adam.
    slow_metrics = {**m, "tokens_per_s": 500.0, "step_time_s": 2.4, "exposed_cpu_optimizer_s": 1.2}
    slow = Evaluation("superoffload", {"schedule.gpu_optimizer_fraction": 0.0}, "b", metrics=slow_metrics, score=500.0)
    text = why_loses(fast, slow)
    assert text.startswith("50.0% fewer tokens/s: step +1.2 s (CPU Adam exposed +1.2 s")
    assert "ratio 0.9 -> 1" in text


def test_report_shows_bands_when_the_result_has_them() -> None:
    def banded(sc: Any) -> dict[str, Any]:
        m = dict(simulate(sc).metrics)
        m["tokens_per_s_p10"] = 0.9 * m["tokens_per_s"]
        m["tokens_per_s_p90"] = 1.1 * m["tokens_per_s"]
        return m

    result = Tuner(load_scenario(_tiny(micro_batch=4)), TuneOptions(systems=("gpu_only",)), evaluate=banded).run()
    text = format_text(result)
    assert "[p10-p90]" in text
    payload = to_json(result)
    assert "tokens_per_s_p10" in payload["top"][0]["metrics"]


def test_cli_refuses_an_unwritable_out_before_searching(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(_tiny(micro_batch=4)))
    rc = main(["tune", str(scenario), "--out", str(tmp_path), "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "is a folder" in err


def test_ties_between_zero_stages_go_to_the_lowest_stage_that_fits() -> None:
    # gpu_only times ZeRO stages 0-2 without offload alike (DDP all-reduce); the tuner must not recommend a
    # higher stage for nothing: among equal scores the lowest stage wins, and the report names it. Stage 3
    # without offload is the zero3 system (a DeepSpeed config at stage 3 reads back as zero3), never gpu_only.
    data = _with_interconnect(_tiny("gpu_only", micro_batch=1, seq_len=511))  # odd: no sequence parallelism
    result = tune(data, TuneOptions(gpus=4, global_batch=4, systems=("gpu_only",)))
    best = result.best
    assert best is not None and best.settings["cluster.data_parallel"] == 4
    stages = [e for e in result.ranked if e.settings["cluster.data_parallel"] == 4
              and e.settings["training.activation_checkpointing"] == best.settings["training.activation_checkpointing"]]
    assert {e.settings["schedule.state_bytes_per_param"] for e in stages} == {16.0, 7.0, 5.5}  # stages 0-2 fit
    assert best.settings["schedule.state_bytes_per_param"] == 16.0
    assert "ZeRO-0 (16 B/param)" in format_text(result)
