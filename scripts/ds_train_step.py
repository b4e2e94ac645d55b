"""Measure real DeepSpeed training steps of a Llama-style model on one GPU (end-to-end truth for sosim).

One process = one (model size, configuration) run. It builds the model with plain torch (sosim's
calibrate/llama.py, no downloads), wraps it in DeepSpeed (or not, for the compute floor), runs warm-up
steps, then times steps twice: "phased" (synchronize after forward, backward and step() to get each
phase's duration) and "unsynced" (synchronize only at the end of the step: the true step time, since
the phase barriers can remove overlap). It appends one CSV row per timing mode to
``<out>/deepspeed_steps.csv`` and writes the exact DeepSpeed config and the per-step raw times as JSON
under ``<out>/runs/``.

Configurations (``--config``):
  floor        plain bf16 forward+backward with activation checkpointing, no optimizer (compute floor)
  zero2        ZeRO-2 + offload_optimizer cpu (pinned): ZeRO-Offload
  zero3        ZeRO-3 + offload_optimizer cpu (pinned)
  superoffload ZeRO-3 + offload_optimizer {cpu, super_offload: true}

One process per GPU: alone it runs world size 1 on 127.0.0.1; under DeepSpeed's launcher (or torchrun) it
reads RANK / LOCAL_RANK / WORLD_SIZE, runs data parallel on every GPU, and only rank 0 writes rows (each
rank writes its own CPU-affinity report). Inside step() the ZeRO optimizer's own methods are timed
(sosim/calibrate/ds_timers.py): the t_<name>_s columns are medians of the per-step sums. Examples:
  python3 scripts/ds_train_step.py --config zero2 --size 1.1b --seq 2048 --micro-batch 4 --out calibration/x
  python3 -m deepspeed.launcher.runner --num_gpus 2 scripts/ds_train_step.py --config zero3 --size 1.1b ...

Why this module is over 500 lines: it is copied to a GPU machine and run there as one standalone command per run
(torch and DeepSpeed, no sosim install): the configurations, the model builder, the two timing modes and the CSV
rows travel as one file.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import random
import re
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Model sizes: (layers, hidden). heads = hidden/128, kv_heads = heads/4, ffn = Llama's 8/3 rule, vocab 32000.
# Why these: hidden 2048 and 4096 are the shapes the layer benchmark measures, so the simulator's per-layer
# prediction can be checked component by component before end to end.
SIZES: dict[str, tuple[int, int]] = {
    "0.5b": (8, 2048),
    "1.1b": (22, 2048),
    "2.0b": (10, 4096),
    "3.8b": (20, 4096),
}
VOCAB = 32000
# A shape no table holds: --size L<layers>h<hidden>a<heads>kv<kv_heads>f<ffn>, e.g. L12h2560a32kv8f6912
# (head_dim = hidden / heads = 80). Why: issue 18's held-out shapes (head_dim != 128, hidden sizes between the
# measured ones, MHA and GQA) run through the same script and rows as the named sizes.
CUSTOM_SIZE = re.compile(r"^L(\d+)h(\d+)a(\d+)kv(\d+)f(\d+)$")
# Other families (sosim/calibrate/families.py), chosen by the size's first letter (added 2026-12-01):
#   G<layers>h<hidden>a<heads>f<ffn>, e.g. G12h2048a16f8192: GPT-2 family (biases, LayerNorm, GELU, learned
#     positions; 12 tensors in 6 modules per layer), issue 21 item 2;
#   M<layers>h<hidden>a<heads>kv<kv_heads>[d<head_dim>]e<experts>k<top_k>f<expert_ffn>, e.g.
#     M8h2048a32kv4d128e64k8f768 (head_dim 128: attention width 4096 != hidden, as Qwen3-30B-A3B): a
#     Qwen3-MoE-shaped model (transformers' Qwen3MoeForCausalLM when it builds, else families.OwnMoEModel),
#     issue 22 item 2.
GPT2_SIZE = re.compile(r"^G(\d+)h(\d+)a(\d+)f(\d+)$")
MOE_SIZE = re.compile(r"^M(\d+)h(\d+)a(\d+)kv(\d+)(?:d(\d+))?e(\d+)k(\d+)f(\d+)$")
# zero3gpu (added 2026-12-01, issue 21 item 2): ZeRO-3 without any offload, a client torch.optim.AdamW on the GPU
# (DeepSpeed's own "AdamW" would JIT-build FusedAdam, which needs nvcc): stage 3's hooks without the host.
CONFIGS: tuple[str, ...] = ("floor", "zero2", "zero3", "superoffload", "zero3gpu")

CSV_COLUMNS: tuple[str, ...] = (
    "run_id",
    "config",
    "timing",
    "zero_stage",
    "offload_optimizer",
    "super_offload",
    "ratio",
    "cpuadam_cores_perc",
    "sub_group_size",
    "gradient_clipping",
    "model",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "seq",
    "micro_batch",
    "params",
    "activation_checkpointing",
    "warmup_steps",
    "n_steps",
    "step_median_s",
    "step_p10_s",
    "step_p90_s",
    "fwd_median_s",
    "bwd_median_s",
    "optimizer_step_median_s",
    "tokens_per_s",
    "gpu_mem_peak_gib",
    "device",
    "cpu_model",
    "cpu_cores",
    "torch_version",
    "deepspeed_version",
    "date",
    "ds_config_file",
    "status",
    "error",
    # Added 2026-11-30: data parallel, phase spreads, and timers inside step() (see ds_timers.TIMER_NAMES).
    "gpus",
    "n_phased_steps",
    "fwd_p10_s",
    "fwd_p90_s",
    "bwd_p10_s",
    "bwd_p90_s",
    "optimizer_step_p10_s",
    "optimizer_step_p90_s",
    "step_fixed_median_s",
    # Added 2026-12-01: ZeRO-Infinity (offload_param cpu) and the lease (device session) of the run.
    "offload_param",
    "lease",
)


def load_calibrate_module(name: str) -> Any:
    """sosim.calibrate.<name> loaded from its file alone, so this script never imports the simulator (or its
    dependencies: pydantic, simpy, ...) on the GPU machine. The modules loaded this way have no imports of
    their own package."""
    import importlib.util

    key = f"sosim_{name}_standalone"
    if key in sys.modules:
        return sys.modules[key]
    path = Path(__file__).resolve().parents[1] / "sosim" / "calibrate" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TIMER_NAMES: tuple[str, ...] = load_calibrate_module("ds_timers").TIMER_NAMES
CSV_COLUMNS = CSV_COLUMNS + tuple(f"t_{name}_s" for name in TIMER_NAMES)
# Added 2026-12-01 (issues 21-23): model family, DeepSpeed's import path, stage 3's hook timers (z3_hooks.py: per
# step sums t_<hook>_s and call counts n_<hook>, medians over the steps), the model's hook and tensor counts.
HOOK_NAMES: tuple[str, ...] = load_calibrate_module("z3_hooks").HOOK_NAMES
HOOK_PHASES: tuple[str, ...] = ("fwd", "bwd", "opt")
CSV_COLUMNS = (
    *CSV_COLUMNS,
    "family",
    "moe_impl",
    "moe_experts",
    "moe_top_k",
    "moe_fallback_why",
    "deepspeed_path",
    "hook_timers",
    "hooked_modules",
    "param_modules",
    "param_tensors",
    "hook_handles",
    *(f"t_{name}_s" for name in HOOK_NAMES),
    *(f"n_{name}" for name in HOOK_NAMES),
    *(f"t_hook_total_{phase}_s" for phase in HOOK_PHASES),
    "t_hook_total_s",
    "t_grad_epilogue_calls",
    "ds_hooked_modules",
    "z3_leaf_modules",
)


def load_llama_module() -> Any:
    return load_calibrate_module("llama")


def distributed_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the launcher's environment; (0, 0, 1) when run alone."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return rank, local_rank, world


def affinity_report() -> dict[str, Any]:
    """Cpus_allowed_list of every thread of this process and of its children (SuperOffload's worker), with
    OMP_NUM_THREADS and torch's thread count: what each rank really gets on a shared host."""
    import torch

    threads = load_calibrate_module("affinity").thread_affinities

    report: dict[str, Any] = {
        "pid": os.getpid(),
        "rank_env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMP_NUM_THREADS")},
        "torch_num_threads": torch.get_num_threads(),
        "process_affinity": sorted(os.sched_getaffinity(0)),
        "threads": threads("self"),
        "children": [],
    }
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            report["children"].append(
                {"pid": child.pid, "process_affinity": child.cpu_affinity(), "threads": threads(str(child.pid))}
            )
    except Exception as error:  # psutil missing or the child gone
        report["children_error"] = f"{type(error).__name__}: {error}"
    return report


