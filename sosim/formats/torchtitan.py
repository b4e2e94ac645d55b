"""torchtitan's job TOML, the offload-relevant subset: read into a scenario (``sosim run --torchtitan job.toml``)
and written from one (``sosim tune`` for an ``fsdp2_offload`` winner), read back exactly.

Keys (torchtitan ``torchtitan/config/job_config.py``; defaults are its defaults):

* ``[model] name, flavor``: the model shape of torchtitan's ``llama3`` flavors (``torchtitan/models/llama3/
  __init__.py``); any other model: ``--model config.json`` (Hugging Face) gives the shape instead;
* ``[training] local_batch_size`` (older ``batch_size``), ``seq_len`` (2048), ``enable_cpu_offload`` (must be
  true: sosim models FSDP2 with CPU offload), ``max_norm`` (1.0: the clip), ``global_batch_size`` (-1: local x
  data parallel; more: gradient accumulation), ``mixed_precision_param`` (bfloat16);
* ``[parallelism] data_parallel_shard_degree`` (-1: every GPU), ``fsdp_reshard_after_forward`` (default /
  always / never), and tensor / pipeline / context / replicate degrees, which must be 1;
* ``[activation_checkpoint] mode``: ``full`` (checkpointing), ``none``; ``selective`` is read as ``full``
  (it recomputes less: an upper bound on backward) and says so;
* ``[optimizer] name`` (AdamW / Adam), ``implementation`` (``for-loop`` / ``foreach`` / ``fused``, default fused).

Every other key is ignored and listed. Problems are located ``file:line: [section] key: message``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from sosim.inputs.errors import ConfigError

# torchtitan/models/llama3/__init__.py llama3_args: dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier,
# multiple_of; vocab 128256 (the Llama 3 tokenizer torchtitan's configs load).
LLAMA3_FLAVORS: dict[str, tuple[int, int, int, int, float | None, int]] = {
    "8B": (4096, 32, 32, 8, 1.3, 1024),
    "70B": (8192, 80, 64, 8, 1.3, 4096),
    "405B": (16384, 126, 128, 8, 1.2, 4096),
}
LLAMA3_VOCAB = 128256
ADAM_IMPLS = {"for-loop": "forloop", "foreach": "foreach", "fused": "fused"}
RESHARD = {"default": True, "always": True, "never": False}


def llama3_ffn(dim: int, multiplier: float | None, multiple_of: int) -> int:
    """torchtitan's FeedForward hidden size: 2/3 of 4*dim, times the multiplier, rounded up to multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama3_model(flavor: str) -> dict[str, Any]:
    dim, layers, heads, kv, mult, multiple = LLAMA3_FLAVORS[flavor]
    return {"name": f"llama3-{flavor}", "layers": layers, "hidden": dim, "heads": heads, "kv_heads": kv,
            "ffn": llama3_ffn(dim, mult, multiple), "ffn_kind": "swiglu", "vocab": LLAMA3_VOCAB}


@dataclass
class FrameworkMapping:
    """A scenario dict built from a framework's config, and what was read, defaulted and ignored."""

    scenario: dict[str, Any]
    origin: str
    notes: list[str] = field(default_factory=list)

    def format(self, what: str) -> str:
        return "\n".join([f"sosim: {what} {self.origin} -> scenario", *(f"  {n}" for n in self.notes)])


