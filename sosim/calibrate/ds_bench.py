"""DeepSpeed's own access patterns, timed on this machine (sections ds_refresh, layer_z3, ds_step_fixed,
so_worker). Each imitates one DeepSpeed 0.19.8 function; docs/calibration.md names them.

Every measurement that builds a DeepSpeed engine or changes CPU affinity runs in its own spawned child
(isolate.run_isolated): rows come back as they are measured, a hung configuration is killed, and the
parent's threads keep their affinity.

Why this module is over 500 lines: sosim/calibrate/ runs from a copy of its folder on a GPU machine; its four
sections (ds_refresh, layer_z3, ds_step_fixed, so_worker) each imitate one DeepSpeed function and share the
isolated-child plumbing and the affinity split defined here.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .affinity import thread_affinities
from .isolate import Emit, run_isolated
from .records import Table

# SuperOffload's default split (deepspeed/runtime/superoffload/superoffload_utils.py,
# SuperOffloadCPUOptimizer._set_cpu_affinity): the main process keeps the first int((1 - perc) * n) cores.
CPUADAM_CORES_PERC = 0.8


def superoffload_split(cores: list[int], perc: float = CPUADAM_CORES_PERC) -> tuple[list[int], list[int]]:
    """(main-process cores, worker cores) exactly as SuperOffloadCPUOptimizer._set_cpu_affinity splits them."""
    split = int((1 - perc) * len(cores))
    return cores[:split], cores[split:]


def refresh_sizes(quick: bool) -> tuple[int, ...]:
    """Sub-group sizes: DeepSpeed's default sub_group_size is 1e9; the measured runs use 1e8."""
    return (10**7, 10**8, 3 * 10**8, 6 * 10**8) if quick else (10**7, 5 * 10**7, 10**8, 3 * 10**8, 6 * 10**8)


def add_rows(table: Table, rows: list[Any]) -> None:
    for op, variant, dtype, times_s, shape in rows:
        table.add(op, variant, dtype, list(times_s), **shape)


def _report(name: str, rows: list[Any], problem: str, log: TextIO) -> None:
    print(f"[calibrate] {name}: {len(rows)} rows{'; ' + problem if problem else ''}", file=log, flush=True)


def process_affinity_report(torch: Any) -> dict[str, Any]:
    """This process's threads and those of its children (SuperOffload's worker), with thread counts."""
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "torch_num_threads": torch.get_num_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "process_affinity": sorted(os.sched_getaffinity(0)),
        "threads": thread_affinities(),
        "children": [],
    }
    try:
        import psutil  # type: ignore[import-untyped]

        for child in psutil.Process().children(recursive=True):
            report["children"].append(
                {
                    "pid": child.pid,
                    "cmdline": " ".join(child.cmdline())[:200],
                    "process_affinity": child.cpu_affinity(),
                    "threads": thread_affinities(child.pid),
                }
            )
    except Exception as error:  # psutil missing or a child gone: the main process's view is still useful
        report["children_error"] = f"{type(error).__name__}: {error}"
    return report