def ds_config(
    config: str,
    micro_batch: int,
    clip: float,
    sub_group_size: int,
    ratio: float,
    cores_perc: float,
    offload_param: bool = False,
) -> dict[str, Any]:
    """The exact DeepSpeed JSON config of one run (recorded verbatim next to the timings)."""
    if offload_param and config != "zero3":
        raise ValueError("--offload-param applies to --config zero3 (ZeRO-Infinity)")
    base: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "gradient_clipping": clip,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        },
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    offload: dict[str, Any] = {"device": "cpu", "pin_memory": True}
    if config == "zero2":
        zero: dict[str, Any] = {
            "stage": 2,
            "offload_optimizer": offload,
            "overlap_comm": True,
            "contiguous_gradients": True,
        }
    elif config == "zero3gpu":
        base.pop("optimizer")
        zero = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": sub_group_size}
    elif config in ("zero3", "superoffload"):
        if config == "superoffload":
            offload = offload | {"super_offload": True, "ratio": ratio, "cpuadam_cores_perc": cores_perc}
        zero = {
            "stage": 3,
            "offload_optimizer": offload,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": sub_group_size,
        }
        if offload_param:
            # ZeRO-Infinity with the parameters in pinned CPU memory (not NVMe): stage 3 fetches each
            # layer's bf16 parameters over the link before use.
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    else:
        raise ValueError(f"no DeepSpeed config for {config!r}")
    return base | {"zero_optimization": zero}


