"""A Hugging Face ``config.json`` -> the scenario's ``model:`` section (:class:`sosim.inputs.config.ModelSpec`).

Read families (the keys each uses, as in ``transformers``' configuration classes):

* gated-MLP decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``): ``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``num_key_value_heads`` (absent: equal to the heads, as ``LlamaConfig`` does),
  ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings`` -> ``ffn_kind: swiglu`` (no biases, RMSNorm);
* ``gpt2``: ``n_embd``, ``n_layer``, ``n_head``, ``n_inner`` (null: 4 x n_embd), ``vocab_size``; tied
  embeddings -> ``ffn_kind: gelu`` (biases, LayerNorm);
* ``gpt_neox``: the ``hidden_size`` keys with an ungated GELU MLP -> ``ffn_kind: gelu``.

Another ``model_type`` is read by its keys and ``hidden_act`` (silu/swish -> gated, gelu/relu -> ungated),
and the report says so. ``max_position_embeddings`` is the model's context window, not the training
sequence: the sequence length comes from the command line (``--seq``). Mixture-of-experts configs (Qwen3-MoE,
Mixtral, GPT-OSS, DeepSeek-V3-style), an explicit ``head_dim`` and sliding-window ``layer_types`` are read by
:mod:`sosim.formats.hf_moe`; multi-head latent attention and expert parallelism are errors, not approximations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sosim.formats import hf_moe
from sosim.formats.hf_reader import _Reader
from sosim.formats.jsonio import Note, read_json
from sosim.inputs.config import ModelSpec
from sosim.inputs.errors import ConfigError
from sosim.run.loader import KeyPath, Located

GATED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "seed_oss", *hf_moe.MOE_TYPES)
GELU_TYPES = ("gpt2", "gpt_neox")
_GATED_ACTS = ("silu", "swish")
_UNGATED_ACTS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "relu", "quick_gelu")
# tie_word_embeddings when the file does not say: each class's own default in transformers
# (LlamaConfig/MistralConfig/Qwen2Config/Qwen3Config/GPTNeoXConfig: False; GPT2Config and the base
# PretrainedConfig: True).
_TIE_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "gpt_neox": False, "gpt2": True,
                # SeedOssConfig, Qwen3MoeConfig, Qwen2MoeConfig, OlmoeConfig, MixtralConfig, GptOssConfig,
                # DeepseekV2/V3Config, Glm4MoeConfig, Dots1Config: False.
                "seed_oss": False, **dict.fromkeys(hf_moe.MOE_TYPES, False)}
# Keys read into the model; everything else in the file is listed as ignored (tokenizer ids, rope and norm
# constants, dtype...) because it does not change parameter counts or FLOPs.
_READ_KEYS = {
    "model_type", "architectures", "_name_or_path", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings", "hidden_act", "head_dim",
    "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "n_positions",
    "sliding_window", "use_sliding_window", "attention_bias", "mlp_bias",
}


@dataclass
class HfModel:
    """The scenario's ``model:`` dict, how each key was read, and the context window (for a --seq check)."""

    model: dict[str, Any]
    notes: list[Note] = field(default_factory=list)
    max_positions: int | None = None
    sliding_window: int | None = None
    origin: str = ""


def _family(r: _Reader) -> tuple[str, str]:
    """(family, how it was decided): family is 'gated', 'gpt2' or 'neox'."""
    model_type = r.data.get("model_type")
    if model_type in GATED_TYPES:
        return "gated", f"model_type {model_type}"
    if model_type == "gpt2":
        return "gpt2", "model_type gpt2"
    if model_type == "gpt_neox":
        return "neox", "model_type gpt_neox"
    if "n_embd" in r.data:
        return "gpt2", f"model_type {model_type!r} is not one sosim knows; GPT-2 keys (n_embd) present"
    act = r.data.get("hidden_act")
    known = f"model_type {model_type!r} is not one sosim knows ({', '.join(GATED_TYPES + GELU_TYPES)})"
    if act in _GATED_ACTS:
        return "gated", f"{known}; hidden_act {act} -> gated SwiGLU MLP (Llama-style)"
    if act in _UNGATED_ACTS:
        return "neox", f"{known}; hidden_act {act} -> ungated MLP with biases (GPT-NeoX-style)"
    r.error("model_type", f"{known} and hidden_act {act!r} does not say whether the MLP is gated "
            "(silu/swish: Llama-style; gelu/relu: GPT-style)")
    return "gated", known


