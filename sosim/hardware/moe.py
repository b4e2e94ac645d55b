"""Mixture-of-experts layer arithmetic: parameters, routed tokens, expert GEMMs, permutation traffic, host ops.

The layer as Hugging Face transformers 5.x runs Qwen3-MoE / Mixtral / GPT-OSS / DeepSeek-V3-style decoders
(``transformers/integrations/moe.py``, ``models/qwen3_moe/modeling_qwen3_moe.py``):

* a router ``gate``: Linear(hidden -> experts), softmax, top-k, renormalisation (``Qwen3MoeTopKRouter``);
* the experts as two 3-D parameters per layer, ``gate_up_proj`` (experts, 2 x expert_ffn, hidden) and
  ``down_proj`` (experts, hidden, expert_ffn) (``Qwen3MoeExperts``): two tensors for ZeRO-3's hooks and fetches,
  whatever the expert count;
* ``experts_implementation`` "grouped_mm" (the default, ``PreTrainedModel.get_correct_experts_implementation``):
  gather the k copies of every token, sort them by expert (two argsorts, three gathers), ``histc`` + ``cumsum``
  for the offsets, one ``grouped_mm`` per projection, the routing-weight multiply, the inverse gather and a sum
  over k; "eager": a Python loop over the experts hit, each a ``torch.where`` (a host sync), a gather, two
  Linears, the activation, the weight multiply and an ``index_add_``;
* shared experts (DeepSeek ``n_shared_experts``, Qwen2-MoE ``shared_expert``) as one dense SwiGLU every token runs;
* ``dense_layers`` (DeepSeek ``first_k_dense_replace``, Qwen ``mlp_only_layers`` / ``decoder_sparse_step``) with
  the dense ``ffn``. sosim's layers are all alike, so a model with both kinds is modelled as its mean layer
  (parameters, FLOPs and fetch sizes averaged over the layers; exact in total up to rounding).

Counting rules: parameters, gradients and optimizer state count every expert; FLOPs count the active ones
(top-k routed + shared + the router GEMM); activations count the routed token copies.
"""

from __future__ import annotations

import math

from sosim.inputs.config import ModelSpec

# Rows of one grouped-GEMM tile: the CUTLASS sm90 kernels behind torch._grouped_mm pad every expert's token
# group to a multiple of the tile's M (128 for bf16: aten/src/ATen/native/cuda/GroupMM.cu, tile 128 x 256 x 64).
# Estimate of the padding waste; the measured grouped-GEMM rows (calibration moe rows) replace it.
GROUPED_TILE_M = 128
# Host-side ops (PyTorch dispatches) of one layer's forward, counted from the transformers 5.x code:
# a Hugging Face Llama decoder layer: 2 RMSNorms x 6 ops, q/k/v/o Linears, rotary on q and k (~10), SDPA, the
# views/transposes that launch, 2 residual adds, gate/up/down, SiLU, multiply: ~40. The launch-bound floor of a
# layer (hardware ``layer_min_fwd_us``, measured on Llama layers) is taken per op from it.
LLAMA_LAYER_FWD_OPS = 40
# Qwen3's q_norm / k_norm: two more RMSNorms of 6 ops each.
QK_NORM_OPS = 12
# The router (Linear, softmax, topk, sum, divide, cast) and the grouped_mm experts body (arange/expand, gather,
# 2 argsort, 3 gathers, cast, histc, cumsum, 2 grouped_mm, chunk, SiLU, multiply, weight multiply, inverse gather,
# sum, cast, zeros_like): transformers/integrations/moe.py grouped_mm_experts_forward.
ROUTER_OPS = 6
GROUPED_EXPERTS_OPS = 20
# The eager loop: one_hot, permute, sum, greater, nonzero once; then per hit expert torch.where, gather, Linear,
# chunk, SiLU, multiply, Linear, weight index, multiply, cast, index_add_ (11 ops) and the host sync of where.
EAGER_SETUP_OPS = 6
EAGER_OPS_PER_EXPERT = 11
# A dense SwiGLU MLP (gate, up, SiLU, multiply, down) as the shared expert runs it.
SHARED_EXPERT_OPS = 5