def setup_single_process_env() -> None:
    """World size 1 over loopback for deepspeed.init_distributed; a random port per child."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(random.randint(20000, 29999))
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ[key] = value


# ---------------------------------------------------------------------------------------------- ds_refresh


def bench_ds_refresh(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    rows, problem = run_isolated(refresh_target, {"quick": quick}, timeout_s=150 if quick else 240, log=log)
    add_rows(table, rows)
    _report("ds_refresh", rows, problem, log)
    if problem:
        raise RuntimeError(problem)


def refresh_target(emit: Emit, quick: bool) -> None:
    """DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters (and SuperOffload's override):
    ``fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)``, a bf16 GPU tensor
    from a pageable fp32 host tensor. ATen converts on the CPU into a freshly allocated bf16 tensor, then
    copies that pageable buffer to the device, blocking (copy_ across devices with a dtype change).
    """
    import psutil  # type: ignore[import-untyped]
    import torch

    from .timing import repeats_for, wall_times_s

    cores = sorted(os.sched_getaffinity(0))
    all_threads = len(cores)
    torch.set_num_threads(all_threads)
    sync = torch.cuda.synchronize
    sizes = refresh_sizes(quick)
    main_share = max(1, len(superoffload_split(cores)[0]))
    for threads in sorted({all_threads, min(8, all_threads), main_share}, reverse=True):
        torch.set_num_threads(threads)
        # Fewer sizes at the smaller thread counts: the thread dependence, not the size curve, is wanted there.
        for elements in sizes if threads == all_threads else sizes[::2]:
            # Pageable fp32 master partition, as _create_fp32_partitions makes it (clone of a .to('cpu')).
            src = torch.randn(elements, dtype=torch.float32)
            dst = torch.empty(elements, dtype=torch.bfloat16, device="cuda")
            repeats = repeats_for(elements * 1.5e-9, budget_s=2.5, lo=5, hi=15)
            times_s = wall_times_s(functools.partial(dst.data.copy_, src.data), 1, repeats, sync)
            shape = {"elements": elements, "threads": threads, "bytes": elements * 2}
            emit(("ds_refresh", "zero3", "fp32", times_s, shape))
            if threads == all_threads:
                # The CPU half of the same op, alone: the allocating cast (no device copy).
                cast_s = wall_times_s(functools.partial(src.to, torch.bfloat16), 1, repeats)
                emit(("ds_refresh", "cast_alloc", "fp32", cast_s, shape))
    # SuperOffload: the main process's OpenMP pool already exists at full width (it has run parallel CPU
    # work), then SuperOffloadCPUOptimizer._set_cpu_affinity pins the calling (main) thread to the first
    # int(0.2 * n) cores through psutil, exactly as DeepSpeed does. The fp32 partition has been handed to
    # the worker through a torch.multiprocessing queue, which moves its storage to shared memory.
    torch.set_num_threads(all_threads)
    torch.ones(10**7).mul_(2.0)
    main_cores, _ = superoffload_split(cores)
    psutil.Process().cpu_affinity(main_cores)
    for elements in sizes:
        src = torch.randn(elements, dtype=torch.float32).share_memory_()
        dst = torch.empty(elements, dtype=torch.bfloat16, device="cuda")
        repeats = repeats_for(elements * 1.5e-9, budget_s=2.5, lo=5, hi=15)
        times_s = wall_times_s(functools.partial(dst.data.copy_, src.data), 1, repeats, sync)
        emit(
            (
                "ds_refresh",
                "superoffload",
                "fp32",
                times_s,
                {"elements": elements, "threads": len(main_cores), "bytes": elements * 2},
            )
        )


# ---------------------------------------------------------------------------------------------- layer_z3

LAYER_STACK = 4  # decoder layers per timed pass; rows are per layer (pass time / LAYER_STACK)


def layer_z3_shapes(quick: bool) -> list[tuple[int, int, tuple[int, ...]]]:
    """(hidden, seq, batches): the two hidden sizes of the measured models, 2-3 token counts each."""
    if quick:
        return [(2048, 2048, (1, 4)), (4096, 2048, (1, 4))]
    return [(2048, 2048, (1, 2, 4)), (4096, 2048, (1, 2, 4))]


def layer_z3_groups(hidden: int, quick: bool) -> list[tuple[str, ...]]:
    """Modes per child process: the bare stack and the same stack wrapped by ZeRO-3 share one child (the
    engine converts the measured module in place, after the bare timings); ZeRO-3 with optimizer offload needs
    a fresh module. Quick runs the offload variant at hidden 2048 only."""
    groups: list[tuple[str, ...]] = [("hf", "z3")]
    if not quick or hidden == 2048:
        groups.append(("z3_offload",))
    return groups


def bench_layer_z3(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    problems = []
    for hidden, seq, batches in layer_z3_shapes(quick):
        for modes in layer_z3_groups(hidden, quick):
            rows, problem = run_isolated(
                layer_target,
                {"hidden": hidden, "seq": seq, "batches": batches, "modes": modes, "quick": quick},
                timeout_s=150,
                log=log,
            )
            add_rows(table, rows)
            _report(f"layer_z3 {'+'.join(modes)} h{hidden}", rows, problem, log)
            if problem:
                problems.append(f"{'+'.join(modes)} h{hidden}: {problem}")
    if problems:
        raise RuntimeError("; ".join(problems))


def hf_llama_config(hidden: int, layers: int, seq: int) -> Any:
    from transformers import LlamaConfig

    heads = hidden // 128
    from .llama import default_kv_heads, swiglu_ffn

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=swiglu_ffn(hidden),
        num_attention_heads=heads,
        num_key_value_heads=default_kv_heads(heads),
        num_hidden_layers=layers,
        vocab_size=32000,
        max_position_embeddings=max(seq, 4096),
        rms_norm_eps=1e-5,
    )
    config._attn_implementation = "sdpa"
    return config


def build_hf_stack(torch: Any, hidden: int, layers: int, seq: int) -> Any:
    """``layers`` Hugging Face LlamaDecoderLayers with the model's rotary embedding, as LlamaModel runs them."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = hf_llama_config(hidden, layers, seq)

    class Stack(torch.nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(layers))
            self.rotary = LlamaRotaryEmbedding(config)

        def forward(self, x: Any) -> Any:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            embeddings = self.rotary(x, positions)
            for layer in self.layers:
                out = layer(x, position_embeddings=embeddings, position_ids=positions)
                x = out[0] if isinstance(out, tuple) else out
            return x

    return Stack()


