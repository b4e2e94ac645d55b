"""Model families beside calibrate/llama.py for scripts/ds_train_step.py: GPT-2 and a Qwen3-MoE-shaped MoE.

GPT-2 family (issue 21 item 2): the paper's layers, not Llama's. Per layer: ln_1 and ln_2 (LayerNorm with bias),
c_attn (fused q/k/v Linear with bias), attn c_proj, mlp c_fc (4h unless given) and mlp c_proj (all with bias),
GELU (tanh, as GPT-2); a learned positional embedding. 12 parameter tensors in 6 parameter-holding modules per
layer (Llama here: 9 in 9), 9 modules per layer in all (block, attn, mlp containers included; Llama: 12), the
counts DeepSpeed stage 3's hooks (per module) and fetches (per parameter) follow. Why nn.Linear and not
Hugging Face's Conv1D: the same parameters and FLOPs, and no download or transformers version needed. The
output head is untied from the token embedding, as llama.py's: exact parameter counts, and no parameter shared
between two ZeRO-3 modules.

MoE family (issue 22 item 2): transformers' Qwen3MoeForCausalLM built from a Qwen3MoeConfig (no download) when
it builds on this machine; otherwise this module's own Qwen3-MoE-shaped decoder (router Linear, softmax top-k,
renormalised, an experts loop of SwiGLU experts). :func:`build_moe` says which it used (column moe_impl).

Imports torch at import time; no relative imports (scripts load it as a top-level module).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPT2Shape:
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    positions: int

    @property
    def kv_heads(self) -> int:
        return self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        h = self.hidden
        attention = 3 * h * h + 3 * h + h * h + h
        mlp = 2 * h * self.ffn + self.ffn + h
        return attention + mlp + 4 * h  # two LayerNorms, weight and bias

    def params_count(self) -> int:
        h = self.hidden
        return self.layers * self.layer_params() + self.vocab * h + self.positions * h + 2 * h + self.vocab * h

    def as_dict(self) -> dict[str, int]:
        return asdict(self) | {"head_dim": self.head_dim, "kv_heads": self.heads, "params": self.params_count()}


class GPT2Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(hidden, 3 * hidden, bias=True)
        self.c_proj = nn.Linear(hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.c_attn(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class GPT2MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, ffn, bias=True)
        self.c_proj = nn.Linear(ffn, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = GPT2Attention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = GPT2MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """Pre-LN GPT-2 LM returning the mean cross-entropy loss; optional per-block activation checkpointing."""

    def __init__(self, shape: GPT2Shape, checkpoint_layers: bool) -> None:
        super().__init__()
        self.shape = shape
        self.checkpoint_layers = checkpoint_layers
        self.wte = nn.Embedding(shape.vocab, shape.hidden)
        self.wpe = nn.Embedding(shape.positions, shape.hidden)
        self.blocks = nn.ModuleList(GPT2Block(shape.hidden, shape.heads, shape.ffn) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden, eps=1e-5)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            if self.checkpoint_layers and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def init_gpt2_(module: nn.Module, std: float = 0.02) -> None:
    """Random normal weights, zero biases, ones for LayerNorm weights (GPT-2's initialisation, unscaled)."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif ".ln_" in f".{name}" and name.endswith("weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std)


# ---------------------------------------------------------------------------------------------- MoE


@dataclass(frozen=True)
class MoEShape:
    """Qwen3-MoE-shaped: every layer sparse (decoder_sparse_step 1), no shared expert; ffn = the expert width."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    experts: int
    top_k: int
    ffn: int
    vocab: int
    head_dim: int = 0  # 0: hidden / heads; Qwen3-30B-A3B has 128 with hidden 2048 and 32 heads

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def layer_params(self) -> int:
        h, q_dim, kv_dim = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * h * q_dim + 2 * h * kv_dim + 2 * self.head_dim  # q, o, k, v and Qwen3's q/k norms
        return attention + self.experts * 3 * h * self.ffn + self.experts * h + 2 * h

    def params_count(self) -> int:
        """Exact for the own implementation; the Hugging Face model's count is taken from the built model."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden + self.hidden

    def as_dict(self) -> dict[str, int]:
        return asdict(self) | {"params": self.params_count()}


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM behind the harness's forward(tokens, labels) -> loss."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=tokens, labels=labels, use_cache=False).loss


def hf_qwen3_moe(shape: MoEShape, seq: int, checkpoint_layers: bool) -> tuple[nn.Module, str]:
    """transformers' Qwen3MoeForCausalLM of ``shape`` with random weights; raises if this transformers lacks it."""
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn * shape.top_k,  # unused (every layer sparse); 6144 for moe-needs.md's shapes
        moe_intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        num_experts=shape.experts,
        num_experts_per_tok=shape.top_k,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=False,
        max_position_embeddings=max(seq, 4096),
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="sdpa",
    )
    config._attn_implementation = "sdpa"
    inner = Qwen3MoeForCausalLM(config)
    if checkpoint_layers:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    experts_impl = getattr(config, "_experts_implementation", None) or getattr(config, "experts_implementation", "")
    tag = f"hf-qwen3moe-transformers{transformers.__version__}"
    return HFCausalLM(inner), tag + (f"-experts:{experts_impl}" if experts_impl else "")