def _zipf_shares(n: int, skew: float) -> list[float]:
    weights = [(e + 1) ** -skew for e in range(n)]
    total = sum(weights)
    return [w / total for w in weights]


def expert_tokens(m: ModelSpec, tokens: int) -> list[float]:
    """Routed tokens of each expert of one MoE layer for ``tokens`` tokens (they sum to tokens x top-k).

    Uniform routing (``routing_skew`` 0): tokens x k / experts each. Skewed: Zipf shares, capped at ``tokens``
    (a token picks k distinct experts), the excess spread over the others in proportion to their shares.
    """
    assert m.experts is not None and m.experts_per_token is not None
    routed = float(tokens * m.experts_per_token)
    if m.routing_skew == 0.0:
        return [routed / m.experts] * m.experts
    shares = _zipf_shares(m.experts, m.routing_skew)
    counts = [routed * s for s in shares]
    for _ in range(m.experts):  # water-filling: at most one pass per expert capped
        over = sum(max(0.0, c - tokens) for c in counts)
        if over <= 1e-9:
            break
        free = [s if c < tokens else 0.0 for c, s in zip(counts, shares, strict=True)]
        free_total = sum(free)
        counts = [min(c, float(tokens)) + over * f / free_total for c, f in zip(counts, free, strict=True)]
    return counts


def experts_hit(m: ModelSpec, tokens: int) -> int:
    """Experts with at least one token (the eager loop's iterations): all unless fewer tokens than experts."""
    return sum(1 for t in expert_tokens(m, tokens) if t >= 0.5)


def grouped_rows(m: ModelSpec, tokens: int) -> int:
    """Rows the grouped GEMM computes: every expert's token group padded to the tile (:data:`GROUPED_TILE_M`)."""
    return sum(GROUPED_TILE_M * math.ceil(t / GROUPED_TILE_M) for t in expert_tokens(m, tokens) if t >= 0.5)


# --- parameters -------------------------------------------------------------------------------------------
def dense_mlp_params(m: ModelSpec) -> int:
    return 3 * m.hidden * m.ffn_dim


def router_params(m: ModelSpec) -> int:
    assert m.experts is not None
    return m.hidden * m.experts


def shared_params(m: ModelSpec) -> int:
    return 3 * m.hidden * m.shared_expert_ffn_dim * m.shared_experts


def moe_mlp_params(m: ModelSpec) -> int:
    """Every parameter of one MoE layer's MLP: router, all experts, shared experts."""
    assert m.experts is not None
    return router_params(m) + m.experts * 3 * m.hidden * m.expert_ffn_dim + shared_params(m)


def moe_mlp_active_params(m: ModelSpec) -> int:
    """Parameters one token multiplies in an MoE layer's MLP: router, its k experts, the shared experts."""
    assert m.experts_per_token is not None
    return router_params(m) + m.experts_per_token * 3 * m.hidden * m.expert_ffn_dim + shared_params(m)


def _mean(m: ModelSpec, moe_value: float, dense_value: float) -> float:
    return (m.moe_layers * moe_value + m.dense_layers * dense_value) / m.layers


def _mean_int(m: ModelSpec, moe_value: int, dense_value: int) -> int:
    return round(_mean(m, moe_value, dense_value))