def setup_single_process_env() -> None:
    """World size 1 over loopback; a random port so back-to-back runs never collide on TIME_WAIT. Under a
    launcher these are already set and kept."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(random.randint(29500, 29999)))
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    llama = load_llama_module()
    ds_timers = load_calibrate_module("ds_timers")
    z3_hooks = load_calibrate_module("z3_hooks")
    rank, local_rank, world = distributed_env()
    shape = model_shape(args, llama)
    torch.manual_seed(1234)
    on_gpu = args.device == "cuda"
    device = torch.device("cuda", local_rank) if on_gpu else torch.device(args.device)
    if on_gpu:
        torch.cuda.set_device(local_rank)
    model, family_info = build_model(args, shape, device, llama)
    model.train()
    family_info |= z3_hooks.model_counts(model)
    # Each rank its own tokens (data parallel); the same seed on every rank keeps the weights identical.
    generator = torch.Generator(device="cpu").manual_seed(1000 + rank)
    tokens = torch.randint(0, VOCAB, (args.micro_batch, args.seq), generator=generator).to(device)
    labels = torch.roll(tokens, -1, dims=1)

    config_dict: dict[str, Any] | None = None
    deepspeed_version = ""
    timers = ds_timers.MethodTimers()
    hooks = z3_hooks.HookTimers(ds_timers.MethodTimers())
    affinity: dict[str, Any] = {}
    if args.config == "floor":
        engine = None

        def forward() -> Any:
            return model(tokens, labels)

        def backward(loss: Any) -> None:
            loss.backward()

        def optimizer_step() -> None:
            # No optimizer: drop the grads so the next backward writes fresh ones, as zero_grad would.
            for param in model.parameters():
                param.grad = None
    else:
        if not on_gpu and os.environ.get("DS_ACCELERATOR") != "cpu":
            # Smoke tests only: DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) over gloo runs the harness's
            # paths (hooks, timers, rows) on a machine without a GPU; its times mean nothing.
            raise ValueError("DeepSpeed configurations need --device cuda (or DS_ACCELERATOR=cpu for a smoke test)")
        if world == 1:
            setup_single_process_env()
        import deepspeed  # type: ignore[import-not-found]

        deepspeed_version = deepspeed.__version__
        if args.expect_ds and deepspeed_version != args.expect_ds:
            raise RuntimeError(f"DeepSpeed {deepspeed_version} imported from {deepspeed.__file__}, expected "
                               f"{args.expect_ds} (is its --target site first on PYTHONPATH?)")
        family_info["deepspeed_path"] = str(Path(deepspeed.__file__).parent)
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
        config_dict = ds_config(
            args.config,
            args.micro_batch,
            args.clip,
            int(args.sub_group_size),
            args.ratio,
            args.cores_perc,
            offload_param=args.offload_param,
        )
        if args.config == "zero3gpu":
            client = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config_dict)
        else:
            engine, _, _, _ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=config_dict
            )
        affinity["after_initialize"] = affinity_report()
        timers.wrap(engine.optimizer)
        if args.hook_timers and hooks.attach(engine):
            family_info["hook_handles"] = hooks.hook_handles
            family_info["ds_hooked_modules"] = hooks.registered_modules
        # After initialize: DeepSpeed has flagged its default ZeRO-3 leaf classes by now.
        family_info["z3_leaf_modules"] = z3_hooks.model_counts(model)["z3_leaf_modules"]

        def forward() -> Any:
            return engine(tokens, labels)

        def backward(loss: Any) -> None:
            engine.backward(loss)

        def optimizer_step() -> None:
            engine.step()

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    def one_step(phased: bool) -> tuple[tuple[float, float, float, float], dict[str, float]]:
        """(total, fwd, bwd, step) seconds (phases NaN when not phased) and the step's inner timers."""
        sync()
        timers.take()
        hooks.take()
        hook_phases: dict[str, dict[str, tuple[float, int]]] = {}
        start_s = time.perf_counter()
        loss = forward()
        if phased:
            sync()
        fwd_end_s = time.perf_counter()
        hook_phases["fwd"] = hooks.take()  # host-side timers: no synchronisation needed to read them
        backward(loss)
        if phased:
            sync()
        bwd_end_s = time.perf_counter()
        hook_phases["bwd"] = hooks.take()
        optimizer_step()
        sync()
        end_s = time.perf_counter()
        hook_phases["opt"] = hooks.take()
        taken = timers.take()
        inner = {name: seconds for name, (seconds, _calls) in taken.items()}
        inner["fixed"] = ds_timers.fixed_part_s(timers_as_pairs(inner))
        inner["grad_epilogue_calls"] = float(taken.get("grad_epilogue", (0.0, 0))[1])
        if hooks.attached:
            inner |= hook_step_values(hook_phases)
        if not phased:
            return (end_s - start_s, float("nan"), float("nan"), float("nan")), inner
        return (end_s - start_s, fwd_end_s - start_s, bwd_end_s - fwd_end_s, end_s - bwd_end_s), inner

    for _ in range(args.warmup):
        one_step(phased=True)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    # Unsynced first: the step-time distribution; then the phased steps for the phase times.
    unsynced = [one_step(phased=False) for _ in range(args.steps)]
    phased = [one_step(phased=True) for _ in range(args.phased_steps)]
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    affinity["after_steps"] = affinity_report()
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()  # closes SuperOffload's worker process cleanly before the next run starts
    return {
        "shape": shape,
        "params": shape.params_count(),
        "config_dict": config_dict,
        "phased": [p[0] for p in phased],
        "unsynced": [u[0] for u in unsynced],
        "phased_timers": [p[1] for p in phased],
        "unsynced_timers": [u[1] for u in unsynced],
        "peak_gib": peak_gib,
        "torch_version": torch.__version__,
        "deepspeed_version": deepspeed_version,
        "device": torch.cuda.get_device_name(local_rank) if on_gpu else "cpu",
        "rank": rank,
        "world": world,
        "affinity": affinity,
        "family_info": family_info,
    }


