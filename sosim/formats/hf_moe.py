"""The mixture-of-experts and attention-variant keys of a Hugging Face ``config.json`` -> ModelSpec keys.

Families (keys as ``transformers``' configuration classes name them):

* Qwen3-MoE / Qwen2-MoE / OLMoE (``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
  ``decoder_sparse_step``, ``mlp_only_layers``; Qwen2-MoE's ``shared_expert_intermediate_size``: one shared expert);
* Mixtral / GPT-OSS (``num_local_experts``, ``num_experts_per_tok`` or GPT-OSS's ``experts_per_token``; the expert
  width is ``intermediate_size``), GPT-OSS's attention sinks and ``layer_types`` (absent: alternating
  sliding/full, as ``GptOssConfig.__post_init__``);
* DeepSeek-V3-style (GLM-4.5, ...: ``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``,
  ``first_k_dense_replace``, ``moe_layer_freq``). DeepSeek's multi-head latent attention (``kv_lora_rank``) is a
  different attention and is refused by name; so is expert parallelism (``ep_size`` > 1).

``head_dim`` x heads != ``hidden_size`` becomes ``head_dim`` (Qwen3-4B, Gemma, GPT-OSS, Seed-OSS);
``layer_types`` with ``sliding_attention`` entries and a ``sliding_window`` become ``sliding_window`` /
``sliding_layers``. Biases (``attention_bias``, GPT-OSS's expert and router biases) stay uncounted: under 0.1% of
the parameters, and listed as ignored.
"""

from __future__ import annotations

from typing import Any

from sosim.formats.hf_reader import _Reader
from sosim.formats.jsonio import Note

# model_type -> the family whose keys it uses (and whose expert width key differs).
QWEN_MOE_TYPES = ("qwen3_moe", "qwen2_moe", "olmoe")
LOCAL_EXPERT_TYPES = ("mixtral", "gpt_oss")
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe", "dots1")
MOE_TYPES = QWEN_MOE_TYPES + LOCAL_EXPERT_TYPES + DEEPSEEK_TYPES
# Keys that say "this layer is a mixture of experts" whatever the model_type.
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token")
# Keys read here (hf_model.py lists everything else as ignored).
READ_KEYS = {
    *EXPERT_COUNT_KEYS, *TOPK_KEYS, "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size",
    "first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "moe_layer_freq", "layer_types",
    "norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "ep_size", "kv_lora_rank", "q_lora_rank",
    "swiglu_limit", "routed_scaling_factor", "n_group", "topk_group", "topk_method", "scoring_func",
    "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "aux_loss_alpha", "seq_aux", "router_jitter_noise",
    "num_nextn_predict_layers", "max_window_layers",
}
# Sparse blocks DeepSpeed 0.18/0.19 make ZeRO-3 leaf modules by default (deepspeed/runtime/zero/
# leaf_module_config.py DEFAULT_LEAF_MODULE_CLASSES: Mixtral, Qwen2-MoE, Qwen3-MoE).
ZERO3_LEAF_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
# Qwen3 (dense and MoE) normalises q and k per head (Qwen3Attention.q_norm / k_norm).
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
SINK_TYPES = ("gpt_oss",)


def _first(r: _Reader, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if r.data.get(k) is not None), None)


def _dense_layer_count(r: _Reader, layers: int) -> int:
    """Layers whose MLP is dense: DeepSeek's first_k_dense_replace (and moe_layer_freq), Qwen's mlp_only_layers
    and decoder_sparse_step (Qwen3MoeDecoderLayer: MoE when idx not in mlp_only_layers and (idx+1) % step == 0)."""
    if r.data.get("first_k_dense_replace") is not None or r.data.get("moe_layer_freq") is not None:
        first = r.data.get("first_k_dense_replace") or 0
        freq = r.data.get("moe_layer_freq") or 1
        for key, value in (("first_k_dense_replace", first), ("moe_layer_freq", freq)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "moe_layer_freq" else 0):
                r.error(key, f"expected a {'positive' if key == 'moe_layer_freq' else 'non-negative'} integer, "
                        f"got {value!r}")
                return 0
        # DeepseekV3DecoderLayer: MoE when idx >= first_k_dense_replace and idx % moe_layer_freq == 0.
        return sum(1 for i in range(layers) if not (i >= first and i % freq == 0))
    step = r.data.get("decoder_sparse_step", 1)
    only = r.data.get("mlp_only_layers") or []
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
        r.error("decoder_sparse_step", f"expected a positive integer, got {step!r}")
        return 0
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        r.error("mlp_only_layers", f"expected a list of layer indices, got {only!r}")
        return 0
    return sum(1 for i in range(layers) if i in only or (i + 1) % step != 0)