def mlp_tensor_sizes(m: ModelSpec) -> list[int]:
    """Elements of the MLP's parameter tensors of the mean layer, in registration order: router, experts'
    gate_up_proj and down_proj (3-D, transformers 5.x), the shared expert's gate, up, down. In a model with
    dense layers each is the mean over the layers (a dense layer's gate+up and down in the experts' place)."""
    h = m.hidden
    assert m.experts is not None
    fe, f = m.expert_ffn_dim, m.ffn_dim
    if m.expert_tensors == "per_expert":  # gate, up, down of every expert (a dense layer's in the first's place)
        sizes = [_mean_int(m, h * m.experts, 0)]
        for e in range(m.experts):
            first = e == 0
            sizes += [_mean_int(m, h * fe, h * f if first else 0), _mean_int(m, h * fe, h * f if first else 0),
                      _mean_int(m, fe * h, f * h if first else 0)]
    else:
        sizes = [_mean_int(m, h * m.experts, 0),
                 _mean_int(m, m.experts * 2 * fe * h, 2 * f * h),
                 _mean_int(m, m.experts * fe * h, f * h)]
    if m.shared_experts:
        fs = m.shared_expert_ffn_dim * m.shared_experts
        sizes += [_mean_int(m, h * fs, 0)] * 2 + [_mean_int(m, fs * h, 0)]
    return sizes


def mlp_active_params_mean(m: ModelSpec) -> float:
    """Active MLP parameters of the mean layer (what one token multiplies)."""
    return _mean(m, moe_mlp_active_params(m), dense_mlp_params(m))


def mlp_tensors(m: ModelSpec) -> int:
    """Parameter tensors of an MoE layer's MLP (hooks and fetches): router, 2 fused expert tensors (or 3 per
    expert), 3 shared."""
    assert m.experts is not None
    experts = 3 * m.experts if m.expert_tensors == "per_expert" else 2
    return 1 + experts + (3 if m.shared_experts else 0)


def hooked_mlp_modules(m: ModelSpec) -> int:
    """Modules with parameters that DeepSpeed's ZeRO-3 hooks (and fetches) in an MoE layer's MLP: one for a
    leaf block; else the router, the experts (one module when fused, three Linears each otherwise) and the
    shared expert's three Linears."""
    assert m.experts is not None
    if m.zero3_leaf_block:
        return 1
    experts = 3 * m.experts if m.expert_tensors == "per_expert" else 1
    return 1 + experts + (3 if m.shared_experts else 0)


def runtime_from_tag(tag: str) -> dict[str, str | bool]:
    """ModelSpec keys for how a measured MoE run held and ran its experts, from the step harness's ``moe_impl``
    column (scripts/ds_train_step.py): ``hf-qwen3moe-transformers<version>[-experts:<impl>]`` or
    ``own-experts-loop`` (a ModuleList of experts, every expert visited). {} when the tag says nothing."""
    if tag.startswith("own-experts-loop"):  # families.SparseMoE: not one of DeepSpeed's default leaf classes
        return {"experts_impl": "eager", "expert_tensors": "per_expert", "zero3_leaf_block": False}
    if not tag.startswith("hf-"):
        return {}
    version = tag.split("transformers", 1)[1].split("-", 1)[0] if "transformers" in tag else ""
    impl = tag.split("-experts:", 1)[1] if "-experts:" in tag else ""
    out: dict[str, str | bool] = {"experts_impl": "eager" if impl == "eager" else "grouped_mm"}
    if version[:1].isdigit() and int(version.split(".")[0]) < 5:  # transformers 4.x: ModuleList, eager loop
        out = {"experts_impl": "eager", "expert_tensors": "per_expert"}
    return out


# --- FLOPs and time drivers ---------------------------------------------------------------------------------
def routed_gemm_shapes(m: ModelSpec) -> tuple[tuple[int, int], tuple[int, int]]:
    """(k_in, n_out) of one expert's two GEMMs: gate_up (hidden -> 2 x expert_ffn), down (expert_ffn -> hidden)."""
    fe = m.expert_ffn_dim
    return (m.hidden, 2 * fe), (fe, m.hidden)


def token_gemm_shapes(m: ModelSpec) -> list[tuple[str, int, int]]:
    """(name, k_in, n_out) of the MoE MLP's GEMMs over every token: the router and the shared experts."""
    assert m.experts is not None
    shapes = [("router", m.hidden, m.experts)]
    if m.shared_experts:
        fs = m.shared_expert_ffn_dim * m.shared_experts
        shapes += [("shared_gate_up", m.hidden, 2 * fs), ("shared_down", fs, m.hidden)]
    return shapes