def hook_step_values(phases: dict[str, dict[str, tuple[float, int]]]) -> dict[str, float]:
    """One step's hook timers: h_<name> seconds and c_<name> calls summed over the phases, and hook_total_<phase>
    (the outermost timed hook work: the four closures plus pre_bwd / post_bwd, which autograd calls directly)."""
    out: dict[str, float] = {}
    outermost = ("hook_fwd_pre", "hook_fwd_post", "hook_bwd_pre_setup", "hook_bwd_post_setup", "pre_bwd", "post_bwd")
    for phase, taken in phases.items():
        for name, (seconds, calls) in taken.items():
            out[f"h_{name}"] = out.get(f"h_{name}", 0.0) + seconds
            out[f"c_{name}"] = out.get(f"c_{name}", 0.0) + calls
        out[f"hook_total_{phase}"] = sum(taken.get(name, (0.0, 0))[0] for name in outermost)
    out["hook_total"] = sum(out.get(f"hook_total_{phase}", 0.0) for phase in phases)
    return out


def size_family(size: str) -> str:
    """llama, gpt2 or moe, from the size's syntax."""
    if GPT2_SIZE.match(size):
        return "gpt2"
    if MOE_SIZE.match(size):
        return "moe"
    return "llama"


def parse_moe(size: str) -> tuple[int, int, int, int, int, int, int, int]:
    """(layers, hidden, heads, kv_heads, head_dim, experts, top_k, expert_ffn) of an M... size; head_dim defaults
    to hidden / heads."""
    match = MOE_SIZE.match(size)
    if match is None:
        raise ValueError(f"--size {size}: not an MoE size M<layers>h<hidden>a<heads>kv<kv>[d<head_dim>]e<experts>"
                         "k<top_k>f<ffn>")
    layers, hidden, heads, kv_heads = (int(g) for g in match.groups()[:4])
    experts, top_k, ffn = (int(g) for g in match.groups()[5:])
    head_dim_text = match.group(5)
    if head_dim_text is None and hidden % heads:
        raise ValueError(f"--size {size}: hidden must be a multiple of heads (or give d<head_dim>)")
    head_dim = int(head_dim_text) if head_dim_text is not None else hidden // heads
    if heads % kv_heads or not 1 <= top_k <= experts or head_dim < 1:
        raise ValueError(f"--size {size}: heads must be a multiple of kv heads, 1 <= top_k <= experts")
    return layers, hidden, heads, kv_heads, head_dim, experts, top_k, ffn


