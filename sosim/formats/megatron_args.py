"""Megatron-LM's command-line arguments, the optimizer-offload subset: read into a scenario (``sosim run
--megatron-args args.txt`` or a quoted string) and written from one (``sosim tune`` for a
``megatron_offload`` winner), read back exactly.

Arguments (megatron/training/arguments.py; defaults are its defaults):

* model: ``--num-layers --hidden-size --num-attention-heads [--group-query-attention --num-query-groups]
  --ffn-hidden-size --swiglu --untie-embeddings-and-output-weights --vocab-size`` (padded to a multiple of
  ``--make-vocab-size-divisible-by``, 128, as ``_vocab_size_with_padding`` does); or ``--model config.json``;
* training: ``--seq-length --micro-batch-size --global-batch-size --bf16 --clip-grad`` (1.0),
  ``--recompute-granularity full`` (checkpointing; ``selective`` is read as none: it recomputes only the
  attention core, which flash attention does not keep), ``--tensor/pipeline/context-model-parallel-size``
  (must be 1);
* optimizer: ``--optimizer adam --use-distributed-optimizer --optimizer-cpu-offload
  --optimizer-offload-fraction F`` (1.0) ``--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer
  --no-pin-cpu-grads``; without ``--optimizer-cpu-offload`` the fraction is 0 (the optimizer on the GPU);
* ``--fine-grained-activation-offloading``: activation offload (with ``--recompute-granularity`` unset).

A file may hold the arguments over several lines (``\\`` continuations and ``#`` comments allowed). Any other
argument is ignored and listed. Problems are located ``file:line: --argument: message``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from sosim.formats.torchtitan import FrameworkMapping
from sosim.inputs.errors import ConfigError

FLAGS = {"--swiglu", "--untie-embeddings-and-output-weights", "--bf16", "--fp16", "--use-distributed-optimizer",
         "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer",
         "--no-pin-cpu-grads", "--fine-grained-activation-offloading", "--group-query-attention"}
VALUED = {"--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups", "--ffn-hidden-size",
          "--vocab-size", "--make-vocab-size-divisible-by", "--seq-length", "--micro-batch-size",
          "--global-batch-size", "--clip-grad", "--recompute-granularity", "--recompute-method",
          "--recompute-num-layers", "--optimizer", "--optimizer-offload-fraction", "--tensor-model-parallel-size",
          "--pipeline-model-parallel-size", "--context-parallel-size", "--normalization"}


def _tokens(text: str, origin: str) -> list[tuple[str, int]]:
    """(token, line) of an argument text; continuation backslashes and comments dropped."""
    out: list[tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines() or [""], 1):
        line = raw.rstrip()
        if line.endswith("\\"):
            line = line[:-1]
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ConfigError([f"{origin}:{number}: cannot split the arguments: {exc}"]) from None
        out += [(w, number) for w in words]
    return out


class _Args:
    def __init__(self, text: str, origin: str) -> None:
        self.origin = origin
        self.values: dict[str, tuple[str | None, int]] = {}
        self.problems: list[str] = []
        self.ignored: list[str] = []
        tokens = _tokens(text, origin)
        i = 0
        while i < len(tokens):
            word, line = tokens[i]
            name, _, inline = word.partition("=")
            if not name.startswith("--"):
                self.ignored.append(f"ignored {word!r} (line {line}: not an --argument)")
            elif name in FLAGS:
                self.values[name] = (None, line)
            elif name in VALUED:
                if inline:
                    self.values[name] = (inline, line)
                elif i + 1 < len(tokens) and not tokens[i + 1][0].startswith("--"):
                    i += 1
                    self.values[name] = (tokens[i][0], line)
                else:
                    self.problems.append(f"{origin}:{line}: {name}: needs a value")
            else:
                # An unknown argument's value (if any) is skipped with it.
                if not inline and i + 1 < len(tokens) and not tokens[i + 1][0].startswith("--"):
                    i += 1
                self.ignored.append(f"ignored {name} (no effect on the step sosim models)")
            i += 1

    def where(self, name: str) -> str:
        line = self.values.get(name, (None, 1))[1]
        return f"{self.origin}:{line}: {name}"

    def has(self, name: str) -> bool:
        return name in self.values

    def number(self, name: str, integer: bool, default: float | None, lo: float = 0.0,
               hi: float | None = None) -> Any:
        if name not in self.values:
            if default is None:
                self.problems.append(f"{self.origin}:1: {name}: required")
            return default
        text = self.values[name][0] or ""
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            self.problems.append(f"{self.where(name)}: expected {'an integer' if integer else 'a number'}, "
                                 f"got {text!r}")
            return default
        if value < lo or (hi is not None and value > hi) or (integer and value == 0 and lo > 0):
            self.problems.append(f"{self.where(name)}: {text} out of range")
            return default
        return value

    def text(self, name: str, default: str | None) -> str | None:
        return self.values[name][0] if name in self.values else default


def _ffn(a: _Args, hidden: int | None) -> int | None:
    """Megatron's default ``--ffn-hidden-size``: 4h, or int(4h x 2/3 / 64) x 64 with --swiglu (arguments.py)."""
    if hidden is None:
        return None
    return int(4 * hidden * 2 / 3 / 64) * 64 if a.has("--swiglu") else 4 * hidden