def layer_target(
    emit: Emit, hidden: int, seq: int, batches: tuple[int, ...], modes: tuple[str, ...], quick: bool
) -> None:
    """``hf``: the bare stack. ``z3``: the same stack inside a ZeRO-3 engine (a GPU-side client optimizer:
    only DeepSpeed's parameter hooks and gradient partitioning differ). ``z3_offload``: ZeRO-3 with
    offload_optimizer cpu, as the measured runs (backward also moves the gradients to the host). Each timed
    pass: synchronise, forward, synchronise (fwd), backward of mean(out^2), synchronise (fwd_bwd); the
    engine's step() and the bare stack's grad reset run outside the timed region."""
    import torch

    from .llama import default_kv_heads, swiglu_ffn

    torch.manual_seed(0)
    stack = build_hf_stack(torch, hidden, LAYER_STACK, seq).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for name, param in stack.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    heads = hidden // 128
    shape_base = {
        "seq": seq,
        "heads": heads,
        "kv_heads": default_kv_heads(heads),
        "head_dim": 128,
        "hidden": hidden,
        "ffn": swiglu_ffn(hidden),
        "layers": LAYER_STACK,
    }
    for mode in modes:
        forward, backward, after = _layer_callables(torch, stack, mode)
        repeats = 6 if quick else 12
        for batch in batches:
            x = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            fwd_s: list[float] = []
            fwd_bwd_s: list[float] = []
            for index in range(3 + repeats):
                torch.cuda.synchronize()
                start_s = time.perf_counter()
                out = forward(x)
                torch.cuda.synchronize()
                mid_s = time.perf_counter()
                backward(out.float().pow(2).mean())
                torch.cuda.synchronize()
                end_s = time.perf_counter()
                after()
                x.grad = None
                if index >= 3:
                    fwd_s.append((mid_s - start_s) / LAYER_STACK)
                    fwd_bwd_s.append((end_s - start_s) / LAYER_STACK)
            shape = shape_base | {"batch": batch}
            emit(("layer", f"{mode}_fwd", "bf16", fwd_s, shape))
            emit(("layer", f"{mode}_fwd_bwd", "bf16", fwd_bwd_s, shape))


def _layer_callables(torch: Any, stack: Any, mode: str) -> tuple[Any, Any, Any]:
    """(forward, backward, after) for the bare stack or a DeepSpeed ZeRO-3 engine around it."""
    if mode == "hf":

        def backward(loss: Any) -> None:
            loss.backward()

        def after() -> None:
            for param in stack.parameters():
                param.grad = None

        return stack, backward, after
    setup_single_process_env()
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl")
    from .offload_configs import OFFLOAD_MODES, zero_config

    if mode in OFFLOAD_MODES:  # ZeRO-2 offload / ZeRO-Infinity around the same stack (offload_layer_bench)
        sgd = torch.optim.SGD(stack.parameters(), lr=1e-5)
        engine, _, _, _ = deepspeed.initialize(model=stack, optimizer=sgd, config=zero_config(mode))
        return engine, engine.backward, engine.step
    zero: dict[str, Any] = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 100_000_000,
    }
    ds_config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
        "zero_optimization": zero,
    }
    if mode == "z3_offload":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        ds_config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        }
        engine, _, _, _ = deepspeed.initialize(model=stack, model_parameters=stack.parameters(), config=ds_config)
    else:
        # A client torch optimizer on the GPU: DeepSpeed's own "AdamW" would JIT-build FusedAdam here.
        optimizer = torch.optim.AdamW(stack.parameters(), lr=1e-5)
        engine, _, _, _ = deepspeed.initialize(model=stack, optimizer=optimizer, config=ds_config)

    def engine_backward(loss: Any) -> None:
        engine.backward(loss)

    return engine, engine_backward, engine.step