def parse_size(size: str) -> tuple[int, int, int, int, int] | None:
    """(layers, hidden, heads, kv_heads, ffn) of a named or custom size (any family); None for an unknown name."""
    gpt2 = GPT2_SIZE.match(size)
    if gpt2 is not None:
        layers, hidden, heads, ffn = (int(g) for g in gpt2.groups())
        if hidden % heads:
            raise ValueError(f"--size {size}: hidden must be a multiple of heads")
        return layers, hidden, heads, heads, ffn
    if MOE_SIZE.match(size):
        layers, hidden, heads, kv_heads, _head_dim, _experts, _top_k, ffn = parse_moe(size)
        return layers, hidden, heads, kv_heads, ffn
    if size in SIZES:
        layers, hidden = SIZES[size]
        heads = hidden // 128
        return layers, hidden, heads, max(1, heads // 4), _swiglu(hidden)
    match = CUSTOM_SIZE.match(size)
    if match is None:
        return None
    layers, hidden, heads, kv_heads, ffn = (int(g) for g in match.groups())
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"--size {size}: hidden must be a multiple of heads, and heads of kv heads")
    return layers, hidden, heads, kv_heads, ffn


def _swiglu(hidden: int) -> int:
    """Llama's MLP width: 8/3 of hidden rounded up to a multiple of 256 (llama.swiglu_ffn, torch-free here)."""
    return -(-8 * hidden // (3 * 256)) * 256


def model_shape(args: argparse.Namespace, llama: Any) -> Any:
    family = size_family(args.size)
    if family == "gpt2" and not args.tiny:
        layers, hidden, heads, _, ffn = parse_size(args.size) or (0, 0, 0, 0, 0)
        positions = max(args.seq, 1024)
        return load_calibrate_module("families").GPT2Shape(layers, hidden, heads, ffn, VOCAB, positions)
    if family == "moe" and not args.tiny:
        layers, hidden, heads, kv_heads, head_dim, experts, top_k, ffn = parse_moe(args.size)
        return load_calibrate_module("families").MoEShape(
            layers, hidden, heads, kv_heads, experts, top_k, ffn, VOCAB, head_dim
        )
    if args.tiny:
        return llama.LlamaShape(layers=2, hidden=256, heads=2, kv_heads=1, ffn=_swiglu(256), vocab=VOCAB)
    parsed = parse_size(args.size)
    assert parsed is not None  # checked by the parser
    layers, hidden, heads, kv_heads, ffn = parsed
    return llama.LlamaShape(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=VOCAB)


def build_model(args: argparse.Namespace, shape: Any, device: Any, llama: Any) -> tuple[Any, dict[str, Any]]:
    """The bf16 model of ``shape`` on ``device`` with its initial weights, and the family columns of the row."""
    import torch

    family = "llama" if args.tiny else size_family(args.size)
    info: dict[str, Any] = {"family": family}
    checkpoint = not args.no_ckpt
    if family == "llama":
        with device:
            model = llama.LlamaModel(shape, checkpoint_layers=checkpoint)
        model = model.to(torch.bfloat16)
        llama.init_weights_(model)
        return model, info
    families = load_calibrate_module("families")
    if family == "gpt2":
        with device:
            model = families.GPT2Model(shape, checkpoint_layers=checkpoint)
        model = model.to(torch.bfloat16)
        families.init_gpt2_(model)
        return model, info
    with device:
        model, impl, why = families.build_moe(shape, args.seq, checkpoint, impl=args.moe_impl)
    model = model.to(device=device, dtype=torch.bfloat16)
    if impl == "own-experts-loop":
        families.init_moe_(model)  # the Hugging Face model initialises itself (std 0.02, ones for norms)
    info |= {"moe_impl": impl, "moe_fallback_why": why, "moe_experts": shape.experts, "moe_top_k": shape.top_k,
             "params_built": families.model_params(model)}
    return model, info


def timers_as_pairs(inner: dict[str, float]) -> dict[str, tuple[float, int]]:
    return {name: (seconds, 1) for name, seconds in inner.items()}


def run_id_for(args: argparse.Namespace, world: int) -> str:
    clip_tag = f"-clip{args.clip:g}" if args.config != "floor" else ""
    size_tag = "tiny" if args.tiny else args.size
    run_id = f"{size_tag}-s{args.seq}-mb{args.micro_batch}-{args.config}{clip_tag}"
    if args.config == "superoffload" and args.ratio != 1.0:
        run_id += f"-ratio{args.ratio:g}"
    if args.config == "superoffload" and args.cores_perc != 0.8:
        run_id += f"-cores{args.cores_perc:g}"
    if args.config in ("zero3", "superoffload", "zero3gpu") and args.sub_group_size != 1e8:
        run_id += f"-sg{args.sub_group_size:g}"
    if args.offload_param:
        run_id += "-offparam"
    if args.no_ckpt:
        run_id += "-nockpt"
    if args.expect_ds:
        run_id += f"-ds{args.expect_ds}"
    if args.hook_timers:
        run_id += "-hooks"
    if world > 1:
        run_id += f"-gpus{world}"
    return run_id


def _stat(values: list[float], q: float | None) -> str:
    finite = [v for v in values if v == v]
    if not finite:
        return ""
    value = statistics.median(finite) if q is None else percentile(finite, q)
    return f"{value:.6f}"


def rows_for(args: argparse.Namespace, run_id: str, result: dict[str, Any], config_file: str) -> list[dict[str, str]]:
    shape = result["shape"]
    zero = (result["config_dict"] or {}).get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {})
    world = result["world"]
    common = {
        "run_id": run_id,
        "config": args.config,
        "zero_stage": str(zero.get("stage", "")),
        "offload_optimizer": offload.get("device", ""),
        "super_offload": str(offload.get("super_offload", "")),
        "ratio": str(offload.get("ratio", "")),
        "cpuadam_cores_perc": str(offload.get("cpuadam_cores_perc", "")),
        "sub_group_size": str(zero.get("sub_group_size", "")),
        "gradient_clipping": "" if args.config == "floor" else str(args.clip),
        "model": "tiny" if args.tiny else args.size,
        "layers": str(shape.layers),
        "hidden": str(shape.hidden),
        "heads": str(shape.heads),
        "kv_heads": str(shape.kv_heads),
        "head_dim": str(shape.head_dim),
        "ffn": str(shape.ffn),
        "vocab": str(shape.vocab),
        "seq": str(args.seq),
        "micro_batch": str(args.micro_batch),
        "params": str(result["family_info"].get("params_built", result["params"])),
        "activation_checkpointing": "false" if args.no_ckpt else "true",
        "warmup_steps": str(args.warmup),
        "gpu_mem_peak_gib": f"{result['peak_gib']:.2f}",
        "device": result["device"],
        "cpu_model": cpu_model_name(),
        "cpu_cores": str(os.cpu_count()),
        "torch_version": result["torch_version"],
        "deepspeed_version": result["deepspeed_version"],
        "date": dt.date.today().isoformat(),
        "ds_config_file": config_file,
        "status": "ok",
        "error": "",
        "gpus": str(world),
        "n_phased_steps": str(len(result["phased"])),
        "offload_param": "cpu" if zero.get("offload_param") else "",
        "lease": args.lease,
        "hook_timers": "true" if args.hook_timers else "",
    }
    for key in ("family", "moe_impl", "moe_experts", "moe_top_k", "moe_fallback_why", "deepspeed_path",
                "hooked_modules", "param_modules", "param_tensors", "hook_handles", "ds_hooked_modules",
                "z3_leaf_modules"):
        common[key] = str(result["family_info"].get(key, ""))
    rows = []
    for timing in ("unsynced", "phased"):
        steps = result[timing]
        totals = [s[0] for s in steps]
        row = dict(common, timing=timing, n_steps=str(len(totals)))
        median_s = statistics.median(totals)
        row |= {
            "step_median_s": f"{median_s:.6f}",
            "step_p10_s": f"{percentile(totals, 0.1):.6f}",
            "step_p90_s": f"{percentile(totals, 0.9):.6f}",
            # Tokens of every rank: the data-parallel throughput.
            "tokens_per_s": f"{args.micro_batch * args.seq * world / median_s:.1f}",
        }
        if timing == "phased":
            for index, name in ((1, "fwd"), (2, "bwd"), (3, "optimizer_step")):
                values = [s[index] for s in steps]
                row[f"{name}_median_s"] = _stat(values, None)
                row[f"{name}_p10_s"] = _stat(values, 0.1)
                row[f"{name}_p90_s"] = _stat(values, 0.9)
        inner = result[f"{timing}_timers"]
        if args.config != "floor" and inner:
            row["step_fixed_median_s"] = _stat([t.get("fixed", 0.0) for t in inner], None)
            for name in TIMER_NAMES:
                values = [t[name] for t in inner if name in t]
                if values:
                    row[f"t_{name}_s"] = _stat(values, None)
            row["t_grad_epilogue_calls"] = _stat([t.get("grad_epilogue_calls", 0.0) for t in inner], None)
            for name in HOOK_NAMES:
                for prefix, column in (("h", f"t_{name}_s"), ("c", f"n_{name}")):
                    values = [t[f"{prefix}_{name}"] for t in inner if f"{prefix}_{name}" in t]
                    if values:
                        row[column] = _stat(values, None)
            for key in (*(f"hook_total_{phase}" for phase in HOOK_PHASES), "hook_total"):
                values = [t[key] for t in inner if key in t]
                if values:
                    row[f"t_{key}_s"] = _stat(values, None)
        rows.append(row)
    return rows