def read_megatron(text: str, origin: str, hardware: str, gpus: int | None,
                  model: dict[str, Any] | None) -> FrameworkMapping:
    a = _Args(text, origin)
    notes: list[str] = []
    if model is None:
        hidden = a.number("--hidden-size", True, None, 1)
        heads = a.number("--num-attention-heads", True, None, 1)
        kv = a.number("--num-query-groups", True, heads, 1) if a.has("--group-query-attention") else heads
        vocab = a.number("--vocab-size", True, None, 1)
        divisible = a.number("--make-vocab-size-divisible-by", True, 128, 1)
        padded = None if vocab is None else -(-vocab // divisible) * divisible
        if padded is not None and padded != vocab:
            notes.append(f"--vocab-size {vocab} padded to {padded} (multiple of {divisible}, as Megatron does)")
        model = {"name": "megatron-gpt", "layers": a.number("--num-layers", True, None, 1), "hidden": hidden,
                 "heads": heads, "kv_heads": kv, "ffn": a.number("--ffn-hidden-size", True, _ffn(a, hidden), 1),
                 "ffn_kind": "swiglu" if a.has("--swiglu") else "gelu", "vocab": padded,
                 "tied_embeddings": not a.has("--untie-embeddings-and-output-weights")}
    else:
        notes.append("model shape from --model (the arguments' model flags are not used for it)")
    for name in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"):
        if a.number(name, True, 1, 1) != 1:
            a.problems.append(f"{a.where(name)}: must be 1 (sosim models data parallelism only)")
    if a.has("--fp16") or not a.has("--bf16"):
        a.problems.append(f"{a.where('--bf16')}: sosim models --bf16 training (give --bf16)")
    recompute = a.text("--recompute-granularity", None)
    if recompute not in (None, "full", "selective"):
        a.problems.append(f"{a.where('--recompute-granularity')}: {recompute!r}: full or selective")
    if recompute == "selective":
        notes.append("--recompute-granularity selective read as no checkpointing (it recomputes the attention "
                     "core only, which flash attention does not keep)")
    if a.text("--optimizer", "adam") != "adam":
        a.problems.append(f"{a.where('--optimizer')}: sosim models --optimizer adam")
    offload = a.has("--optimizer-cpu-offload")
    if offload and not a.has("--use-precision-aware-optimizer"):
        a.problems.append(f"{a.where('--optimizer-cpu-offload')}: Megatron asserts that it is used with "
                          "--use-precision-aware-optimizer (megatron/training/arguments.py)")
    if offload and not a.has("--use-distributed-optimizer"):
        notes.append("--use-distributed-optimizer not given: modelled with it (Megatron's offload path)")
    fraction = a.number("--optimizer-offload-fraction", False, 1.0, 0.0, 1.0) if offload else 0.0
    act_offload = a.has("--fine-grained-activation-offloading")
    if act_offload and recompute == "full":
        a.problems.append(f"{a.where('--fine-grained-activation-offloading')}: offloads instead of recomputing; "
                          "drop --recompute-granularity full")
    micro = a.number("--micro-batch-size", True, 1, 1)
    n_gpus = gpus or 1
    global_batch = a.number("--global-batch-size", True, micro * n_gpus, 1)
    accum = 1
    if global_batch % (micro * n_gpus):
        a.problems.append(f"{a.where('--global-batch-size')}: {global_batch} is not a multiple of micro-batch x "
                          f"data parallel ({micro * n_gpus})")
    else:
        accum = global_batch // (micro * n_gpus)
    seq = a.number("--seq-length", True, None, 1)
    clip = a.number("--clip-grad", False, 1.0, 0.0)
    if not hardware:
        a.problems.append(f"{origin}: --megatron-args needs --hardware PROFILE")
    if a.problems:
        raise ConfigError(a.problems)
    scenario = {
        "name": Path(origin).stem if origin != "--megatron-args" else "megatron", "hardware": hardware,
        "description": f"Megatron-LM arguments {origin}", "model": model,
        "training": {"seq_len": seq, "micro_batch": micro, "grad_accum": accum, "precision": "bf16",
                     "gradient_clipping": clip, "activation_checkpointing": recompute == "full"},
        "schedule": {"system": "megatron_offload", "offload_fraction": fraction,
                     "overlap_d2h_h2d": a.has("--overlap-cpu-optimizer-d2h-h2d"),
                     "pin_cpu_grads": not a.has("--no-pin-cpu-grads"), "use_precision_aware_optimizer": True,
                     "activation_offload": act_offload},
        "cluster": {"gpus": n_gpus},
    }
    return FrameworkMapping(scenario, origin, notes + a.ignored)


def load_megatron(ref: str, hardware: str, gpus: int | None, model: dict[str, Any] | None) -> FrameworkMapping:
    """``ref``: a file of arguments, or the arguments themselves (a string holding ``--``)."""
    path = Path(ref)
    if not ref.lstrip().startswith("--"):
        from sosim.inputs.safe_read import read_text

        # The one bounded reader: regular files only (a FIFO is refused, not read), UTF-8.
        return read_megatron(read_text(path, "Megatron-LM arguments file"), ref, hardware, gpus, model)
    return read_megatron(ref, "--megatron-args", hardware, gpus, model)


def megatron_args(sc: Any) -> tuple[str, list[str]]:
    """The arguments of a ``megatron_offload`` scenario (one per line), and what they cannot express."""
    k, t, m = sc.schedule.model_dump(), sc.training, sc.model
    lines = [f"--num-layers {m.layers}", f"--hidden-size {m.hidden}", f"--num-attention-heads {m.heads}"]
    if m.n_kv_heads != m.heads:
        lines += ["--group-query-attention", f"--num-query-groups {m.n_kv_heads}"]
    lines += [f"--ffn-hidden-size {m.ffn_dim}", f"--vocab-size {m.vocab}"]
    lines += ["--swiglu"] if m.ffn_kind == "swiglu" else []
    lines += [] if m.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    dp = sc.cluster.dp
    lines += [f"--seq-length {t.seq_len}", f"--micro-batch-size {t.micro_batch}",
              f"--global-batch-size {t.micro_batch * dp * t.grad_accum}", "--bf16",
              f"--clip-grad {t.gradient_clipping!r}", "--optimizer adam", "--use-distributed-optimizer"]
    if t.activation_checkpointing:
        lines += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if k["offload_fraction"] > 0:
        lines += ["--optimizer-cpu-offload", f"--optimizer-offload-fraction {k['offload_fraction']!r}",
                  "--use-precision-aware-optimizer"]
        lines += ["--overlap-cpu-optimizer-d2h-h2d"] if k["overlap_d2h_h2d"] else []
        lines += [] if k["pin_cpu_grads"] else ["--no-pin-cpu-grads"]
    lines += ["--fine-grained-activation-offloading"] if k["activation_offload"] else []
    cannot = [] if k["cpu_adam_impl"] == "fused" else [
        f"schedule.cpu_adam_impl: {k['cpu_adam_impl']} has no Megatron argument (Megatron passes fused=True)"]
    return " \\\n".join(lines) + "\n", cannot