# ---------------------------------------------------------------------------------------------- ds_step_fixed

# The model of the step-fixed section: the measured runs' Llama (sosim/calibrate/llama.py), 8 layers of
# hidden 2048 (the "0.5b" size of scripts/ds_train_step.py), seq 2048, micro-batch 2.
STEP_FIXED_MODEL = (8, 2048)


def step_fixed_plan(quick: bool) -> list[tuple[str, int]]:
    """(system, sub_group_size): two sub-group sizes separate the per-step from the per-sub-group part."""
    plan = [("zero3", 100_000_000), ("superoffload", 100_000_000), ("zero3", 25_000_000)]
    return plan[:2] if quick else plan


def bench_ds_step_fixed(
    torch: Any, table: Table, quick: bool, out_dir: Path | None = None, log: TextIO = sys.stderr
) -> None:
    problems = []
    for system, sub_group_size in step_fixed_plan(quick):
        rows, problem = run_isolated(
            step_fixed_target,
            {
                "system": system,
                "sub_group_size": sub_group_size,
                "steps": 5 if quick else 8,
                "affinity_path": str(out_dir / "affinities.json") if out_dir and system == "superoffload" else "",
            },
            timeout_s=150,
            log=log,
        )
        add_rows(table, rows)
        _report(f"ds_step_fixed {system} sg{sub_group_size:g}", rows, problem, log)
        if problem:
            problems.append(f"{system}: {problem}")
    if problems:
        raise RuntimeError("; ".join(problems))


def step_fixed_target(emit: Emit, system: str, sub_group_size: int, steps: int, affinity_path: str) -> None:
    """engine.step() of ZeRO-3 offload / SuperOffload with DeepSpeed's optimizer methods timed from inside
    (ds_timers.MethodTimers). Row ``ds_step_fixed/<system>`` = step() minus the worker wait, the Adam and the
    refresh; the other rows are the pieces, each summed over the step's sub-groups."""
    import torch

    from . import llama
    from .ds_timers import MethodTimers, fixed_part_s

    setup_single_process_env()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl")
    layers, hidden = STEP_FIXED_MODEL
    heads = hidden // 128
    shape = llama.LlamaShape(layers, hidden, heads, llama.default_kv_heads(heads), llama.swiglu_ffn(hidden), 32000)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = llama.LlamaModel(shape, checkpoint_layers=True)
    model = model.to(torch.bfloat16)
    llama.init_weights_(model)
    offload: dict[str, Any] = {"device": "cpu", "pin_memory": True}
    if system == "superoffload":
        offload |= {"super_offload": True, "ratio": 1.0, "cpuadam_cores_perc": CPUADAM_CORES_PERC}
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "gradient_clipping": 0.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        },
        "steps_per_print": 10**9,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": offload,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": sub_group_size,
        },
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    affinity: dict[str, Any] = {}
    if affinity_path:
        affinity["after_initialize"] = process_affinity_report(torch)
    timers = MethodTimers()
    timers.wrap(engine.optimizer)
    subgroups = len(getattr(engine.optimizer, "fp16_groups", []))
    tokens = torch.randint(0, 32000, (2, 2048), device="cuda")
    labels = torch.roll(tokens, -1, dims=1)
    samples: dict[str, list[float]] = {}
    for index in range(2 + steps):
        loss = engine(tokens, labels)
        engine.backward(loss)
        torch.cuda.synchronize()
        timers.take()  # drop what backward charged (partition_grads): only step() is recorded here
        start_s = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        step_s = time.perf_counter() - start_s
        inside = timers.take()
        if index < 2:
            continue
        samples.setdefault("step_wall", []).append(step_s)
        samples.setdefault("fixed", []).append(fixed_part_s(inside))
        for name, (seconds, _calls) in inside.items():
            samples.setdefault(name, []).append(seconds)
    params = shape.params_count()
    dims = {"elements": params, "subgroups": subgroups, "threads": len(os.sched_getaffinity(0))}
    emit(("ds_step_fixed", system, "bf16", samples["fixed"], dims))
    for name in (
        "step_wall",
        "opt_step",
        "wait_async",
        "pre_step",
        "partition_all",
        "overflow_check",
        "norm",
        "unscale_clip",
        "optimizer",
        "refresh",
        "post_step",
    ):
        if name in samples and any(value > 0 for value in samples[name]):
            emit(("ds_step_fixed", f"{system}_{name}", "bf16", samples[name], dims))
    if affinity_path:
        affinity["after_steps"] = process_affinity_report(torch)
        affinity["cpuadam_cores_perc"] = CPUADAM_CORES_PERC
        affinity["what"] = (
            "Cpus_allowed_list of every thread of the main process and of SuperOffload's worker, after "
            "deepspeed.initialize with super_offload and after the timed steps (one H200, world size 1)"
        )
        Path(affinity_path).write_text(json.dumps(affinity, indent=2) + "\n")
    engine.destroy()