def activation_bytes_per_token_mlp(m: ModelSpec) -> float:
    """Bytes an MoE layer's MLP keeps for backward per token (bf16 unless noted), the dense formula's
    3h + 6f generalised: the MLP input and its norm (3h), the router's logits (bf16) and fp32 probabilities
    (6 B x experts), per routed copy its gathered input and, grouped_mm, the expert-sorted copy (2h each), the
    SwiGLU intermediates (6 x expert_ffn) and the expert output kept for the routing-weight multiply (2h);
    the shared experts as a dense SwiGLU (6 x width)."""
    assert m.experts is not None and m.experts_per_token is not None
    h = m.hidden
    copies = 2 if m.experts_impl == "grouped_mm" else 1
    routed = m.experts_per_token * (2 * h * copies + 6 * m.expert_ffn_dim + 2 * h)
    shared = 6 * m.shared_expert_ffn_dim * m.shared_experts
    moe = 3 * h + 6 * m.experts + routed + shared
    return _mean(m, moe, 3 * h + 6 * m.ffn_dim)


def elementwise_elems_fwd_per_token_mlp(m: ModelSpec) -> float:
    """Elements the MLP's activation kernels move per token in one forward, as the dense formula counts them
    (3f for a SwiGLU): per routed copy the experts' SwiGLU (3 x expert_ffn), the shared experts' (3 x width).
    The profile's elementwise traffic factor applies to these as to a dense layer's; the token permutation is
    :func:`permutation_elems_fwd_per_token`."""
    assert m.experts_per_token is not None
    moe = m.experts_per_token * 3 * m.expert_ffn_dim + 3 * m.shared_expert_ffn_dim * m.shared_experts
    return _mean(m, moe, 3 * m.ffn_dim)


def permutation_elems_fwd_per_token(m: ModelSpec) -> float:
    """Elements the router's softmax/top-k and the token permutation move per token in one forward (mean
    layer). grouped_mm: the k-fold gather (read + write h per copy), the sort gather (2h), the weight multiply
    (2h), the inverse gather (2h), the sum over k (read k x h, write h per token); eager: the gather (2h), the
    weight multiply (2h) and index_add_ (read the copy, read-modify-write the output: 3h) per copy. The router:
    read + write its fp32 logits (2 x 2 x experts bf16-sized elements). Each is one kernel moving exactly these
    bytes: no traffic factor (the dense factor, fitted on norms/rotary/activation chains, is not theirs)."""
    if not m.is_moe:
        return 0.0
    assert m.experts is not None and m.experts_per_token is not None
    h, k = m.hidden, m.experts_per_token
    grouped = k * 8 * h + k * h + h + 4 * m.experts
    return _mean(m, grouped if m.experts_impl == "grouped_mm" else k * 7 * h + 4 * m.experts, 0)


def host_ops_fwd(m: ModelSpec, tokens: int) -> float:
    """PyTorch ops one layer's forward dispatches (mean layer), for the launch-bound floor."""
    base = LLAMA_LAYER_FWD_OPS + (QK_NORM_OPS if m.qk_norm else 0)
    if not m.is_moe:
        return float(base)
    dense_mlp_ops = 5
    experts = (GROUPED_EXPERTS_OPS if m.experts_impl == "grouped_mm"
               else EAGER_SETUP_OPS + EAGER_OPS_PER_EXPERT * experts_hit(m, tokens))
    moe = base - dense_mlp_ops + ROUTER_OPS + experts + (SHARED_EXPERT_OPS if m.shared_experts else 0)
    return _mean(m, moe, base)


def eager_host_syncs_fwd(m: ModelSpec, tokens: int) -> float:
    """Host syncs of one layer's forward (mean layer): the eager loop's nonzero and one torch.where per hit
    expert; grouped_mm has none."""
    if not m.is_moe or m.experts_impl != "eager":
        return 0.0
    return _mean(m, 1 + experts_hit(m, tokens), 0)