class _Toml:
    """A parsed TOML file with the line of every key (tomllib keeps none)."""

    def __init__(self, path: str) -> None:
        self.path = path
        from sosim.inputs.safe_read import read_text

        text = read_text(path, "torchtitan job")  # the one bounded reader: regular files only, UTF-8
        try:
            self.data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            line = re.search(r"line (\d+)", str(exc))
            raise ConfigError([f"{path}:{line.group(1) if line else 1}: TOML syntax: {exc}"]) from None
        self.lines: dict[tuple[str, str], int] = {}
        section = ""
        for number, raw in enumerate(text.splitlines(), 1):
            head = re.match(r"\s*\[([^\]]+)\]", raw)
            if head:
                section = head.group(1).strip()
                self.lines[(section, "")] = number
                continue
            key = re.match(r"\s*([A-Za-z0-9_\-]+)\s*=", raw)
            if key:
                self.lines[(section, key.group(1))] = number
        self.problems: list[str] = []
        self.used: set[tuple[str, str]] = set()

    def where(self, section: str, key: str) -> str:
        line = self.lines.get((section, key), self.lines.get((section, ""), 1))
        return f"{self.path}:{line}: [{section}] {key}"

    def get(self, section: str, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.used.add((section, key))
        table = self.data.get(section, {})
        if not isinstance(table, dict) or key not in table:
            return default
        value = table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML's true/false are Python bools, which are ints too: a bool where a number is expected is an error.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.problems.append(f"{self.where(section, key)}: expected {_kind_name(kind)}, got {value!r}")
            return default
        return value

    def error(self, section: str, key: str, message: str) -> None:
        self.problems.append(f"{self.where(section, key)}: {message}")

    def ignored(self) -> list[str]:
        out = []
        for section, table in self.data.items():
            keys = table.items() if isinstance(table, dict) else [("", table)]
            for key, _ in keys:
                if (section, key) not in self.used:
                    out.append(f"ignored [{section}] {key} (no effect on the step sosim models)")
        return out


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({int: "an integer", float: "a number", str: "a string", bool: "true/false"}[k] for k in kinds)


def read_torchtitan(path: str, hardware: str, gpus: int | None, model: dict[str, Any] | None) -> FrameworkMapping:
    """The scenario a torchtitan TOML describes on ``hardware`` (``model``: a shape from ``--model``)."""
    t = _Toml(path)
    notes: list[str] = []
    name = t.get("model", "name", str, "llama3")
    flavor = t.get("model", "flavor", str, "")
    if model is None:
        if name != "llama3" or flavor not in LLAMA3_FLAVORS:
            t.error("model", "flavor", f"{name!r} flavor {flavor!r}: sosim knows torchtitan's llama3 flavors "
                                       f"({', '.join(LLAMA3_FLAVORS)}); for another model give --model config.json")
            model = {}
        else:
            model = llama3_model(flavor)
            notes.append(f"[model] {name} {flavor} -> the llama3 {flavor} shape (torchtitan models/llama3)")
    else:
        notes.append("model shape from --model (the TOML's [model] is not used for it)")
    local = t.get("training", "local_batch_size", int, None)
    if local is None:
        local = t.get("training", "batch_size", int, 8)  # older torchtitan; its default 8
    seq = t.get("training", "seq_len", int, 2048)
    if t.get("training", "enable_cpu_offload", bool, False) is not True:
        t.error("training", "enable_cpu_offload", "sosim models torchtitan with FSDP2's CPU offload: set "
                                                  "enable_cpu_offload = true")
    clip = t.get("training", "max_norm", (int, float), 1.0)
    precision = t.get("training", "mixed_precision_param", str, "bfloat16")
    if precision != "bfloat16":
        t.error("training", "mixed_precision_param", f"{precision!r}: only bfloat16 is modelled")
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                "data_parallel_replicate_degree"):
        if t.get("parallelism", key, int, 1) != 1:
            t.error("parallelism", key, "must be 1 (sosim models FSDP data parallelism only)")
    n_gpus = gpus or 1
    shard = t.get("parallelism", "data_parallel_shard_degree", int, -1)
    if shard not in (-1, n_gpus):
        t.error("parallelism", "data_parallel_shard_degree", f"{shard}: must be -1 or the GPU count ({n_gpus})")
    reshard = t.get("parallelism", "fsdp_reshard_after_forward", str, "default")
    if reshard not in RESHARD:
        t.error("parallelism", "fsdp_reshard_after_forward", f"{reshard!r}: one of {', '.join(RESHARD)}")
    global_batch = t.get("training", "global_batch_size", int, -1)
    accum = 1
    if global_batch not in (-1, 0):
        if global_batch % (local * n_gpus):
            t.error("training", "global_batch_size", f"{global_batch} is not a multiple of local_batch_size x "
                                                     f"data parallel ({local * n_gpus})")
        else:
            accum = global_batch // (local * n_gpus)
    mode = t.get("activation_checkpoint", "mode", str, "selective")
    if mode not in ("none", "full", "selective", "memory_budget"):
        t.error("activation_checkpoint", "mode", f"{mode!r}: one of none, full, selective")
    if mode in ("selective", "memory_budget"):
        notes.append(f"[activation_checkpoint] mode {mode!r} read as full checkpointing (recomputes more than "
                     "selective: an upper bound on backward)")
    opt = t.get("optimizer", "name", str, "AdamW")
    if opt not in ("AdamW", "Adam"):
        t.error("optimizer", "name", f"{opt!r}: sosim models AdamW / Adam")
    impl = t.get("optimizer", "implementation", str, "fused")
    if impl not in ADAM_IMPLS:
        t.error("optimizer", "implementation", f"{impl!r}: one of {', '.join(ADAM_IMPLS)}")
    if not hardware:
        t.problems.append(f"{path}: --torchtitan needs --hardware PROFILE")
    if t.problems:
        raise ConfigError(t.problems)
    notes += t.ignored()
    scenario = {
        "name": Path(path).stem, "description": f"torchtitan job {path}", "hardware": hardware, "model": model,
        "training": {"seq_len": seq, "micro_batch": local, "grad_accum": accum, "precision": "bf16",
                     "gradient_clipping": float(clip), "activation_checkpointing": mode != "none"},
        "schedule": {"system": "fsdp2_offload", "adam_impl": ADAM_IMPLS[impl], "pin_memory": True,
                     "reshard_after_forward": RESHARD[reshard], "launcher": "torchrun"},
        "cluster": {"gpus": n_gpus},
    }
    return FrameworkMapping(scenario, path, notes)