def append_rows(csv_path: Path, rows: list[dict[str, str]]) -> None:
    new_file = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS), restval="")
        if new_file:
            writer.writeheader()
        writer.writerows(rows)


def _size_arg(text: str) -> str:
    try:
        ok = parse_size(text) is not None
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not ok:
        raise argparse.ArgumentTypeError(f"unknown size {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument(
        "--size",
        type=_size_arg,
        required=True,
        help=f"{', '.join(sorted(SIZES))}, or L<layers>h<hidden>a<heads>kv<kv_heads>f<ffn> (e.g. L12h2560a32kv8f6912), "
        "G<layers>h<hidden>a<heads>f<ffn> (GPT-2 family), "
        "M<layers>h<hidden>a<heads>kv<kv>e<experts>k<top_k>f<ffn> (MoE)",
    )
    parser.add_argument(
        "--offload-param", action="store_true", help="zero3: offload_param cpu as well (ZeRO-Infinity, pinned CPU)"
    )
    parser.add_argument(
        "--lease", default=os.environ.get("SOSIM_LEASE", ""), help="the device lease (session) id recorded per row"
    )
    parser.add_argument(
        "--hook-timers",
        action="store_true",
        help="time ZeRO-3's module hooks, fetch and release per step (sosim/calibrate/z3_hooks.py)",
    )
    parser.add_argument(
        "--moe-impl", choices=("auto", "hf", "own"), default="auto", help="M... sizes: transformers' Qwen3-MoE or own"
    )
    parser.add_argument(
        "--expect-ds", default="", help="fail (a failed row) unless this DeepSpeed version is the one imported"
    )
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.0, help="gradient_clipping (0 = off)")
    parser.add_argument("--sub-group-size", type=float, default=1e8, help="ZeRO-3 sub_group_size")
    parser.add_argument("--ratio", type=float, default=1.0, help="superoffload: fraction of sub-groups on CPU")
    parser.add_argument("--cores-perc", type=float, default=0.8, help="superoffload: cpuadam_cores_perc")
    parser.add_argument("--no-ckpt", action="store_true", help="activation checkpointing off")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps without phase barriers")
    parser.add_argument("--phased-steps", type=int, default=3, help="timed steps with phase barriers")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="'cpu' only to smoke-test the floor config")
    parser.add_argument("--tiny", action="store_true", help="2-layer, hidden-256 model: smoke tests only")
    # DeepSpeed's launcher appends --local_rank=N; the environment's LOCAL_RANK is what is used.
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(exist_ok=True)
    rank, _, world = distributed_env()
    run_id = run_id_for(args, world)
    start_s = time.perf_counter()
    try:
        result = run(args)
    except Exception as error:  # a failed run is data too: record why
        traceback.print_exc()
        if rank != 0:
            return 1
        layers, hidden = (2, 256) if args.tiny else (parse_size(args.size) or (0, 0))[:2]
        append_rows(
            args.out / "deepspeed_steps.csv",
            [
                {
                    "run_id": run_id,
                    "config": args.config,
                    "model": args.size,
                    "layers": str(layers),
                    "hidden": str(hidden),
                    "seq": str(args.seq),
                    "micro_batch": str(args.micro_batch),
                    "gradient_clipping": str(args.clip),
                    "gpus": str(world),
                    "lease": args.lease,
                    "status": "failed",
                    "error": f"{type(error).__name__}: {error}"[:300].replace("\n", " "),
                }
            ],
        )
        return 1
    (args.out / "runs" / f"{run_id}.rank{rank}.affinity.json").write_text(
        json.dumps(result["affinity"], indent=1) + "\n"
    )
    if rank != 0:
        return 0
    config_file = ""
    if result["config_dict"] is not None:
        config_file = f"runs/{run_id}.ds_config.json"
        (args.out / config_file).write_text(json.dumps(result["config_dict"], indent=2) + "\n")
    raw = {
        "run_id": run_id,
        "args": {k: str(v) for k, v in vars(args).items()},
        "shape": result["shape"].as_dict(),
        "wall_s": time.perf_counter() - start_s,
        "world_size": world,
        "phased_steps_s": result["phased"],
        "unsynced_steps_s": result["unsynced"],
        "phased_step_timers_s": result["phased_timers"],
        "unsynced_step_timers_s": result["unsynced_timers"],
        "ds_config": result["config_dict"],
        "family": result["family_info"],
    }
    (args.out / "runs" / f"{run_id}.json").write_text(json.dumps(raw, indent=1) + "\n")
    rows = rows_for(args, run_id, result, config_file)
    append_rows(args.out / "deepspeed_steps.csv", rows)
    for row in rows:
        print(
            f"[ds] {run_id} {row['timing']}: step {row['step_median_s']} s (p10 {row['step_p10_s']}, "
            f"p90 {row['step_p90_s']}) fwd {row.get('fwd_median_s', '')} bwd {row.get('bwd_median_s', '')} "
            f"opt {row.get('optimizer_step_median_s', '')} fixed {row.get('step_fixed_median_s', '')} "
            f"refresh {row.get('t_refresh_s', '')} wait {row.get('t_wait_async_s', '')} "
            f"peak {row['gpu_mem_peak_gib']} GiB",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    # The guard matters: SuperOffload starts its CPU-Adam worker with the 'spawn' method, which re-imports
    # this file in the child; nothing may run at import time.
    raise SystemExit(main())