# ---------------------------------------------------------------------------------------------- so_worker


def so_worker_sizes(quick: bool) -> tuple[int, ...]:
    return (10**7, 10**8) if quick else (10**7, 5 * 10**7, 10**8, 2 * 10**8)


def bench_so_worker(torch: Any, table: Table, quick: bool, log: TextIO = sys.stderr) -> None:
    rows, problem = run_isolated(so_worker_target, {"quick": quick}, timeout_s=150, log=log)
    add_rows(table, rows)
    _report("so_worker", rows, problem, log)
    if problem:
        raise RuntimeError(problem)


def so_worker_target(emit: Emit, quick: bool, variants: tuple[str, ...] = ("alone", "with_copies")) -> None:
    """SuperOffload's worker round trip, with DeepSpeed's own class: SuperOffloadCPUOptimizer (it spawns the
    worker and sets the affinities), async_step() of one sub-group as partition_grads does, then polling
    get_result() and copying the updated parameter back as _reassign_or_swap_out_partitioned_parameters_async
    does. ``alone``: nothing else runs. ``with_copies``: a thread of the main process meanwhile runs what the
    main process does during backward, pinned fp32 D2H gradient copies and fp32->bf16 host casts."""
    import threading

    import torch
    from deepspeed.runtime.superoffload.superoffload_utils import SuperOffloadCPUOptimizer

    cores = sorted(os.sched_getaffinity(0))
    _, worker_cores = superoffload_split(cores)
    sizes = so_worker_sizes(quick)
    optimizer = SuperOffloadCPUOptimizer(
        optimizer_config=[{"lr": 1e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False}],
        cpuadam_cores_perc=CPUADAM_CORES_PERC,
        max_grad_numel=max(sizes),
        pin_memory=True,
    )
    try:
        params = {n: torch.randn(n, dtype=torch.float32) for n in sizes}
        # Pinned like DeepSpeed's fp32 gradient buffers (initialize_optimizer_states with pin_memory).
        grads = {n: torch.randn(n, dtype=torch.float32) * 1e-3 for n in sizes}
        if torch.cuda.is_available():
            grads = {n: grad.pin_memory() for n, grad in grads.items()}

        def round_trip(sub_group_id: int, elements: int) -> float:
            start_s = time.perf_counter()
            optimizer.async_step(0, sub_group_id, params[elements], grads[elements], lr=1e-5)
            while True:
                result = optimizer.get_result()
                if result is not None:
                    break
                time.sleep(0.0002)
            params[elements].copy_(result["updated_param"], non_blocking=True)
            return time.perf_counter() - start_s

        for variant in variants:
            stop = threading.Event()
            background: threading.Thread | None = None
            if variant == "with_copies":

                def main_process_traffic(stop: threading.Event = stop) -> None:
                    gpu_grads = torch.randn(10**8, device="cuda")
                    host_grads = torch.empty(10**8, dtype=torch.float32).pin_memory()
                    host_fp32 = torch.randn(10**8)
                    while not stop.is_set():
                        host_grads.copy_(gpu_grads, non_blocking=True)
                        torch.cuda.synchronize()
                        host_fp32.to(torch.bfloat16)

                background = threading.Thread(target=main_process_traffic, daemon=True)
                background.start()
                time.sleep(1.0)
            for sub_group_id, elements in enumerate(sizes):
                repeats = 4 if elements >= 10**8 else 8
                times_s = [round_trip(sub_group_id, elements) for _ in range(1 + repeats)][1:]
                emit(
                    (
                        "so_worker",
                        variant,
                        "fp32",
                        times_s,
                        {"elements": elements, "threads": len(worker_cores)},
                    )
                )
            stop.set()
            if background is not None:
                background.join(timeout=30)
    finally:
        optimizer.close()
