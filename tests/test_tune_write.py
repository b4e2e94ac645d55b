"""``sosim tune`` writes its winner: the written DeepSpeed config, read back as ``sosim run --ds-config`` reads
it (with the flags the output lists), predicts the winner's tokens/s exactly, for every shipped scenario and
for DeepSpeed inputs on both shipped GH200 and H200 profiles (issue 15 item 2). Small budgets keep it quick."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from sosim import load_scenario, simulate
from sosim.answers.tune import TuneOptions, tune
from sosim.answers.tune.write_deepspeed import outside_changes, read_back
from sosim.answers.tune.write_frameworks import FORMATS as FRAMEWORK_FORMATS
from sosim.answers.tune.write_frameworks import read_back as framework_read_back
from sosim.answers.tune.write_frameworks import write_winner
from sosim.cli import main
from sosim.formats.dsconfig import ds_config_from_scenario
from sosim.schedules.system_api import Unsaid

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
DS = ROOT / "scenarios" / "deepspeed"
MODEL = DS / "models" / "measured-llama-1.1b.json"
# Scenario keys outside any DeepSpeed config: the model code, the launcher, the data, the machine.
LAUNCH_KEYS = {"cluster.gpus", "training.seq_len", "training.activation_checkpointing"}


def _said(unsaid: list[Unsaid]) -> set[str]:
    return {u.key for u in unsaid}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_written_config_of_every_shipped_scenario_predicts_the_winner(path: Path, tmp_path: Path) -> None:
    result = tune(load_scenario(path), TuneOptions(budget=10, jobs=1, progress=False))
    best = result.best
    assert best is not None and best.scenario is not None and best.metrics is not None
    if best.system in FRAMEWORK_FORMATS:  # FSDP2 / Megatron: written in their own format, read back as run does
        written = write_winner(result, tmp_path / "ds_config.tuned.json")
        assert {c["key"] for c in written["outside_config"]} <= {"cluster.gpus"}
        back_fw = framework_read_back(Path(written["path"]), best.scenario)
        assert simulate(back_fw).metrics["tokens_per_s"] == best.metrics["tokens_per_s"]
        return
    emitted = ds_config_from_scenario(best.scenario)
    changes = outside_changes(emitted.config, best.scenario, emitted.unsaid)
    assert [c.key for c in changes[:3]] == ["cluster.gpus", "training.seq_len", "training.activation_checkpointing"]
    # A knob that reads back differently is one the emitter said it cannot write (the paper's 'ideal'
    # techniques); a DeepSpeed winner needs nothing of the schedule outside its config.
    schedule_changes = {c.key for c in changes if c.key.startswith("schedule.")}
    deepspeed = getattr(best.scenario.schedule, "implementation", "deepspeed") == "deepspeed"
    assert not schedule_changes if deepspeed else schedule_changes <= _said(emitted.unsaid) | {
        "schedule.implementation", "schedule.cpu_adam", "schedule.weight_placement"}
    assert "schedule.system" not in schedule_changes
    sets = [c.flag.removeprefix("--set ") for c in changes if c.flag.startswith("--set ")]
    back = read_back(emitted.config, best.scenario, sets, profile_by_name=True)  # as --hardware NAME loads it
    assert back.schedule.system == best.system
    assert simulate(back).metrics["tokens_per_s"] == best.metrics["tokens_per_s"]


def _tokens_per_s(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


CASES = [  # (DeepSpeed config, model, hardware, flags the config needs)
    *((f"measured/1.1b-s2048-mb4-{stage}-clip0.ds_config.json", MODEL, hw, [])
      for stage in ("zero3", "zero2") for hw in ("gh200", "h200-pcie-gen5-x86")),
    ("superoffload_gh200.json", MODEL, "gh200", []),
    ("hf_trainer_zero3_offload_auto.json", DS / "models" / "llama-3-8b.json", "h200-pcie-gen5-x86",
     ["--micro-batch", "2", "--precision", "bf16"]),
]


@pytest.mark.parametrize(("ds", "model", "hardware", "flags"), CASES, ids=lambda c: str(c).split("/")[-1][:40])
def test_tune_then_run_the_written_config_gives_the_winners_tokens_per_s(
        ds: str, model: Path, hardware: str, flags: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tuned.json"
    rc, tuned = _tokens_per_s(capsys, [
        "tune", "--ds-config", str(DS / ds), "--model", str(model), "--hardware", hardware, *flags,
        "--budget", "40", "--jobs", "1", "--out", str(out), "--format", "json", "--no-progress"])
    assert rc == 0
    winner = tuned["top"][0]
    written = tuned["ds_config_written"]
    assert written["path"] == str(out)
    keys = {o["key"] for o in written["outside_config"]}
    assert keys == LAUNCH_KEYS  # a DeepSpeed winner needs only the launch flags
    # The command the output prints, run as printed (the model path is the one given to tune).
    argv = shlex.split(written["run_back"])[1:]
    assert argv[:2] == ["run", "--ds-config"] and str(model) in argv
    rc, ran = _tokens_per_s(capsys, [*argv, "--format", "json"])
    assert rc == 0
    assert ran["system"] == winner["system"]
    assert ran["tokens_per_s"] == winner["metrics"]["tokens_per_s"]


def test_gpu_only_is_written_at_the_lowest_stage_that_reads_back_as_gpu_only() -> None:
    # The bug of issue 15: a ZeRO-3 base and a gpu_only winner on one GPU gave "stage": 3, which reads back as
    # the zero3 system (ZeRO-3 in HBM), another prediction. Stage 3 without offload is never gpu_only.
    sc = load_scenario("gh200_gpu_only_2b")
    base = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    emitted = ds_config_from_scenario(sc, base).config
    assert emitted["zero_optimization"]["stage"] == 0 and "offload_optimizer" not in emitted["zero_optimization"]
    back = read_back(emitted, sc, [])
    assert back.schedule.system == "gpu_only"
    # A stage the base names is kept when it means the same state (stage 2 on one rank: 16 B/param).
    base2 = {"zero_optimization": {"stage": 2}}
    assert ds_config_from_scenario(sc, base2).config["zero_optimization"]["stage"] == 2


def test_a_tuned_machine_override_is_listed_and_reproduced() -> None:
    # The scenario's machine differs from its profile (--set hardware...): `--hardware NAME` alone would load the
    # profile as shipped, so the overrides are listed as --set flags, and with them the winner is reproduced.
    sc = load_scenario("gh200_superoffload_deepspeed_8b", ["hardware.gpu.hbm_gib=60", "hardware.link.h2d_GBps=100"])
    result = tune(sc, TuneOptions(budget=20, jobs=1, progress=False))
    best = result.best
    assert best is not None and best.scenario is not None and best.metrics is not None
    emitted = ds_config_from_scenario(best.scenario)
    changes = outside_changes(emitted.config, best.scenario, emitted.unsaid)
    assert {c.flag for c in changes} >= {"--set hardware.gpu.hbm_gib=60.0", "--set hardware.link.h2d_GBps=100.0"}
    sets = [c.flag.removeprefix("--set ") for c in changes if c.flag.startswith("--set ")]
    back = read_back(emitted.config, best.scenario, sets, profile_by_name=True)
    assert simulate(back).metrics["tokens_per_s"] == best.metrics["tokens_per_s"]


def test_an_auto_the_config_no_longer_says_is_a_change_for_the_hf_trainer() -> None:
    # The HF Trainer fills "auto" from its own arguments and refuses a number that differs from them: a written
    # micro-batch of 2 where the user's config said "auto" means --per_device_train_batch_size 2.
    base = json.loads((DS / "hf_trainer_zero3_offload_auto.json").read_text())
    sc = load_scenario("gh200_zero3_offload_4b", ["training.micro_batch=2"])
    notes = ds_config_from_scenario(sc, base).not_expressible
    assert ('train_micro_batch_size_per_gpu: "auto" in your config is now 2; pass --per_device_train_batch_size 2 '
            "to the HF Trainer") in notes
    assert any(n.startswith("bf16.enabled:") and "pass --bf16 to the HF Trainer" in n for n in notes)