class OwnAttention(nn.Module):
    """GQA attention with Qwen3's per-head RMS q/k norms; no RoPE (its cost is negligible here and not timed)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.heads, -1)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.kv_heads, -1)).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, -1).transpose(1, 2)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class Expert(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """Qwen3MoeSparseMoeBlock's routing (softmax, top-k, renormalised) over an experts loop."""

    def __init__(self, hidden: int, experts: int, top_k: int, ffn: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights = F.softmax(self.gate(flat).float(), dim=-1)
        top_w, top_i = torch.topk(weights, self.top_k, dim=-1)
        top_w = (top_w / top_w.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            # Why every expert runs even when no token picked it: ZeRO-3 fetches every expert module the forward
            # visits, and a data-dependent skip would change the hook count from step to step.
            token, slot = torch.where(top_i == index)
            out.index_add_(0, token, expert(flat[token]) * top_w[token, slot, None])
        return out.view(shape)


class OwnMoELayer(nn.Module):
    def __init__(self, shape: MoEShape) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(shape.hidden, eps=1e-6)
        self.self_attn = OwnAttention(shape.hidden, shape.heads, shape.kv_heads, shape.head_dim)
        self.post_attention_layernorm = nn.RMSNorm(shape.hidden, eps=1e-6)
        self.mlp = SparseMoE(shape.hidden, shape.experts, shape.top_k, shape.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class OwnMoEModel(nn.Module):
    def __init__(self, shape: MoEShape, checkpoint_layers: bool) -> None:
        super().__init__()
        self.checkpoint_layers = checkpoint_layers
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(OwnMoELayer(shape) for _ in range(shape.layers))
        self.norm = nn.RMSNorm(shape.hidden, eps=1e-6)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            if self.checkpoint_layers and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def build_moe(shape: MoEShape, seq: int, checkpoint_layers: bool, impl: str = "auto") -> tuple[nn.Module, str, str]:
    """(model, moe_impl, why the fallback was taken or ''). ``impl``: auto (HF, else own), hf, own."""
    if impl in ("auto", "hf"):
        try:
            model, tag = hf_qwen3_moe(shape, seq, checkpoint_layers)
            return model, tag, ""
        except Exception as error:  # an older transformers, or a config key renamed: fall back, say why
            if impl == "hf":
                raise
            why = f"{type(error).__name__}: {error}"[:200]
    else:
        why = "own implementation requested"
    return OwnMoEModel(shape, checkpoint_layers), "own-experts-loop", why


def init_moe_(module: nn.Module, std: float = 0.02) -> None:
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif param.dim() >= 1:
                param.normal_(0.0, std)


def model_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def gelu_ffn(hidden: int) -> int:
    """GPT-2's MLP width: 4 x hidden."""
    return 4 * hidden
