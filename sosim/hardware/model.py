"""Transformer arithmetic for GPT- and Llama-style decoders: parameters, FLOPs, activation bytes.

Conventions (stated once, used everywhere):

* A GEMM of (m x k) @ (k x n) costs 2*m*n*k FLOPs.
* Attention score and value products: 4*s*h FLOPs per token per layer in the forward pass over the full
  s x s matrix (:func:`attention_flops_fwd`). A decoder is causal: its flash-attention kernels skip the
  masked half, so the FLOPs *counted* in the metrics are the causal half, 2*s*h per token per layer
  (:data:`CAUSAL_ATTENTION_FRACTION`), the same work the cost model times. Why: counting the full matrix
  credits the GPU with work it never does; at long sequences that alone pushed the 1M-token scenario to
  876 of 989 TF/s "hardware" FLOP/s (attention at 2 x its real rate), and MFU could pass 1.
  Megatron-LM's and the SuperOffload paper's formulas count the full matrix: their MFU at sequence s is
  ours x (6N + 12*L*h*s) / (6N + 6*L*h*s) (:func:`model_flops_per_step` with ``causal=False``).
* Backward = 2 x forward FLOPs. Activation checkpointing re-runs one forward per layer: it adds hardware
  FLOPs, not model FLOPs.
* Model FLOPs per step = 6*N*tokens + 6*L*h*s*tokens, N = the parameters that do FLOPs (all but an untied
  input-embedding table, :func:`flop_params`), attention causal (docs/model.md, "Metrics").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sosim.hardware import moe
from sosim.inputs.config import ModelSpec, Scenario, TrainingSpec
from sosim.inputs.units import BF16_BYTES

# Fraction of the full s x s attention work a causal (decoder) attention kernel performs, and counts.
CAUSAL_ATTENTION_FRACTION = 0.5


@dataclass(frozen=True)
class Gemm:
    """One weight GEMM of a layer: tokens x k_in @ k_in x n_out."""

    name: str
    k_in: int
    n_out: int

    def flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.k_in * self.n_out


def layer_gemms(m: ModelSpec) -> list[Gemm]:
    """The weight GEMMs of one decoder layer (forward) over all its tokens, in execution order. An MoE
    layer's routed experts run at their own token counts (:mod:`sosim.hardware.moe`): here only its
    attention, router and shared-expert GEMMs."""
    h = m.hidden
    q_dim, kv_dim = m.q_dim, m.kv_dim
    gemms = [Gemm("qkv", h, q_dim + 2 * kv_dim), Gemm("attn_out", q_dim, h)]
    if m.is_moe:
        gemms += [Gemm(name, k_in, n_out) for name, k_in, n_out in moe.token_gemm_shapes(m)]
    elif m.ffn_kind == "swiglu":
        gemms += [Gemm("mlp_gate_up", h, 2 * m.ffn_dim), Gemm("mlp_down", m.ffn_dim, h)]
    else:
        gemms += [Gemm("mlp_up", h, m.ffn_dim), Gemm("mlp_down", m.ffn_dim, h)]
    return gemms


@functools.lru_cache(maxsize=64)
def layer_params(m: ModelSpec) -> int:
    """Parameters of one decoder layer (weights, GPT-style biases, norm scales); an MoE model's mean layer
    counts every expert (:func:`sosim.hardware.moe.mlp_tensor_sizes`)."""
    if m.is_moe:
        return attention_params(m) + sum(moe.mlp_tensor_sizes(m))
    weights = sum(g.k_in * g.n_out for g in layer_gemms(m))
    if m.ffn_kind == "gelu":
        # GPT-2/Megatron: biases on every linear, two LayerNorms with scale and bias.
        biases = sum(g.n_out for g in layer_gemms(m))
        norms = 4 * m.hidden
    else:
        # Llama: no biases, two RMSNorm scales.
        biases = 0
        norms = 2 * m.hidden + _extra_attention_params(m)
    return weights + biases + norms


def _extra_attention_params(m: ModelSpec) -> int:
    """Qwen3's q_norm / k_norm scales and GPT-OSS's attention sinks (one logit per head)."""
    return (2 * m.attn_head_dim if m.qk_norm else 0) + (m.heads if m.attention_sinks else 0)


def attention_params(m: ModelSpec) -> int:
    """A SwiGLU layer's attention projections, its two RMSNorm scales and the extras (q/k norms, sinks)."""
    h = m.hidden
    return h * (m.q_dim + 2 * m.kv_dim) + m.q_dim * h + 2 * h + _extra_attention_params(m)