def torchtitan_toml(sc: Any) -> tuple[str, list[str]]:
    """The TOML of an ``fsdp2_offload`` scenario, and what it cannot express."""
    k = sc.schedule.model_dump()
    t, m = sc.training, sc.model
    flavor = next((f for f in LLAMA3_FLAVORS if llama3_model(f) | {"name": m.name} == _model_keys(m)), None)
    cannot = []
    lines = ["# written by sosim (torchtitan job config, the offload subset)", "[model]", 'name = "llama3"']
    if flavor is not None:
        lines.append(f'flavor = "{flavor}"')
    else:
        cannot.append(f"model: {m.name or 'this shape'} is no llama3 flavor: pass the same --model config.json")
    dp = sc.cluster.dp
    lines += ["", "[training]", f"local_batch_size = {t.micro_batch}", f"seq_len = {t.seq_len}",
              "enable_cpu_offload = true", f"max_norm = {t.gradient_clipping!r}",
              f"global_batch_size = {t.micro_batch * dp * t.grad_accum}", 'mixed_precision_param = "bfloat16"',
              "", "[parallelism]", f"data_parallel_shard_degree = {dp}",
              f'fsdp_reshard_after_forward = "{"default" if k["reshard_after_forward"] else "never"}"',
              "", "[activation_checkpoint]", f'mode = "{"full" if t.activation_checkpointing else "none"}"',
              "", "[optimizer]", 'name = "AdamW"',
              f'implementation = "{ {v: key for key, v in ADAM_IMPLS.items()}[k["adam_impl"]] }"', ""]
    if not k["pin_memory"]:
        cannot.append("schedule.pin_memory: false has no torchtitan key (CPUOffloadPolicy(pin_memory=False) in code)")
    if k["activation_offload"]:
        cannot.append("schedule.activation_offload: no torchtitan key (torch.autograd.graph.save_on_cpu in code)")
    return "\n".join(lines), cannot


def _model_keys(m: Any) -> dict[str, Any]:
    return {"name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
            "ffn": m.ffn, "ffn_kind": m.ffn_kind, "vocab": m.vocab}
