"""Hugging Face MoE / head_dim / sliding-window configs -> model spec; expert parallelism refused (issue 22)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sosim.answers.validate import row_problems
from sosim.answers.validate_fit import fit_prediction
from sosim.answers.validate_measured import _hf_config
from sosim.formats.dsconfig import RunInputs, map_ds_config
from sosim.formats.hf_model import model_from_hf
from sosim.formats.jsonio import parse_json
from sosim.hardware import model as tm
from sosim.inputs.config import ModelSpec
from sosim.inputs.errors import ConfigError
from sosim.run.loader import Located

ROOT = Path(__file__).resolve().parents[1]
BASE = {"hidden_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 16, "num_key_value_heads": 4,
        "intermediate_size": 2816, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False}


def _model(data: dict[str, Any]) -> dict[str, Any]:
    return model_from_hf(parse_json(json.dumps(data, indent=1), "config.json")).model


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        model_from_hf(parse_json(json.dumps(data, indent=1), "config.json"))
    return err.value.problems


def test_mixtral_experts_use_intermediate_size() -> None:
    m = _model({**BASE, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2})
    assert (m["experts"], m["experts_per_token"], m["expert_ffn"]) == (8, 2, 2816)


def test_qwen3_moe_sparse_step_and_mlp_only_layers() -> None:
    m = _model({**BASE, "model_type": "qwen3_moe", "num_experts": 32, "num_experts_per_tok": 4,
                "moe_intermediate_size": 256, "decoder_sparse_step": 2, "mlp_only_layers": [1], "head_dim": 128})
    # Qwen3MoeDecoderLayer: MoE where idx not in mlp_only_layers and (idx + 1) % 2 == 0 -> layers 3 and 5
    assert m["dense_layers"] == 4 and m["expert_ffn"] == 256 and m["qk_norm"] is True
    assert m["head_dim"] == 128  # 16 x 128 = 2048 != hidden 1024


def test_deepseek_style_shared_experts_and_dense_first_layers() -> None:
    m = _model({**BASE, "model_type": "glm4_moe", "n_routed_experts": 64, "num_experts_per_tok": 6,
                "moe_intermediate_size": 512, "n_shared_experts": 2, "first_k_dense_replace": 1})
    assert (m["experts"], m["shared_experts"], m["dense_layers"]) == (64, 2, 1)
    spec = ModelSpec.model_validate(m)
    # active per MoE layer: router + 6 routed + 2 shared experts of 3 x 1024 x 512
    assert tm.layer_active_params(spec) == pytest.approx(
        tm.attention_params(spec) + (5 * (1024 * 64 + 8 * 3 * 1024 * 512) + 1 * 3 * 1024 * 2816) / 6)


def test_qwen2_moe_shared_expert_width() -> None:
    m = _model({**BASE, "model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4,
                "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632})
    assert (m["shared_experts"], m["shared_expert_ffn"]) == (1, 5632)


def test_gpt_oss_default_layer_types_alternate() -> None:
    m = _model({**BASE, "model_type": "gpt_oss", "num_local_experts": 32, "num_experts_per_tok": 4,
                "head_dim": 64, "sliding_window": 128})
    assert (m["sliding_window"], m["sliding_layers"], m["attention_sinks"]) == (128, 3, True)


@pytest.mark.parametrize(("change", "expected"), [
    ({"layer_types": ["full_attention"] * 5}, "config.json:10: layer_types: 5 entries for 6 layers"),
    ({"layer_types": ["sliding_attention"] * 6}, "config.json:10: layer_types: layer_types names 6"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "decoder_sparse_step": 0}, "config.json:14: decoder_sparse_step: expected a positive integer"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
      "mlp_only_layers": [0, 1, 2, 3, 4, 5]}, "config.json:3: num_hidden_layers: no layer is a mixture"),
])
def test_moe_and_attention_errors_are_located(change: dict[str, Any], expected: str) -> None:
    problems = _problems({**BASE, **change})
    assert any(p.startswith(expected) for p in problems), problems


def test_deepspeed_expert_parallel_is_refused_by_name() -> None:
    hf = model_from_hf(Located({**BASE, "model_type": "llama"}, "config.json"))
    ds = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
          "expert_parallel": {"enabled": True, "autoep_size": 4}}
    with pytest.raises(ConfigError) as err:
        map_ds_config(parse_json(json.dumps(ds, indent=1), "ds.json"), hf, RunInputs(hardware="gh200"))
    assert any(p.startswith("ds.json:") and "expert_parallel.enabled: expert parallelism" in p
               for p in err.value.problems), err.value.problems
    ds["expert_parallel"] = {"enabled": False}
    map_ds_config(parse_json(json.dumps(ds), "ds.json"), hf, RunInputs(hardware="gh200"))  # off: no error


def test_fit_rows_headroom_and_word_check() -> None:
    ok, margin, why = fit_prediction(ROOT / "scenarios" / "gh200_superoffload_deepspeed_gpt_oss_20b_blog.yaml", [])
    assert ok and -0.2 < margin < 0.0 and not why
    over, margin96, why96 = fit_prediction(ROOT / "scenarios" / "gh200_superoffload_deepspeed_gpt_oss_20b_blog.yaml",
                                           ["hardware=gh200"])
    assert not over and margin96 > 0.0 and "GPU memory" in why96
    loc = Located({"rows": [{}]}, "refs.yaml")
    row = {"id": "x", "source": "s", "kind": "fits", "scenario": "scenarios/gh200_superoffload_8b.yaml",
           "published": "maybe"}
    assert any("must be one of fits, does not fit" in p for p in row_problems(row, 0, loc, ROOT))


def test_measured_moe_row_becomes_a_qwen3_moe_config() -> None:
    row = {"model": "moe-s", "hidden": "2048", "layers": "8", "heads": "32", "kv_heads": "4", "ffn": "6144",
           "vocab": "32000", "head_dim": "128", "model_type": "qwen3_moe", "experts": "64",
           "experts_per_token": "8", "moe_ffn": "768"}
    m = ModelSpec.model_validate(model_from_hf(Located(_hf_config(row, "steps.csv:2"), "steps.csv:2")).model)
    assert (m.experts, m.experts_per_token, m.expert_ffn, m.q_dim, m.qk_norm) == (64, 8, 768, 4096, True)
    assert tm.total_params(m) == 8 * (2048 * (4096 + 1024) + 4096 * 2048 + 2 * 2048 + 2 * 128 + 2048 * 64
                                      + 64 * 3 * 2048 * 768) + 2 * 32000 * 2048 + 2048
    dense = {k: v for k, v in row.items() if k not in ("model_type", "experts", "experts_per_token", "moe_ffn")}
    assert "num_experts" not in _hf_config(dense, "steps.csv:3")
    # The step harness's own column names (scripts/ds_train_step.py: family, moe_experts, moe_top_k, ffn = width)
    harness = {**dense, "ffn": "768", "family": "moe", "moe_experts": "64", "moe_top_k": "8",
               "moe_impl": "own-experts-loop"}
    config = _hf_config(harness, "steps.csv:4")
    assert (config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (64, 8, 768)
    assert config["_moe_impl"] == "own-experts-loop"


@pytest.mark.parametrize(("tag", "keys"), [
    ("hf-qwen3moe-transformers5.17.0-experts:grouped_mm", {"experts_impl": "grouped_mm"}),
    ("hf-qwen3moe-transformers5.17.0-experts:eager", {"experts_impl": "eager"}),
    ("hf-qwen3moe-transformers4.57.1", {"experts_impl": "eager", "expert_tensors": "per_expert"}),
    ("own-experts-loop", {"experts_impl": "eager", "expert_tensors": "per_expert", "zero3_leaf_block": False}),
    ("", {}),
])
def test_runtime_tag_says_how_experts_ran(tag: str, keys: dict[str, str]) -> None:
    from sosim.hardware.moe import runtime_from_tag

    assert runtime_from_tag(tag) == keys


def test_per_expert_modules_are_hooked_and_fetched_one_by_one() -> None:
    from sosim.costs.analytic import parameter_tensors_per_layer

    base = ModelSpec(layers=2, hidden=64, heads=4, ffn=16, ffn_kind="swiglu", vocab=100, experts=4,
                     experts_per_token=2)
    per = base.model_copy(update={"expert_tensors": "per_expert"})
    assert parameter_tensors_per_layer(base) == 4 + 2 + 3 and parameter_tensors_per_layer(per) == 4 + 2 + 1 + 12
    assert tm.layer_params(per) == tm.layer_params(base)  # the same weights, held differently
    assert tm.layer_tensor_sizes(per)[-12:] == [64 * 16] * 12  # each expert's gate, up, down
    assert tm.layer_tensor_sizes(base)[-2:] == [4 * 2 * 16 * 64, 4 * 64 * 16]


def test_cli_runs_an_moe_config_with_memory_on_both_sides(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from sosim.cli import main

    ds = tmp_path / "so.json"
    ds.write_text(json.dumps({"train_batch_size": 4, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "sub_group_size": 8e8, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                                  "ratio": 0.9, "super_offload": True}}}))
    model = ROOT / "scenarios" / "models" / "gpt-oss-20b"
    rc = main(["run", "--ds-config", str(ds), "--model", str(model), "--hardware", "gh200-nvl2", "--seq", "8192",
               "--format", "json", "--no-bands"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["feasible"] is True
    assert out["params_b"] == pytest.approx(20.91, abs=0.01)
    assert 100 < out["gpu_mem_peak_gib"] < out["gpu_mem_usable_gib"] and 0 < out["cpu_mem_peak_gib"] < 415
    # Expert parallelism asked for: a located error naming the key, exit 2, no traceback.
    ds.write_text(json.dumps({"train_batch_size": 4, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
                              "expert_parallel": {"enabled": True, "autoep_size": 2}}, indent=1))
    rc = main(["run", "--ds-config", str(ds), "--model", str(model), "--hardware", "gh200"])
    err = capsys.readouterr().err
    assert rc == 2 and "expert_parallel.enabled: expert parallelism" in err and "Traceback" not in err