@functools.lru_cache(maxsize=64)
def layer_active_params(m: ModelSpec) -> float:
    """Parameters one token multiplies in the mean layer: all of a dense layer's; an MoE layer's attention,
    router, k routed and the shared experts."""
    if not m.is_moe:
        return layer_params(m)
    return attention_params(m) + moe.mlp_active_params_mean(m)


def embedding_params(m: ModelSpec) -> int:
    """Token embedding, final norm and (unless tied) the output projection."""
    emb = m.vocab * m.hidden
    head = 0 if m.tied_embeddings else m.vocab * m.hidden
    final_norm = 2 * m.hidden if m.ffn_kind == "gelu" else m.hidden
    return emb + head + final_norm


def total_params(m: ModelSpec) -> int:
    return m.layers * layer_params(m) + embedding_params(m)


def layer_tensor_sizes(m: ModelSpec) -> list[int]:
    """Elements of each parameter tensor of one decoder layer, in registration order.

    GPT (Megatron/GPT-2): LayerNorm scale+bias, fused QKV weight+bias, output weight+bias, LayerNorm,
    MLP up weight+bias, down weight+bias. Llama (Hugging Face): RMSNorm, q, k, v, o, RMSNorm, gate, up, down.
    The sizes add up to :func:`layer_params`. Here, with the model arithmetic, because the costs
    (measured per-tensor overheads, sosim/costs/offload_mechanisms.py) need them as much as the systems do.
    """
    h, f = m.hidden, m.ffn_dim
    kv = m.kv_dim
    if m.ffn_kind == "gelu":
        return [h, h, h * (h + 2 * kv), h + 2 * kv, h * h, h, h, h, h * f, f, f * h, h]
    q = m.q_dim
    extras = ([m.attn_head_dim] * 2 if m.qk_norm else []) + ([m.heads] if m.attention_sinks else [])
    if m.is_moe:  # router, the experts' two 3-D tensors, the shared expert (sosim/hardware/moe.py)
        return [h, h * q, h * kv, h * kv, q * h, *extras, h, *moe.mlp_tensor_sizes(m)]
    return [h, h * q, h * kv, h * kv, q * h, *extras, h, h * f, h * f, f * h]


def tokens_per_gpu(sc: Scenario) -> int:
    """Tokens of one micro-batch on one GPU; Ulysses sequence parallelism splits the sequence."""
    return sc.training.micro_batch * sc.training.seq_len // sc.cluster.sequence_parallel


def global_tokens_per_step(sc: Scenario) -> int:
    """Tokens of one optimizer step over all data-parallel ranks (micro-batches x accumulation x ranks)."""
    t = sc.training
    return t.micro_batch * t.seq_len * t.grad_accum * sc.cluster.dp


def layer_gemm_flops_fwd(m: ModelSpec, tokens: int) -> float:
    return sum(g.flops(tokens) for g in layer_gemms(m))


def attention_flops_fwd(m: ModelSpec, tokens: int, seq_len: int) -> float:
    """Score (QK^T) and value (PV) products, full s x s convention: 4*s*(heads x head_dim) per token."""
    return 4.0 * tokens * seq_len * m.q_dim


