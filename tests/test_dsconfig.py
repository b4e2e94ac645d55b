"""DeepSpeed JSON -> scenario: each key's mapping with DeepSpeed's semantics, the report, errors, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sosim import load_scenario, simulate
from sosim.cli import main
from sosim.formats.dsconfig import DsMapping, RunInputs, map_ds_config, prefetch_layers_for
from sosim.formats.hf_model import HfModel
from sosim.formats.jsonio import Note, parse_json
from sosim.inputs.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DS = ROOT / "scenarios" / "deepspeed"
HW = "h200-pcie-gen5-x86"
LLAMA = {"name": "llama-1.1b", "layers": 22, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn": 5632,
         "ffn_kind": "swiglu", "vocab": 32000, "tied_embeddings": False}
LAYER_PARAMS = 45_092_864  # 2048 x (2048 + 2 x 512) + 2048^2 + 2048 x 2 x 5632 + 5632 x 2048 + 2 x 2048


def ds_with(**zero: Any) -> dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}, "zero_optimization": zero}


def mapping(ds: dict[str, Any], **inputs: Any) -> DsMapping:
    loc = parse_json(json.dumps(ds, indent=1), "ds.json")
    return map_ds_config(loc, HfModel(model=dict(LLAMA), origin="config.json"), RunInputs(hardware=HW, **inputs))


def problems(ds: dict[str, Any], **inputs: Any) -> list[str]:
    with pytest.raises(ConfigError) as err:
        mapping(ds, **inputs)
    return err.value.problems


def note(m: DsMapping, key: str) -> Note:
    found = [n for n in m.notes if n.key == key]
    assert len(found) == 1, (key, [n.key for n in m.notes])
    return found[0]


def test_layer_params_constant_is_the_model_arithmetic() -> None:
    from sosim.hardware import model as tm
    from sosim.inputs.config import ModelSpec

    assert tm.layer_params(ModelSpec.model_validate(LLAMA)) == LAYER_PARAMS


# ---- systems --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("zero", "system"), [
    ({}, "gpu_only"),
    ({"stage": 2}, "gpu_only"),
    ({"stage": 1, "offload_optimizer": {"device": "cpu"}}, "zero_offload"),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zero_offload"),
    ({"stage": 2, "cpu_offload": True}, "zero_offload"),  # deprecated spelling
    ({"stage": 3, "offload_optimizer": {"device": "cpu"}}, "zero3_offload"),
    ({"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, "zero_infinity"),
    ({"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": True}}, "superoffload"),
    ({"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": True}}, "zero_offload"),
])
def test_stage_and_offload_pick_the_system(zero: dict[str, Any], system: str) -> None:
    m = mapping(ds_with(**zero))
    assert m.scenario["schedule"]["system"] == system
    if system != "gpu_only":
        assert m.scenario["schedule"]["implementation"] == "deepspeed"
    load_scenario(m.scenario)  # a valid scenario


def test_no_offload_partitions_model_state_like_zero() -> None:
    # 16 B/param (bf16 params + grads, fp32 master + m + v), partitioned across 4 data-parallel ranks.
    expect = {0: 16.0, 1: 4 + 12 / 4, 2: 2 + 14 / 4}
    for stage, state in expect.items():
        ds = {**ds_with(stage=stage), "train_batch_size": 16, "gradient_accumulation_steps": 1}
        m = mapping(ds)
        assert m.scenario["cluster"]["gpus"] == 4  # implied by 16 = 4 x 1 x ranks
        assert m.scenario["schedule"]["state_bytes_per_param"] == state
    # Stage 3 without offload is its own system: weights gathered per layer (sosim/schedules/zero3.py).
    ds = {**ds_with(stage=3, zero_quantized_weights=True), "train_batch_size": 16, "gradient_accumulation_steps": 1}
    assert mapping(ds).scenario["schedule"] == {"system": "zero3", "zero_quantized_weights": True}


def test_deepspeed_defaults_are_used_and_reported() -> None:
    m = mapping(ds_with(stage=2, offload_optimizer={"device": "cpu"}))
    s, t = m.scenario["schedule"], m.scenario["training"]
    # runtime/zero/config.py: reduce_bucket_size 5e8 elements, overlap_comm false below stage 3;
    # offload_config.py: pin_memory true (0.19.5+, PR 8207); constants.py: gradient_clipping 1.0 (0.19.3+, PR 8068),
    # accumulation 1. The default release is the newest modelled, 0.19.8.
    assert (s["bucket_mb"], s["overlap_comm"], s["pin_memory"]) == (1000.0, False, True)
    assert (t["gradient_clipping"], t["grad_accum"]) == (1.0, 1)
    defaulted = {n.key: n.as_value for n in m.notes if n.status == "defaulted"}
    assert defaulted["zero_optimization.reduce_bucket_size"] == 1000.0
    assert defaulted["zero_optimization.overlap_comm"] is False
    assert defaulted["gradient_clipping"] == 1.0
    assert defaulted["--ds-version"] == "0.19.8"
    # DeepSpeed 0.18.8: clipping off and pageable offload buffers by default (before PR 8068 and PR 8207).
    old = mapping(ds_with(stage=2, offload_optimizer={"device": "cpu"}), deepspeed_version="0.18.8").scenario
    assert (old["training"]["gradient_clipping"], old["schedule"]["pin_memory"]) == (0.0, False)
    assert old["schedule"]["deepspeed_version"] == "0.18.8"
    z3 = mapping(ds_with(stage=3, offload_optimizer={"device": "cpu"})).scenario["schedule"]
    assert z3["overlap_comm"] is True and z3["sub_group_elements"] == 1e9


def test_knobs_map_with_their_units() -> None:
    m = mapping(ds_with(stage=3, reduce_bucket_size=2e8, sub_group_size=1e8, overlap_comm=False,
                        offload_optimizer={"device": "cpu", "pin_memory": False, "super_offload": True,
                                           "ratio": 0.75, "cpuadam_cores_perc": 0.5}))
    s = m.scenario["schedule"]
    assert s["bucket_mb"] == 400.0  # 2e8 elements x 2 B
    assert s["sub_group_elements"] == 1e8
    assert s["gpu_optimizer_fraction"] == 0.25  # 1 - ratio
    assert s["cpu_adam_core_fraction"] == 0.5
    assert (s["pin_memory"], s["overlap_comm"], s["weight_placement"]) == (False, False, "stationary")
    assert note(m, "zero_optimization.offload_optimizer.ratio").to == "schedule.gpu_optimizer_fraction"
    flow = mapping(ds_with(stage=3, offload_optimizer={"device": "cpu", "super_offload": True},
                           offload_param={"device": "cpu"}))
    assert flow.scenario["schedule"]["weight_placement"] == "flow"


def test_prefetch_bucket_becomes_layers_ahead() -> None:
    assert prefetch_layers_for(0, 100) == 0
    assert prefetch_layers_for(1, 100) == 1 and prefetch_layers_for(100, 100) == 1
    assert prefetch_layers_for(101, 100) == 2
    zi = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    # DeepSpeed's default 5e7 elements covers two 45M-parameter layers.
    assert mapping(ds_with(**zi)).scenario["schedule"]["prefetch_layers"] == 2
    m = mapping(ds_with(**zi, stage3_prefetch_bucket_size=3 * LAYER_PARAMS))
    assert m.scenario["schedule"]["prefetch_layers"] == 3
    # The HF Trainer's "auto": 0.9 x hidden^2 = 3.77M elements -> the next layer only.
    assert mapping(ds_with(**zi, stage3_prefetch_bucket_size="auto")).scenario["schedule"]["prefetch_layers"] == 1
    ignored = note(mapping(ds_with(stage=3, offload_optimizer={"device": "cpu"}, stage3_prefetch_bucket_size=1e8)),
                   "zero_optimization.stage3_prefetch_bucket_size")
    assert ignored.status == "ignored" and not ignored.affects_step  # one GPU: no all-gathers to prefetch


def test_optimizer_choice() -> None:
    off = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert mapping({**ds_with(**off), "optimizer": {"type": "AdamW"}}).scenario["schedule"]["cpu_adam"] == "cpu_adam"
    torch_adam = {**ds_with(**off), "optimizer": {"type": "Adam", "params": {"torch_adam": True, "lr": 1e-4}}}
    m = mapping(torch_adam)
    assert m.scenario["schedule"]["cpu_adam"] == "torch"
    assert note(m, "optimizer.params").status == "ignored"  # the learning rate does not matter
    # No optimizer section: the client's; DeepSpeed insists on DeepSpeedCPUAdam unless told otherwise.
    assert mapping(ds_with(**off)).scenario["schedule"]["cpu_adam"] == "cpu_adam"
    loose = {**ds_with(**off), "zero_force_ds_cpu_optimizer": False}
    assert mapping(loose).scenario["schedule"]["cpu_adam"] == "torch"
    lion = mapping({**ds_with(**off), "optimizer": {"type": "Lion"}})
    assert note(lion, "optimizer.type").affects_step
    so = {"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": True}}
    assert mapping({**ds_with(**so), "optimizer": {"type": "Adam", "params": {"torch_adam": True}}}).scenario[
        "schedule"]["cpu_adam"] == "cpu_adam"  # the SuperOffload worker always runs DeepSpeedCPUAdam


# ---- batch, precision, clipping, checkpointing -----------------------------------------------------------
def test_batch_arithmetic_follows_deepspeed() -> None:
    off = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    base = {"bf16": {"enabled": True}, "zero_optimization": off}
    m = mapping({**base, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})
    assert m.scenario["cluster"]["gpus"] == 4 and m.scenario["training"]["grad_accum"] == 2
    m = mapping({**base, "train_batch_size": 32}, gpus=2)  # DeepSpeed: accumulation 1, micro = 32 / 2
    assert (m.scenario["training"]["micro_batch"], m.scenario["training"]["grad_accum"]) == (16, 1)
    m = mapping({**base, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, gpus=2)
    assert m.scenario["training"]["grad_accum"] == 4
    bad = problems({**base, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                    "gradient_accumulation_steps": 2}, gpus=2)
    assert bad == ["ds.json:11: train_batch_size: 32 != micro-batch 4 x accumulation 2 x 2 data-parallel ranks; "
                   "DeepSpeed rejects this (runtime/config.py _batch_assertion)"]
    sp = mapping({**base, "train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2}, gpus=4)
    assert sp.scenario["cluster"] == {"gpus": 4, "sequence_parallel": 2}
    assert problems({**base})[0].startswith("ds.json:1: train_micro_batch_size_per_gpu: missing")


def test_auto_values_follow_the_hf_trainer() -> None:
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": "auto"}}
    errs = problems(ds)
    assert any("bf16.enabled" in p and "--precision" in p for p in errs)
    errs = problems(ds, precision="bf16")
    assert errs == ['ds.json:2: train_micro_batch_size_per_gpu: "auto" (the HF Trainer fills it from '
                    '--per_device_train_batch_size): pass --micro-batch N']
    m = mapping(ds, precision="bf16", micro_batch=2)
    t, s = m.scenario["training"], m.scenario["schedule"]
    assert (t["micro_batch"], t["grad_accum"], t["gradient_clipping"], t["precision"]) == (2, 1, 1.0, "bf16")
    assert s["bucket_mb"] == 2048 * 2048 * 2 / 1e6  # hidden_size^2 elements (trainer_config_finalize)


def test_precision_and_clipping() -> None:
    off = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    fp16 = mapping({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True, "loss_scale": 0},
                    "gradient_clipping": 0.5, "zero_optimization": off})
    assert fp16.scenario["training"]["precision"] == "fp16"
    assert fp16.scenario["training"]["gradient_clipping"] == 0.5
    assert note(fp16, "fp16.loss_scale").status == "ignored"
    both = problems({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert "both enabled" in both[0]
    fp32 = problems({"train_micro_batch_size_per_gpu": 1})
    assert "fp32" in fp32[0] and "--precision" in fp32[0]
    old = mapping({"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": True}})  # pre-0.9 spelling
    assert old.scenario["training"]["precision"] == "bf16"


def test_activation_checkpointing_is_a_flag_with_a_stated_default() -> None:
    m = mapping(ds_with(stage=2))
    assert m.scenario["training"]["activation_checkpointing"] is True
    assert note(m, "--activation-checkpointing").status == "defaulted"
    off = mapping({**ds_with(stage=2), "activation_checkpointing": {"partition_activations": False,
                                                                   "cpu_checkpointing": True}},
                  activation_checkpointing=False)
    assert off.scenario["training"]["activation_checkpointing"] is False
    assert note(off, "activation_checkpointing.cpu_checkpointing").affects_step


# ---- ignored keys: every one named, with its reason ------------------------------------------------------
def test_zero_plus_plus_matters_only_with_data_parallelism() -> None:
    zpp = dict(stage=3, offload_optimizer={"device": "cpu"}, zero_quantized_weights=True,
               zero_quantized_gradients=True, zero_hpz_partition_size=8)
    one = mapping(ds_with(**zpp))
    assert not any(note(one, f"zero_optimization.{k}").affects_step
                   for k in ("zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"))
    eight = mapping({**ds_with(**zpp), "train_batch_size": 32, "gradient_accumulation_steps": 1})  # 8 ranks
    assert all(note(eight, f"zero_optimization.{k}").affects_step
               for k in ("zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"))


def test_partial_offload_and_core_split_outside_superoffload() -> None:
    m = mapping(ds_with(stage=3, offload_optimizer={"device": "cpu", "ratio": 0.5, "cpuadam_cores_perc": 0.5}))
    assert m.scenario["schedule"]["system"] == "zero3_offload"
    assert note(m, "zero_optimization.offload_optimizer.ratio").affects_step
    assert m.scenario["schedule"]["cpu_adam_core_fraction"] == 1.0
    assert "ratio < 1) needs stage 3" in problems(ds_with(stage=2, offload_optimizer={"device": "cpu",
                                                                                       "ratio": 0.5}))[0]


def test_max_live_parameters_is_checked_against_the_working_set() -> None:
    zi = dict(stage=3, offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
    binds = note(mapping(ds_with(**zi, stage3_max_live_parameters=1e6)), "zero_optimization.stage3_max_live_parameters")
    assert binds.affects_step
    loose = note(mapping(ds_with(**zi, stage3_max_live_parameters=1e9)), "zero_optimization.stage3_max_live_parameters")
    assert not loose.affects_step


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}" if prefix else k)]
    return [prefix]


def _covered(dotted: str, named: set[str]) -> bool:
    parts = dotted.split(".")
    return any(".".join(parts[:i]) in named for i in range(len(parts), 0, -1))


def test_every_key_of_a_real_config_is_accounted_for() -> None:
    for path in [*sorted((DS / "measured").glob("*.json")), DS / "hf_trainer_zero3_offload_auto.json",
                 DS / "superoffload_gh200.json"]:
        data = json.loads(path.read_text())
        m = mapping(data, micro_batch=1, precision="bf16")
        named = {n.key for n in m.notes}
        assert [leaf for leaf in _leaves(data) if not _covered(leaf, named)] == [], path.name


# ---- bad input -------------------------------------------------------------------------------------------
def test_invalid_values_name_file_line_and_key() -> None:
    text = """{
  "train_micro_batch_size_per_gpu": 4,
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 3,
    "overlap_com": true,
    "offload_optimizer": {"device": "nvme", "pin_memory": true}
  }
}"""
    with pytest.raises(ConfigError) as err:
        map_ds_config(parse_json(text, "ds.json"), HfModel(model=dict(LLAMA)), RunInputs(hardware=HW))
    # NVMe is a modelled tier (zero_infinity_nvme): the typo is the problem, not the device.
    assert err.value.problems[0].startswith("ds.json:6: zero_optimization.overlap_com: unknown key")
    stage2 = text.replace('"stage": 3', '"stage": 2').replace('"overlap_com"', '"overlap_comm"')
    with pytest.raises(ConfigError) as err:
        map_ds_config(parse_json(stage2, "ds.json"), HfModel(model=dict(LLAMA)), RunInputs(hardware=HW))
    assert "NVMe offload is modelled for ZeRO stage 3" in err.value.problems[0]
    text = text.replace('"nvme"', '"cpu"')
    with pytest.raises(ConfigError) as err:
        map_ds_config(parse_json(text, "ds.json"), HfModel(model=dict(LLAMA)), RunInputs(hardware=HW))
    assert err.value.problems[0].startswith("ds.json:6: zero_optimization.overlap_com: unknown key (did you mean "
                                            "'overlap_comm'?): DeepSpeed 0.19 rejects it")
    assert problems(ds_with(stage=4))[0] == "ds.json:7: zero_optimization.stage: must be <= 3, got 4"
    assert problems(ds_with(stage=2, reduce_bucket_size=1.5))[0].endswith("expected a whole number, got 1.5")
    assert problems(ds_with(stage=3, offload_optimizer={"device": "cpu", "super_offload": True,
                                                        "cpuadam_cores_perc": 0}))[0].endswith("must be > 0, got 0")
    assert "without optimizer offload" in problems(ds_with(stage=3, offload_param={"device": "cpu"}))[0]
    with pytest.raises(ConfigError) as err:
        parse_json('{"bf16": {"enabled": true},\n "bf16": {}}', "ds.json")
    assert err.value.problems == ["ds.json:2: bf16: duplicate key (first at line 1); DeepSpeed rejects duplicate "
                                  "keys too"]
    with pytest.raises(ConfigError) as err:
        parse_json('{"a": 1,\n // comment\n}', "ds.json")
    assert err.value.problems[0].startswith("ds.json:2: JSON syntax error")


# ---- command line ----------------------------------------------------------------------------------------
MEASURED_ZERO3 = str(DS / "measured" / "1.1b-s2048-mb4-zero3-clip0.ds_config.json")
MODEL_1B = str(DS / "models" / "measured-llama-1.1b.json")


def test_cli_run_from_ds_config_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--ds-config", MEASURED_ZERO3, "--model", MODEL_1B, "--hardware", HW, "--format", "json",
            "--set", "schedule.sub_group_elements=2e8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert out.count("\n") == 1
    assert data["system"] == "zero3_offload" and data["step_time_s"] > 0
    report = data["ds_config_mapping"]
    assert {"mapped", "defaulted", "ignored", "model", "scenario"} <= set(report)
    sub = next(n for n in report["mapped"] if n["key"] == "zero_optimization.sub_group_size")
    assert sub["as"] == 1e8 and "replaced by --set schedule.sub_group_elements=2e8" in sub["reason"]
    # The same step as the hand-written scenario the validation row uses.
    ref = simulate(load_scenario(ROOT / "scenarios/h200_x86_llama1.1b_zero2_measured.yaml",
                                 ["schedule.system=zero3_offload", "schedule.sub_group_elements=2e8"]))
    assert data["step_time_s"] == ref.metrics["step_time_s"]


def test_cli_table_prints_the_report_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--ds-config", MEASURED_ZERO3, "--model", MODEL_1B, "--hardware", HW, "--seq", "1024"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("# 1.1b-s2048-mb4-zero3-clip0+llama-1.1b:") and "zero_optimization" not in cap.out
    assert "mapped       zero_optimization.stage = 3 -> schedule.system" in cap.err
    assert "--seq = 1024 -> training.seq_len = 1024" in cap.err


def test_cli_emits_a_deepspeed_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds.json"
    assert main(["run", str(ROOT / "scenarios/gh200_superoffload_deepspeed_8b.yaml"), "--emit-ds-config", str(out),
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ds_config_emitted"]["path"] == str(out) and "ds_config_mapping" not in data
    ds = json.loads(out.read_text())
    assert ds["zero_optimization"]["offload_optimizer"] == {
        "device": "cpu", "pin_memory": True, "super_offload": True, "ratio": 1.0, "cpuadam_cores_perc": 0.8}
    assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_clipping"] == 0.0


@pytest.mark.parametrize(("args", "message"), [
    (["--model", MODEL_1B], "--model: only with --ds-config"),
    (["--ds-config", MEASURED_ZERO3, "--hardware", HW], "--ds-config needs --model"),
    ([], "give a scenario file, or --ds-config"),
    (["scenarios/h100_gpu_only_1b.yaml", "--ds-config", MEASURED_ZERO3, "--model", MODEL_1B, "--hardware", HW],
     "give either a scenario file or --ds-config, not both"),
    (["--ds-config", MEASURED_ZERO3, "--model", MODEL_1B, "--hardware", "nosuchbox"], "unknown hardware profile"),
    (["--ds-config", MEASURED_ZERO3, "--model", MODEL_1B, "--hardware", HW, "--set", "model.heads=5"],
     "--set model.heads=5: model: heads (5) must divide hidden"),  # the override that broke it, not the files
])
def test_cli_usage_errors_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_bad_config_file_names_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "train_micro_batch_size_per_gpu": 4,\n  "bf16": {"enabled": true},\n'
                   '  "zero_optimization": {"stage": 2, "sub_group_sise": 1e8}\n}\n')
    assert main(["run", "--ds-config", str(bad), "--model", MODEL_1B, "--hardware", HW]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:4: zero_optimization.sub_group_sise: unknown key (did you mean 'sub_group_size'?)" in err
    assert "Traceback" not in err


def test_cli_refuses_an_unwritable_emit_path_before_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ROOT / "scenarios/h100_gpu_only_1b.yaml"), "--emit-ds-config", str(tmp_path)]) == 2
    assert "--emit-ds-config" in capsys.readouterr().err
    assert main(["run", str(ROOT / "scenarios/h100_gpu_only_1b.yaml"), "--emit-ds-config",
                 str(tmp_path / "x.yaml")]) == 2


def test_a_release_outside_the_modelled_ones_is_a_located_error() -> None:
    msgs = problems(ds_with(stage=2, offload_optimizer={"device": "cpu"}), deepspeed_version="0.18.5")
    assert msgs[0].startswith("--ds-version: DeepSpeed 0.18.5 is not modelled: PR 7780")
    assert "modelled DeepSpeed versions: 0.18.0-0.18.4, 0.18.7-0.18.8, 0.18.9-0.19.5, 0.19.8" in msgs[0]
    assert "outside the modelled versions" in problems(ds_with(stage=2), deepspeed_version="0.17.6")[0]