def read_moe(r: _Reader, model_type: str, layers: int | None, ffn: int | None) -> dict[str, Any]:
    """The MoE keys of ``r`` -> ModelSpec keys ({} for a dense model); problems go to ``r``."""
    count_key = _first(r, EXPERT_COUNT_KEYS)
    if count_key is None:
        return {}
    experts = r.pos_int(count_key, "experts")
    topk_key = _first(r, TOPK_KEYS)
    if topk_key is None:
        r.error(count_key, f"a mixture of experts needs its experts per token ({' or '.join(TOPK_KEYS)})")
        return {}
    topk = r.pos_int(topk_key, "experts_per_token")
    for key in ("kv_lora_rank", "q_lora_rank"):
        if r.data.get(key):
            r.error(key, "multi-head latent attention (DeepSeek-V2/V3 MLA) is not modelled by sosim: its "
                    "attention projections differ from the GQA layer sosim counts")
    ep = r.data.get("ep_size")
    if ep not in (None, 1):
        r.error("ep_size", f"expert parallelism ({ep} ranks) is out of sosim's scope (docs/scenarios.md, "
                "'Mixture of experts'): every rank holds every expert")
    out: dict[str, Any] = {"experts": experts, "experts_per_token": topk}
    if model_type in ZERO3_LEAF_TYPES:
        out["zero3_leaf_block"] = True
        r.notes.append(Note("mapped", r.dotted("model_type"), r.where("model_type"), model_type,
                            "model.zero3_leaf_block", True, reason="DeepSpeed's default ZeRO-3 leaf classes "
                            "(leaf_module_config.py) include this model's sparse MoE block: one hook and one "
                            "fetch per layer for router and experts"))
    if model_type in LOCAL_EXPERT_TYPES or (r.data.get("moe_intermediate_size") is None and ffn):
        out["expert_ffn"] = ffn  # Mixtral / GPT-OSS: intermediate_size is each expert's width
        r.notes.append(Note("mapped", r.dotted("intermediate_size"), r.where("intermediate_size"), ffn,
                            "model.expert_ffn", ffn, reason=f"{model_type or 'no moe_intermediate_size'}: "
                            "intermediate_size is each expert's width"))
    else:
        out["expert_ffn"] = r.pos_int("moe_intermediate_size", "expert_ffn")
    shared = r.data.get("n_shared_experts")
    if shared is not None:
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            r.error("n_shared_experts", f"expected a non-negative integer, got {shared!r}")
        elif shared:
            out["shared_experts"] = shared
            r.notes.append(Note("mapped", r.dotted("n_shared_experts"), r.where("n_shared_experts"), shared,
                                "model.shared_experts", shared))
    if r.data.get("shared_expert_intermediate_size"):
        out["shared_experts"] = 1
        out["shared_expert_ffn"] = r.pos_int("shared_expert_intermediate_size", "shared_expert_ffn")
    if layers:
        dense = _dense_layer_count(r, layers)
        if dense:
            out["dense_layers"] = dense
            r.notes.append(Note("mapped", "first_k_dense_replace / mlp_only_layers / decoder_sparse_step",
                                r.loc.origin, dense, "model.dense_layers", dense,
                                reason="layers with the dense intermediate_size MLP instead of experts"))
            if dense >= layers:
                r.error("num_hidden_layers", "no layer is a mixture of experts with these settings")
    for key in ("norm_topk_prob", "router_aux_loss_coef", "output_router_logits", "routed_scaling_factor",
                "swiglu_limit", "n_group", "topk_group", "topk_method", "scoring_func"):
        if key in r.data:
            r.ignored(key, "routing arithmetic: no effect on parameter counts, FLOPs or memory (the router's "
                      "loss, when on, is a few elementwise ops per token)")
    if model_type == "gpt_oss":
        r.notes.append(Note("ignored", "expert and router biases", r.loc.origin, True,
                            reason="GPT-OSS adds biases to its experts and router; sosim counts none "
                                   "(under 0.1% of the parameters)"))
    return out


def read_attention(r: _Reader, model_type: str, hidden: int | None, heads: int | None,
                   layers: int | None) -> dict[str, Any]:
    """head_dim, q/k norms, attention sinks and sliding-window layers -> ModelSpec keys."""
    out: dict[str, Any] = {}
    head_dim = r.data.get("head_dim")
    if head_dim is not None and hidden and heads:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            r.error("head_dim", f"expected a positive integer, got {head_dim!r}")
        elif head_dim * heads != hidden:
            out["head_dim"] = head_dim
            r.notes.append(Note("mapped", r.dotted("head_dim"), r.where("head_dim"), head_dim, "model.head_dim",
                                head_dim, reason=f"attention width {head_dim} x {heads} heads = {head_dim * heads} "
                                f"!= hidden_size {hidden}"))
        else:
            r.notes.append(Note("mapped", r.dotted("head_dim"), r.where("head_dim"), head_dim, "model.hidden",
                                hidden, reason="consistent with hidden_size / num_attention_heads"))
    if model_type in QK_NORM_TYPES:
        out["qk_norm"] = True
        r.notes.append(Note("mapped", r.dotted("model_type"), r.where("model_type"), model_type, "model.qk_norm",
                            True, reason="Qwen3 normalises q and k per head (q_norm, k_norm)"))
    if model_type in SINK_TYPES:
        out["attention_sinks"] = True
        r.notes.append(Note("mapped", r.dotted("model_type"), r.where("model_type"), model_type,
                            "model.attention_sinks", True, reason="GPT-OSS: one learned sink logit per head"))
    types = r.data.get("layer_types")
    if types is None and model_type == "gpt_oss" and layers:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        r.defaulted("layer_types", "sliding_layers", (layers + 1) // 2,
                    "absent: alternating sliding / full, as GptOssConfig.__post_init__")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            r.error("layer_types", f"expected a list of attention kinds, got {types!r}")
            return out
        if layers and len(types) != layers:
            r.error("layer_types", f"{len(types)} entries for {layers} layers (num_hidden_layers)")
            return out
        sliding = sum(1 for t in types if t == "sliding_attention")
        window = r.data.get("sliding_window")
        if sliding and isinstance(window, int) and not isinstance(window, bool) and window > 0:
            out["sliding_window"] = window
            out["sliding_layers"] = sliding
            r.notes.append(Note("mapped", r.dotted("layer_types"), r.where("layer_types"), f"{sliding} sliding",
                                "model.sliding_layers", sliding,
                                reason=f"{sliding} of {len(types)} layers attend to a {window}-token window"))
        elif sliding:
            key = "sliding_window" if "sliding_window" in r.data else "layer_types"
            r.error(key, f"layer_types names {sliding} sliding_attention layers but sliding_window is {window!r}")
    return out
