"""Transformer arithmetic against published parameter counts and the FLOP formulas."""

from __future__ import annotations

import pytest

from sosim.hardware import model as tm
from sosim.inputs.config import ModelSpec, TrainingSpec


def test_gpt2_small_parameter_count() -> None:
    # GPT-2 small: 124,439,808 params with tied embeddings and 1024 learned positions (786,432), which
    # sosim does not model (rotary/ALiBi-era models have none).
    m = ModelSpec(layers=12, hidden=768, heads=12, ffn_kind="gelu", vocab=50257, tied_embeddings=True)
    assert tm.total_params(m) == 124_439_808 - 1024 * 768


def test_llama2_7b_parameter_count() -> None:
    m = ModelSpec(layers=32, hidden=4096, heads=32, ffn=11008, ffn_kind="swiglu", vocab=32000)
    assert tm.total_params(m) == 6_738_415_616


def test_llama3_8b_gqa_parameter_count() -> None:
    m = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, ffn_kind="swiglu", vocab=128256)
    assert tm.total_params(m) == 8_030_261_248


def test_model_flops_formula_and_recompute() -> None:
    m = ModelSpec(layers=2, hidden=64, heads=4, vocab=100)
    t = TrainingSpec(seq_len=16, micro_batch=1, activation_checkpointing=False)
    # The untied input-embedding table is a lookup: it does no FLOPs and is not counted.
    n = tm.total_params(m) - (0 if m.tied_embeddings else 100 * 64)
    assert tm.flop_params(m) == n
    # Causal attention: 6*L*h*s per token (half of the full-matrix 12*L*h*s, which causal=False gives).
    assert tm.model_flops_per_step(m, t, 16) == 6 * n * 16 + 6 * 2 * 64 * 16 * 16
    assert tm.model_flops_per_step(m, t, 16, causal=False) == 6 * n * 16 + 12 * 2 * 64 * 16 * 16
    assert tm.hardware_flops_per_step(m, t, 16) == tm.model_flops_per_step(m, t, 16)
    tc = t.model_copy(update={"activation_checkpointing": True})
    extra = 2 * (2 * 16 * tm.layer_params(m) + 2 * 16 * 16 * 64)
    assert tm.hardware_flops_per_step(m, tc, 16) == pytest.approx(tm.model_flops_per_step(m, tc, 16) + extra)


def test_activation_memory_gpt_layer_matches_korthikanti() -> None:
    # 34*h bytes per token for a 4h-MLP GPT layer, without the 5*a*s/h term (flash attention).
    m = ModelSpec(layers=1, hidden=1024, heads=16)
    assert tm.activation_bytes_per_token_layer(m) == 34 * 1024


def test_checkpointing_reduces_activation_memory() -> None:
    m = ModelSpec(layers=24, hidden=2048, heads=16, vocab=1000)
    t = TrainingSpec(seq_len=2048, micro_batch=4, activation_checkpointing=False)
    full = tm.activation_bytes_peak(m, t)
    ckpt = tm.activation_bytes_peak(m, t.model_copy(update={"activation_checkpointing": True}))
    assert ckpt < full / 5
