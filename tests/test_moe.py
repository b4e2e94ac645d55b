"""Mixture-of-experts models (issue 22): arithmetic by hand, the published configs' parameter counts, invariants."""

from __future__ import annotations

from pathlib import Path

import pytest

from sosim.answers.maxsize import find_max_size, fits
from sosim.formats.hf_model import load_hf_model
from sosim.hardware import model as tm
from sosim.hardware import moe
from sosim.inputs.config import ModelSpec, TrainingSpec
from sosim.run.loader import load_scenario

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "scenarios" / "models"
# hidden 64, 4 heads x head_dim 32 (attention width 128), 2 KV heads, 4 experts of width 16, top-2.
TINY = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=48, ffn_kind="swiglu",
                 vocab=100, experts=4, experts_per_token=2, expert_ffn=16)


def test_tiny_moe_counts_by_hand() -> None:
    # attention: q 64x128, k and v 64x64 each, o 128x64, two RMSNorms: 16384 + 8192 + 128 = 24704
    assert tm.attention_params(TINY) == 24_704
    # router 64x4 = 256; every expert 3 x 64 x 16 = 3072, four of them = 12288
    assert tm.layer_params(TINY) == 24_704 + 256 + 12_288
    assert tm.layer_active_params(TINY) == 24_704 + 256 + 2 * 3072  # top-2 experts a token runs
    assert tm.total_params(TINY) == 2 * 37_248 + 2 * 100 * 64 + 64
    # FLOPs: 2 per active parameter per token + causal attention 4*s*(heads x head_dim) x 1/2.
    assert tm.layer_flops_fwd(TINY, 1024, 512) == 2.0 * 1024 * 31_104 + 4.0 * 1024 * 512 * 128 * 0.5
    # The experts' parameters, gradients and optimizer state count all four: the tensors hold every expert.
    sizes = tm.layer_tensor_sizes(TINY)
    assert sum(sizes) == tm.layer_params(TINY)
    assert sizes[-2:] == [4 * 2 * 16 * 64, 4 * 64 * 16]  # gate_up_proj and down_proj, 3-D in transformers 5.x


def test_dense_head_dim_consistent_is_bit_identical() -> None:
    base = ModelSpec(layers=4, hidden=2048, heads=16, kv_heads=4, ffn=5632, ffn_kind="swiglu", vocab=32000)
    same = base.model_copy(update={"head_dim": 128})
    t = TrainingSpec(seq_len=2048, micro_batch=4)
    for f in (tm.layer_params, tm.total_params, tm.activation_bytes_per_token_layer,
              tm.elementwise_bytes_fwd_per_token, tm.flop_params):
        assert f(same) == f(base)  # type: ignore[operator]
    assert tm.layer_flops_fwd(same, 8192, 2048) == tm.layer_flops_fwd(base, 8192, 2048)
    assert tm.model_flops_per_step(same, t, 8192) == tm.model_flops_per_step(base, t, 8192)
    assert tm.layer_tensor_sizes(same) == tm.layer_tensor_sizes(base)


def test_wide_attention_counts_heads_times_head_dim() -> None:
    # Qwen3-4B: hidden 2560, 32 heads x 128 = 4096
    m = ModelSpec(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, ffn=9728, ffn_kind="swiglu",
                  vocab=151936, tied_embeddings=True)
    assert m.q_dim == 4096 and m.kv_dim == 1024
    assert tm.layer_params(m) == 2560 * (4096 + 2048) + 4096 * 2560 + 3 * 2560 * 9728 + 2 * 2560
    assert tm.attention_flops_fwd(m, 10, 100) == 4.0 * 10 * 100 * 4096


@pytest.mark.parametrize(("folder", "total_b", "active_b"), [
    # OpenAI's model card: 20.9B total, 3.6B active (without the embedding lookup; biases not counted by sosim).
    ("gpt-oss-20b", 20.9, 3.6),
    # Qwen's model card: 30.5B total, 3.3B activated (its count includes the untied embedding).
    ("qwen3-30b-a3b", 30.5, 3.3 - 151936 * 2048 / 1e9),
    ("qwen3-14b", 14.8, None), ("seed-oss-36b", 36.2, None), ("llama-3-70b", 70.6, None),
])
def test_published_configs_match_model_cards(folder: str, total_b: float, active_b: float | None) -> None:
    m = ModelSpec.model_validate(load_hf_model(MODELS / folder).model)
    assert tm.total_params(m) / 1e9 == pytest.approx(total_b, abs=0.06)
    if active_b is not None:
        assert tm.active_flop_params(m) / 1e9 == pytest.approx(active_b, abs=0.06)