def model_from_hf(loc: Located, name: str = "") -> HfModel:
    """Map a parsed ``config.json`` to the scenario ``model:`` section; every problem at once, with lines."""
    if not isinstance(loc.data, dict):
        raise ConfigError([f"{loc.origin}:1: a Hugging Face config.json must be a JSON object"])
    prefix: KeyPath = ()
    data = loc.data
    if "text_config" in data and isinstance(data["text_config"], dict) and not (
        {"hidden_size", "n_embd"} & set(data)
    ):
        prefix = ("text_config",)  # multimodal wrappers keep the language model's shape here
    r = _Reader(loc, prefix)
    if prefix:
        r.notes.append(Note("mapped", "text_config", loc.where(prefix), None, "model",
                            reason="multimodal config: the language model's text_config is read"))
    family, how = _family(r)
    model: dict[str, Any] = {}
    if family == "gpt2":
        hidden = r.pos_int("n_embd", "hidden")
        layers = r.pos_int("n_layer", "layers")
        heads = r.pos_int("n_head", "heads")
        if r.data.get("n_inner") is None:
            ffn = 4 * hidden if hidden else None
            r.defaulted("n_inner", "ffn", ffn, "null or absent: GPT-2 uses 4 x n_embd")
        else:
            ffn = r.pos_int("n_inner", "ffn")
        act_key = "activation_function"
        kv_heads = heads
        ffn_kind = "gelu"
    else:
        hidden = r.pos_int("hidden_size", "hidden")
        layers = r.pos_int("num_hidden_layers", "layers")
        heads = r.pos_int("num_attention_heads", "heads")
        if r.data.get("num_key_value_heads") is None:
            kv_heads = heads
            r.defaulted("num_key_value_heads", "kv_heads", heads,
                        "absent: equal to num_attention_heads (multi-head attention), as transformers does")
        else:
            kv_heads = r.pos_int("num_key_value_heads", "kv_heads")
        ffn = r.pos_int("intermediate_size", "ffn")
        act_key = "hidden_act"
        ffn_kind = "swiglu" if family == "gated" else "gelu"
    vocab = r.pos_int("vocab_size", "vocab")
    act = r.data.get(act_key)
    if act is not None:
        r.notes.append(Note("mapped", r.dotted(act_key), r.where(act_key), act, "model.ffn_kind", ffn_kind,
                            reason=how))
    else:
        r.defaulted(act_key, "ffn_kind", ffn_kind, how)
    model_type = str(r.data.get("model_type", ""))
    if "tie_word_embeddings" in r.data:
        tied = r.data["tie_word_embeddings"]
        if not isinstance(tied, bool):
            r.error("tie_word_embeddings", f"expected true or false, got {tied!r}")
            tied = False
        r.notes.append(Note("mapped", r.dotted("tie_word_embeddings"), r.where("tie_word_embeddings"), tied,
                            "model.tied_embeddings", tied))
    else:
        tied = _TIE_DEFAULT.get(model_type, True)
        r.defaulted("tie_word_embeddings", "tied_embeddings", tied,
                    f"absent: the {model_type or 'PretrainedConfig'} default in transformers")
    extra: dict[str, Any] = {}
    if family == "gated":
        extra.update(hf_moe.read_attention(r, model_type, hidden, heads, layers))
        extra.update(hf_moe.read_moe(r, model_type, layers, ffn))
    elif any(r.data.get(k) for k in hf_moe.EXPERT_COUNT_KEYS):
        key = next(k for k in hf_moe.EXPERT_COUNT_KEYS if r.data.get(k))
        r.error(key, "mixture-of-experts layers are modelled with gated (SwiGLU) experts only")
    if family == "gated":
        biases = [k for k in ("attention_bias", "mlp_bias") if r.data.get(k) is True]
        if model_type == "qwen2":
            r.notes.append(Note("ignored", "q/k/v biases", loc.origin, True,
                                reason="Qwen2 adds biases to q, k, v; sosim's SwiGLU layer counts none "
                                       "(under 0.1% of the parameters)"))
        for k in biases:
            r.ignored(k, "sosim's SwiGLU layer has no biases (a fraction of a percent of the parameters)")
    max_positions = r.data.get("max_position_embeddings", r.data.get("n_positions"))
    for k in ("max_position_embeddings", "n_positions"):
        if k in r.data:
            r.ignored(k, "the model's context window, not the training sequence (--seq sets training.seq_len)")
    sliding = r.data.get("sliding_window")
    use_sliding = r.data.get("use_sliding_window", model_type == "mistral")
    sliding_window = sliding if isinstance(sliding, int) and use_sliding else None
    if "sliding_layers" in extra:
        sliding_window = None  # modelled (sosim/hardware/model.py causal_attention_fraction), not a caveat
    for k in ("sliding_window", "use_sliding_window"):
        if k in r.data and "sliding_layers" not in extra:
            r.ignored(k, "sosim models full causal attention; a sliding window only changes attention FLOPs "
                      "when the sequence is longer than the window (checked against --seq)")
    if "model_type" in r.data:
        r.notes.append(Note("mapped", r.dotted("model_type"), r.where("model_type"), r.data["model_type"],
                            "model.ffn_kind", ffn_kind, reason=how))
    rest = sorted(k for k in r.data if k not in _READ_KEYS and k not in hf_moe.READ_KEYS and k != "text_config")
    if rest:
        r.notes.append(Note("ignored", ", ".join(rest), loc.origin, None,
                            reason="no effect on parameter counts or FLOPs (tokens, rope/norm constants, dtype, ...)"))
    if r.problems:
        raise ConfigError(r.problems)
    assert hidden and layers and heads and vocab and ffn and kv_heads  # guaranteed by the checks above
    model = {"name": name or _model_name(loc, r.data), "layers": layers, "hidden": hidden, "heads": heads,
             "kv_heads": kv_heads, "ffn": ffn, "ffn_kind": ffn_kind, "vocab": vocab, "tied_embeddings": tied,
             **extra}
    try:
        ModelSpec.model_validate(model)
    except ValidationError as exc:
        msgs = [e["msg"].removeprefix("Value error, ") for e in exc.errors()]
        raise ConfigError([f"{loc.where(prefix)}: {m} (from the config's head and width keys)" for m in msgs]) from None
    return HfModel(model=model, notes=r.notes, max_positions=max_positions if isinstance(max_positions, int) else None,
                   sliding_window=sliding_window, origin=loc.origin)


def _model_name(loc: Located, data: dict[str, Any]) -> str:
    named = data.get("_name_or_path")
    if isinstance(named, str) and named:
        return named.rstrip("/").split("/")[-1]
    path = Path(loc.origin)
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def resolve_model_path(ref: str | Path) -> Path:
    """A config.json file, or a model folder holding one (a Hugging Face snapshot)."""
    p = Path(ref)
    if p.is_dir():
        return p / "config.json"
    return p


def load_hf_model(ref: str | Path, name: str = "") -> HfModel:
    """Read a local ``config.json`` (or a folder holding one); no network."""
    return model_from_hf(read_json(resolve_model_path(ref)), name)