def causal_attention_fraction(m: ModelSpec, seq_len: int) -> float:
    """Fraction of the full s x s attention work the kernels do, mean over the layers: causal (1/2) for full
    layers; a sliding-window layer's query i attends to min(i, w) keys: (w*s - w*(w-1)/2) / s^2 when s > w."""
    if m.sliding_layers == 0 or m.sliding_window is None or seq_len <= m.sliding_window:
        return CAUSAL_ATTENTION_FRACTION
    w, s = m.sliding_window, seq_len
    sliding = (w * s - w * (w - 1) / 2) / (s * s)
    return (CAUSAL_ATTENTION_FRACTION * (m.layers - m.sliding_layers) + sliding * m.sliding_layers) / m.layers


def head_flops_fwd(m: ModelSpec, tokens: int) -> float:
    """Output projection to the vocabulary (the logits GEMM) and the final norm, 2 FLOPs per parameter per
    token like every other parameter of the 6N convention."""
    final_norm = 2 * m.hidden if m.ffn_kind == "gelu" else m.hidden
    return 2.0 * tokens * (m.hidden * m.vocab + final_norm)


def flop_params(m: ModelSpec) -> int:
    """Parameters that do FLOPs: every parameter except the input embedding table of an untied model.

    The input embedding is a lookup (no FLOPs); its matrix does FLOPs only as the logits GEMM when tied.
    Megatron's count (Narayanan et al., SC'21, https://arxiv.org/abs/2104.04473, eq. 3) likewise counts the
    logits GEMM once and no embedding lookup. Counting the untied table too would credit the GPU with work it
    never does, and a step at the peak would report more than the peak.
    """
    return total_params(m) - (0 if m.tied_embeddings else m.vocab * m.hidden)


def active_flop_params(m: ModelSpec) -> float:
    """:func:`flop_params` with an MoE model's inactive experts left out (what one token multiplies)."""
    if not m.is_moe:
        return flop_params(m)
    return flop_params(m) - m.layers * (layer_params(m) - layer_active_params(m))


def layer_flops_fwd(m: ModelSpec, tokens: int, seq_len: int) -> float:
    """One decoder layer's forward FLOPs as counted everywhere (metrics, ops, roofline): 2 per parameter per
    token (GEMM weights, biases, norm scales; an MoE layer's active ones) plus causal attention."""
    return (2.0 * tokens * layer_active_params(m)
            + attention_flops_fwd(m, tokens, seq_len) * causal_attention_fraction(m, seq_len))


def elementwise_bytes_fwd_per_token(m: ModelSpec) -> float:
    """HBM bytes moved by the memory-bound kernels of one layer's forward, per token.

    Counted for bf16: two norms (read+write h each), two residual adds (read 2h, write h), rotary or bias
    work on q/k (read+write), the MLP activation (gelu: read+write f; swiglu: read 2f, write f), softmax
    statistics are inside flash attention. Dropout is not modelled (LLM pre-training runs without it).
    """
    h, f = m.hidden, m.ffn_dim
    kv_dim = m.kv_dim
    act: float = 2 * f if m.ffn_kind == "gelu" else 3 * f
    if m.is_moe:  # the experts' activations and the token permutation (sosim/hardware/moe.py)
        act = moe.elementwise_elems_fwd_per_token_mlp(m)
    elems = 2 * 2 * h + 2 * 3 * h + 2 * (m.q_dim + kv_dim) + act
    return float(elems * BF16_BYTES)


def model_flops_per_step(m: ModelSpec, t: TrainingSpec, global_tokens: int, causal: bool = True) -> float:
    """Model FLOPs: 6*N*tokens + 3 passes x attention (causal: 6*L*h*s*tokens; full: 12*L*h*s*tokens);
    N: the active parameters of an MoE model."""
    n = active_flop_params(m)
    attention = 3.0 * m.layers * attention_flops_fwd(m, global_tokens, t.seq_len)
    return 6.0 * n * global_tokens + attention * (causal_attention_fraction(m, t.seq_len) if causal else 1.0)