def test_routed_tokens_uniform_and_skewed() -> None:
    assert moe.expert_tokens(TINY, 100) == [50.0] * 4
    skewed = moe.expert_tokens(TINY.model_copy(update={"routing_skew": 3.0}), 100)
    assert sum(skewed) == pytest.approx(200.0) and max(skewed) <= 100.0 + 1e-9  # k distinct experts per token
    assert skewed == sorted(skewed, reverse=True)
    # grouped_mm pads each expert's rows to the 128-row tile
    assert moe.grouped_rows(TINY, 100) == 4 * 128
    # eager: one Python iteration (and one torch.where host sync) per expert hit, after the nonzero
    eager = TINY.model_copy(update={"experts_impl": "eager"})
    assert moe.eager_host_syncs_fwd(eager, 100) == 5 and moe.eager_host_syncs_fwd(TINY, 100) == 0


def test_sliding_window_fraction_by_hand() -> None:
    m = ModelSpec(layers=2, hidden=64, heads=4, ffn_kind="swiglu", sliding_window=2, sliding_layers=1)
    # s = 4, w = 2: the sliding layer's query i sees min(i, 2) keys: 1 + 2 + 2 + 2 = 7 of 16 pairs
    assert tm.causal_attention_fraction(m, 4) == pytest.approx((0.5 + 7 / 16) / 2)
    assert tm.causal_attention_fraction(m, 2) == 0.5  # shorter than the window: plain causal


def test_dense_first_layers_mean_layer_is_exact_in_total() -> None:
    m = TINY.model_copy(update={"layers": 4, "dense_layers": 1, "shared_experts": 1})
    m = ModelSpec.model_validate(m.model_dump())
    dense = tm.attention_params(m) + 3 * 64 * 48
    moe_layer = tm.attention_params(m) + 256 + 12_288 + 3 * 64 * 16
    assert abs(m.layers * tm.layer_params(m) - (dense + 3 * moe_layer)) <= 3 * m.layers  # per-tensor rounding
    assert sum(tm.layer_tensor_sizes(m)) == tm.layer_params(m)


@pytest.mark.parametrize(("bad", "message"), [
    ({"experts": 4}, "experts and experts_per_token go together"),
    ({"experts": 4, "experts_per_token": 5}, "cannot exceed experts"),
    ({"shared_experts": 1}, "set experts and experts_per_token too"),
    ({"experts": 4, "experts_per_token": 2, "dense_layers": 2}, "must leave at least one MoE layer"),
    ({"sliding_layers": 1}, "sliding_layers needs sliding_window"),
])
def test_scenario_model_keys_are_checked_with_their_location(tmp_path: Path, bad: dict[str, int],
                                                              message: str) -> None:
    from sosim.inputs.errors import ConfigError

    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn_kind": "swiglu", "vocab": 100, **bad}
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nhardware: gh200\nmodel: " + str(model).replace("'", "") + "\n"
                    "training: {seq_len: 128, micro_batch: 1}\nschedule: {system: superoffload}\n")
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert any(message in p and "s.yaml:" in p for p in err.value.problems), err.value.problems


def test_maxsize_grows_experts_until_memory_runs_out() -> None:
    sc = load_scenario(ROOT / "scenarios" / "gh200_superoffload_qwen3_moe_maxsize.yaml")
    found = find_max_size(sc, "experts")
    assert found.model.experts is not None and found.model.experts >= found.model.experts_per_token  # type: ignore[operator]
    assert fits(found.scenario).feasible and not found.next_fit.feasible
    bigger = found.scenario.model_copy(update={"model": found.model.model_copy(
        update={"experts": found.model.experts + 1})})  # type: ignore[operator]
    assert not fits(bigger).feasible


@pytest.mark.parametrize(("scenario", "folder"), [
    ("gh200_superoffload_deepspeed_gpt_oss_20b_blog", "gpt-oss-20b"),
    ("gh200x2_superoffload_deepspeed_qwen3_30b_a3b_blog", "qwen3-30b-a3b"),
    ("gh200x2_superoffload_deepspeed_seed_oss_36b_blog", "seed-oss-36b"),
    ("gh200x4_superoffload_deepspeed_llama3_70b_blog", "llama-3-70b"),
])
def test_blog_scenarios_hold_the_model_the_reader_makes_of_the_published_config(scenario: str, folder: str) -> None:
    sc = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml")
    read = ModelSpec.model_validate({**load_hf_model(MODELS / folder).model, "name": sc.model.name})
    assert sc.model == read
