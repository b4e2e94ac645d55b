"""The training stack as a scenario input (sosim/costs/training_stack.py): Hugging Face FlashAttention-2 on padded
batches runs attention over the real tokens only; nothing else changes."""

from __future__ import annotations

import pytest
from helpers import tiny_scenario

from sosim import load_scenario
from sosim.costs.analytic import AnalyticCostModel
from sosim.costs.training_stack import attention_work_fraction, uses_timed_layers
from sosim.hardware.model import tokens_per_gpu
from sosim.inputs.errors import ConfigError


def _costs(**training: object) -> AnalyticCostModel:
    sc = load_scenario(tiny_scenario({"system": "zero3_offload"}, **training))
    return AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))


def test_eager_is_the_timed_stack() -> None:
    c = _costs()
    assert attention_work_fraction(c.training) == 1.0
    assert uses_timed_layers(c.training)


def test_padded_fa2_attends_over_the_real_tokens_only() -> None:
    eager = _costs()
    seq = eager.training.seq_len
    padded = _costs(stack="hf_fa2_padded", real_tokens_per_sample=seq // 4)
    # Causal work grows with the square of the sequence: a quarter of the tokens is 1/16 of the work.
    assert attention_work_fraction(padded.training) == pytest.approx(1 / 16)
    assert padded.attention_fwd_s() == pytest.approx(eager.attention_fwd_s() / 16)
    assert padded.attention_bwd_s() == pytest.approx(eager.attention_bwd_s() / 16)
    # The GEMMs and elementwise kernels still run on every padded token.
    assert padded._layer_parts_s[0] == eager._layer_parts_s[0]
    assert padded.elementwise_fwd_s() == eager.elementwise_fwd_s()
    assert not uses_timed_layers(padded.training)


def test_padded_stack_needs_its_real_tokens() -> None:
    with pytest.raises(ConfigError, match="real_tokens_per_sample"):
        load_scenario(tiny_scenario({"system": "zero3_offload"}, stack="hf_fa2_padded"))
    with pytest.raises(ConfigError, match="cannot exceed seq_len"):
        load_scenario(tiny_scenario({"system": "zero3_offload"}, stack="hf_fa2_padded", real_tokens_per_sample=10**6))