def hardware_flops_per_step(m: ModelSpec, t: TrainingSpec, global_tokens: int, causal: bool = True) -> float:
    """Model FLOPs plus the recomputed forward of every layer when activations are checkpointed."""
    base = model_flops_per_step(m, t, global_tokens, causal)
    if not t.activation_checkpointing:
        return base
    attention = attention_flops_fwd(m, global_tokens, t.seq_len) * (
        causal_attention_fraction(m, t.seq_len) if causal else 1.0)
    return base + m.layers * (2.0 * global_tokens * layer_active_params(m) + attention)


def deepspeed_convention_flops_per_step(m: ModelSpec, t: TrainingSpec, global_tokens: int) -> float:
    """FLOPs as DeepSpeed's examples and the ZeRO-Offload paper count them: per sample
    2*c*P*s + 4*c*L*h*s^2 with c = 4 when activations are checkpointed, else 3; P = all parameters (embedding
    table included), full (not causal) attention. Used only to compare with numbers published that way.
    An MoE model: its active parameters (the experts a token skips do no work in any convention).
    """
    c = 4.0 if t.activation_checkpointing else 3.0
    samples = global_tokens / t.seq_len
    p = total_params(m) if not m.is_moe else active_flop_params(m) + (0 if m.tied_embeddings else m.vocab * m.hidden)
    return samples * (2.0 * c * p * t.seq_len + 4.0 * c * m.layers * m.q_dim * t.seq_len**2)


def activation_bytes_per_token_layer(m: ModelSpec) -> float:
    """Bytes a layer keeps for backward per token without checkpointing (bf16, flash attention).

    Korthikanti et al. 2022 ("Reducing Activation Recomputation") count 34*h bytes per token for a GPT layer
    with a 4h MLP; flash attention removes their 5*a*s/h term. Generalised to any ffn width and GQA:
    attention 7h + 4*kv_dim (inputs of QKV, q, k, v, projection input, its dropout mask),
    MLP gelu 3h + 4f / swiglu 3h + 6f, norms 4h.
    """
    h, f = m.hidden, m.ffn_dim
    kv_dim = m.kv_dim
    # 2h (QKV input) + 2q (Q) + 4kv (K, V) + 2q (projection input) + h (its dropout mask) = 7h + 4kv at q = h.
    attention = 7 * h + 4 * kv_dim if m.head_dim is None else 3 * h + 4 * m.q_dim + 4 * kv_dim
    mlp: float = 3 * h + (4 * f if m.ffn_kind == "gelu" else 6 * f)
    if m.is_moe:  # routed token copies (sosim/hardware/moe.py)
        mlp = moe.activation_bytes_per_token_mlp(m)
    return float(attention + mlp + 4 * h)


def activation_bytes_peak(
    m: ModelSpec, t: TrainingSpec, layers_on_gpu: int | None = None, sequence_parallel: int = 1
) -> float:
    """Peak activation memory of one micro-batch on one GPU (bytes); Ulysses splits the tokens.

    With checkpointing: every layer's bf16 input (2h bytes per token) plus one layer's full activations
    during its recompute+backward. Without: every layer's full activations. Both add the logits (bf16
    logits + fp32 softmax/loss workspace: 6 bytes per token per vocabulary entry).
    """
    tokens = t.micro_batch * t.seq_len // sequence_parallel
    layers = m.layers if layers_on_gpu is None else layers_on_gpu
    full_layer = activation_bytes_per_token_layer(m) * tokens
    kept = layers * m.hidden * BF16_BYTES * tokens + full_layer if t.activation_checkpointing else layers * full_layer
    logit_tokens = tokens if t.loss_chunk_tokens is None else min(tokens, t.loss_chunk_tokens)
    logits = 6.0 * logit_tokens * m.vocab
    return kept + logits
