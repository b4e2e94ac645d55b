"""A small Llama-style decoder written with plain torch (RMSNorm, RoPE, GQA attention via SDPA, SwiGLU).

Used by the layer benchmark and by scripts/ds_train_step.py. Why our own and not Hugging Face: the GPU
machine reaches no hub, and a few dozen lines make the shapes exact and the FLOP count obvious.
This module imports torch at import time on purpose; only torch-side code imports it, and it has no
relative imports so that scripts can load it as a top-level module too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaShape:
    """Model shape; params_count() is exact for this implementation (untied embeddings)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        kv_dim = self.kv_heads * self.head_dim
        attention = self.hidden * self.hidden * 2 + self.hidden * kv_dim * 2  # q, o, k, v
        mlp = 3 * self.hidden * self.ffn  # gate, up, down
        norms = 2 * self.hidden
        return attention + mlp + norms

    def params_count(self) -> int:
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden + self.hidden

    def as_dict(self) -> dict[str, int]:
        return asdict(self) | {"head_dim": self.head_dim, "params": self.params_count()}


def swiglu_ffn(hidden: int) -> int:
    """Llama's MLP width: 8/3 of hidden, rounded up to a multiple of 256 (4096 -> 11008)."""
    return int(math.ceil(8 * hidden / 3 / 256) * 256)


def default_kv_heads(heads: int) -> int:
    """GQA with 4 query heads per KV head, as in Llama-3-style models."""
    return max(1, heads // 4)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Why fp32 statistics: bf16 mean of squares loses too much precision, as in the reference model.
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotary_tables(
    seq: int, head_dim: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (seq, head_dim) for rotate-half RoPE."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (10000.0**exponents)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            # Expand K/V to all query heads as Hugging Face's Llama does (repeat_kv): keeps SDPA on its
            # flash kernel on every torch version; the copy is part of what a real model pays.
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, heads, kv_heads)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = SwiGLU(hidden, ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class LlamaModel(nn.Module):
    """Decoder-only LM returning the mean cross-entropy loss; optional per-layer activation checkpointing."""

    def __init__(self, shape: LlamaShape, checkpoint_layers: bool) -> None:
        super().__init__()
        self.shape = shape
        self.checkpoint_layers = checkpoint_layers
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(shape.hidden, shape.heads, shape.kv_heads, shape.ffn) for _ in range(shape.layers)
        )
        self.norm = RMSNorm(shape.hidden)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = rotary_tables(tokens.shape[1], self.shape.head_dim, x.device, x.dtype)
        for layer in self.layers:
            if self.checkpoint_layers and self.training:
                # Non-reentrant checkpointing: works with ZeRO-3's parameter hooks and recomputes one
                # forward per layer during backward (hardware FLOPs = 4x forward instead of 3x).
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def init_weights_(module: nn.Module, std: float = 0.02) -> None:
    """Random normal weights, ones for norms. Why random and not zeros: zeros can run faster than data."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std)
