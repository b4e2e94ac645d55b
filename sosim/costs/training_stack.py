"""The training stack as a scenario input (issue 16 item 2): which framework code runs the layers.

sosim's layer costs are the lent H200's eager PyTorch layers (``sosim/calibrate/llama.py``: RMSNorm, RoPE,
SwiGLU as separate kernels, attention through SDPA's flash backend, every token of every sample real). A
stack is named here only where its code does different *work* from that, with the reason beside it:

* ``eager`` (default): what was timed.
* ``hf_fa2_padded``: Hugging Face transformers with ``attn_implementation="flash_attention_2"`` on batches
  padded to ``seq_len`` (DeepSpeedExamples ``training/DeepSpeed-SuperOffload/finetune_zero3.py``: the
  argument's default ``flash_attention_2``; the tokenizer pads every example to ``max_length``, and the
  collator passes the attention mask). With a padding mask Hugging Face unpads q/k/v and calls
  ``flash_attn_varlen_func`` on the real tokens only (``modeling_flash_attention_utils.py``, ``_upad_input``),
  so each sample's attention is causal over its ``real_tokens_per_sample`` tokens; every other kernel (the
  GEMMs, norms, the loss over the vocabulary) still runs on all ``seq_len`` padded tokens. The rest of the
  stack is the timed kind (eager modules, no fused kernels, no torch.compile, FlashAttention-2 is SDPA's
  flash backend too), so no other cost changes.

What the TFLOPS of such a run count is a convention (DeepSpeedExamples counts full attention over seq_len),
unchanged here: only the time moves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from sosim.inputs.config import TrainingSpec

Stack = Literal["eager", "hf_fa2_padded"]


def attention_work_fraction(t: TrainingSpec) -> float:
    """Attention work of one sample relative to causal attention over all ``seq_len`` tokens: 1 for the timed
    stack; (real / seq_len)^2 when FlashAttention-2 runs varlen over the real tokens only (causal work grows with
    the square of the sequence). The varlen kernel's efficiency at a few hundred tokens is lower than at 4096
    (smaller tiles); at ~100 real tokens of 4096 the attention is 0.06% of its padded cost, so even a several
    times lower efficiency leaves it negligible: not modelled."""
    if t.stack == "eager" or t.real_tokens_per_sample is None:
        return 1.0
    return min(1.0, t.real_tokens_per_sample / t.seq_len) ** 2


def uses_timed_layers(t: TrainingSpec) -> bool:
    """Whether whole-layer rows a calibration table measured (the eager stack) apply as they are."""
    return attention_work_fraction(t) == 1.0
