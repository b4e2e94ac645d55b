"""Hugging Face config.json -> model: the families sosim reads, their defaults, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sosim.formats.hf_model import load_hf_model, model_from_hf
from sosim.formats.jsonio import parse_json
from sosim.hardware import model as tm
from sosim.inputs.config import ModelSpec
from sosim.inputs.errors import ConfigError

MODELS = Path(__file__).resolve().parent.parent / "scenarios" / "deepspeed" / "models"


def _hf(data: dict[str, object]) -> dict[str, object]:
    return model_from_hf(parse_json(json.dumps(data, indent=1), "config.json")).model


LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 16,
            "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000, "hidden_act": "silu"}


def test_llama_3_8b_has_its_published_parameter_count() -> None:
    hf = load_hf_model(MODELS / "llama-3-8b.json")
    assert hf.model == {"name": "llama-3-8b", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
                        "ffn_kind": "swiglu", "vocab": 128256, "tied_embeddings": False}
    # Meta's model card: 8.03B parameters (32 layers of 218.1M + 2 x 525.3M embeddings + the final norm).
    n = tm.total_params(ModelSpec.model_validate(hf.model))
    assert n == 8_030_261_248
    assert hf.max_positions == 8192


def test_qwen2_and_gpt2_families() -> None:
    qwen = load_hf_model(MODELS / "qwen2.5-7b.json")
    assert qwen.model["ffn_kind"] == "swiglu" and qwen.model["kv_heads"] == 4 and qwen.model["ffn"] == 18944
    assert qwen.sliding_window is None  # use_sliding_window: false
    assert any(n.key == "q/k/v biases" for n in qwen.notes)  # said, not silently dropped
    gpt2 = load_hf_model(MODELS / "gpt2.json")
    assert gpt2.model == {"name": "gpt2", "layers": 12, "hidden": 768, "heads": 12, "kv_heads": 12, "ffn": 3072,
                          "ffn_kind": "gelu", "vocab": 50257, "tied_embeddings": True}
    # GPT-2 small: 124.4M parameters (tied embeddings, biases, two LayerNorms per layer, 1024 learned positions
    # which sosim does not count: 786,432 of them).
    assert tm.total_params(ModelSpec.model_validate(gpt2.model)) == 124_439_808 - 786_432


def test_measured_shapes_match_the_harness() -> None:
    # scripts/ds_train_step.py SIZES: (layers, hidden); heads = hidden/128, kv = heads/4, ffn = 8/3 h -> 256.
    for size, layers, hidden, ffn in (("1.1b", 22, 2048, 5632), ("2.0b", 10, 4096, 11008), ("3.8b", 20, 4096, 11008)):
        m = load_hf_model(MODELS / f"measured-llama-{size}.json").model
        assert (m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["ffn"], m["vocab"]) == (
            layers, hidden, hidden // 128, hidden // 512, ffn, 32000)


def test_defaults_follow_transformers() -> None:
    data = dict(LLAMA_1B)
    del data["num_key_value_heads"]
    hf = model_from_hf(parse_json(json.dumps(data), "config.json"))
    assert hf.model["kv_heads"] == 16 and hf.model["tied_embeddings"] is False
    assert {n.key for n in hf.notes if n.status == "defaulted"} == {"num_key_value_heads", "tie_word_embeddings"}
    # Unknown model_type: read by its activation (silu -> gated); the base PretrainedConfig ties embeddings.
    other = model_from_hf(parse_json(json.dumps({**LLAMA_1B, "model_type": "newthing"}), "config.json"))
    assert other.model["ffn_kind"] == "swiglu" and other.model["tied_embeddings"] is True
    assert any("not one sosim knows" in n.reason for n in other.notes)
    neox = _hf({**LLAMA_1B, "model_type": "gpt_neox", "hidden_act": "gelu", "intermediate_size": 8192})
    assert neox["ffn_kind"] == "gelu" and neox["tied_embeddings"] is False


def test_folder_and_text_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": LLAMA_1B}))
    hf = load_hf_model(tmp_path / "m")
    assert hf.model["hidden"] == 2048 and hf.model["name"] == "m"


@pytest.mark.parametrize(("change", "expected"), [
    # Issue 22: MoE configs and head_dim are read (tests/test_moe_hf.py); what remains refused names its key.
    ({"num_local_experts": 8}, "config.json:10: num_local_experts: a mixture of experts needs its experts per token"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "kv_lora_rank": 512},
     "config.json:12: kv_lora_rank: multi-head latent attention"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "ep_size": 4}, "config.json:12: ep_size: expert parallelism"),
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, "config.json:1: experts_per_token (9) cannot exceed"),
    ({"head_dim": 0}, "config.json:10: head_dim: expected a positive integer"),
    ({"hidden_size": None}, "config.json:3: hidden_size: missing"),
    ({"num_attention_heads": 0}, "config.json:5: num_attention_heads: expected a positive integer"),
    ({"num_key_value_heads": 5}, "config.json:1: kv_heads (5) must divide heads (16)"),
    ({"model_type": "mystery", "hidden_act": "tanh"}, "config.json:2: model_type: model_type 'mystery'"),
])
def test_errors_name_file_line_and_key(change: dict[str, object], expected: str) -> None:
    data = {**LLAMA_1B, **change}
    with pytest.raises(ConfigError) as err:
        model_from_hf(parse_json(json.dumps(data, indent=1), "config.json"))
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems
