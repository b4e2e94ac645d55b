"""Section ``instep``: host-side components timed inside short real DeepSpeed steps (issue 23 item 1).

The isolated sections (ds_refresh, so_worker, ...) time one DeepSpeed access pattern alone; what a step pays
can differ (page state, CPU Adam's memory traffic beside it, the order of work). This section runs short real
steps of a small Llama (the ds_step_fixed model: 8 layers of hidden 2048, seq 2048, micro-batch 2) under each
system, one spawned child per system (isolate.run_isolated), and times from inside, per step:

- the phases, without barriers between them (a real step's order and overlap): ``step_wall`` (synchronised
  at the end), ``fwd`` / ``bwd`` / ``opt`` the host's time to return from each (the 2026-12-01 lease's section
  still synchronised after every phase);
- DeepSpeed's optimizer methods (ds_timers.MethodTimers: the refresh, the norm, the worker wait, the flush
  ``partition_grads``, ...), the backward ones and the step() ones kept apart (``bwd_<name>``, ``<name>``);
- stage 3's module hooks, fetch and release (z3_hooks.HookTimers) per phase, with call counts.

Rows: ``instep/<system>_<component>@<part>`` in measurements.csv (times = per-step values; elements = the
model's parameters, subgroups, threads, layers), for part ``all`` and for the run's ``start`` / ``middle`` /
``end`` thirds so that drift and outliers show; ``<component>_calls`` rows carry call counts. The same numbers,
one line per (system, component, part), go to ``instep.csv`` beside measurements.csv (:func:`write_instep_csv`),
which the profile writer reads. For zero3 and superoffload the section also writes the ``ds_step_fixed`` rows
exactly as that section does (step() minus the wait, the Adam and the refresh), so a quick run replaces it.
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from .isolate import Emit, run_isolated
from .records import Table

INSTEP_SYSTEMS: tuple[str, ...] = ("zero2", "zero3", "zero3_param", "superoffload")
INSTEP_MODEL = (8, 2048)  # layers, hidden: ds_bench.STEP_FIXED_MODEL, the measured runs' "0.5b"
INSTEP_SEQ, INSTEP_BATCH = 2048, 2
PARTS: tuple[str, ...] = ("all", "start", "middle", "end")
INSTEP_COLUMNS: tuple[str, ...] = (
    "system", "component", "part", "median_s", "p10_s", "p90_s", "n_steps", "layers", "hidden", "seq",
    "micro_batch", "params", "subgroups", "threads", "deepspeed_version",
)


def instep_steps(quick: bool) -> int:
    return 6 if quick else 12


def split_parts(values: list[float]) -> dict[str, list[float]]:
    """all, and the first / middle / last third of the run (at least one value each when there are >= 3)."""
    n = len(values)
    third = max(1, n // 3)
    return {"all": list(values), "start": values[:third], "middle": values[third : n - third] or values[:],
            "end": values[n - third :]}


def ds_config_for(system: str) -> dict[str, Any]:
    """The DeepSpeed config of one system, as scripts/ds_train_step.py writes it (clip 0, sub-group 1e8)."""
    offload: dict[str, Any] = {"device": "cpu", "pin_memory": True}
    zero: dict[str, Any] = {"overlap_comm": True, "contiguous_gradients": True}
    if system == "zero2":
        zero |= {"stage": 2, "offload_optimizer": offload}
    else:
        if system == "superoffload":
            offload = offload | {"super_offload": True, "ratio": 1.0, "cpuadam_cores_perc": 0.8}
        zero |= {"stage": 3, "offload_optimizer": offload, "sub_group_size": 100_000_000}
        if system == "zero3_param":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": INSTEP_BATCH,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.0}},
        "steps_per_print": 10**9,
        "zero_optimization": zero,
    }


def bench_instep(torch: Any, table: Table, quick: bool, out_dir: Path | None = None,
                 log: TextIO = sys.stderr) -> None:
    problems = []
    for system in INSTEP_SYSTEMS:
        rows, problem = run_isolated(instep_target, {"system": system, "steps": instep_steps(quick)},
                                     timeout_s=150, log=log)
        for op, variant, dtype, times_s, shape in rows:
            table.add(op, variant, dtype, list(times_s), **shape)
        print(f"[calibrate] instep {system}: {len(rows)} rows{'; ' + problem if problem else ''}", file=log,
              flush=True)
        if problem:
            problems.append(f"{system}: {problem}")
    if out_dir is not None:
        write_instep_csv(table.rows, out_dir / "instep.csv", _deepspeed_version())
    if problems:
        raise RuntimeError("; ".join(problems))


def _deepspeed_version() -> str:
    try:
        import deepspeed  # type: ignore[import-not-found]

        return str(deepspeed.__version__)
    except Exception:  # DeepSpeed missing in the parent: the children said so already
        return ""


def write_instep_csv(rows: list[dict[str, str]], path: Path, deepspeed_version: str = "") -> int:
    """One line per instep row of measurements.csv (variant ``<system>_<component>@<part>``); returns the count."""
    out = []
    for row in rows:
        if row.get("op") != "instep" or "@" not in row.get("variant", ""):
            continue
        head, part = row["variant"].rsplit("@", 1)
        system = next((s for s in sorted(INSTEP_SYSTEMS, key=len, reverse=True) if head.startswith(s + "_")), "")
        if not system:
            continue
        out.append({
            "system": system, "component": head[len(system) + 1 :], "part": part,
            "median_s": row.get("median_s", ""), "p10_s": row.get("p10_s", ""), "p90_s": row.get("p90_s", ""),
            "n_steps": row.get("n_samples", ""), "layers": row.get("layers", ""), "hidden": row.get("hidden", ""),
            "seq": row.get("seq", ""), "micro_batch": row.get("batch", ""), "params": row.get("elements", ""),
            "subgroups": row.get("subgroups", ""), "threads": row.get("threads", ""),
            "deepspeed_version": deepspeed_version,
        })
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(INSTEP_COLUMNS))
        writer.writeheader()
        writer.writerows(out)
    return len(out)


def step_values(phases: dict[str, dict[str, tuple[float, int]]], walls: dict[str, float],
                fixed_part: Any) -> dict[str, float]:
    """One step's components: phase walls, the optimizer timers of backward (bwd_<name>) and of step(), the hook
    timers summed over the phases (with <name>_calls) and the outermost hook work per phase (hook_total_<p>)."""
    out = dict(walls)
    for name, (seconds, calls) in phases.get("bwd_methods", {}).items():
        out[f"bwd_{name}"] = seconds
        out[f"bwd_{name}_calls"] = float(calls)
    step_methods = phases.get("opt_methods", {})
    for name, (seconds, calls) in step_methods.items():
        out[name] = seconds
        out[f"{name}_calls"] = float(calls)
    out["fixed"] = fixed_part(step_methods)
    outermost = ("hook_fwd_pre", "hook_fwd_post", "hook_bwd_pre_setup", "hook_bwd_post_setup", "pre_bwd", "post_bwd")
    for phase in ("fwd", "bwd", "opt"):
        taken = phases.get(f"{phase}_hooks", {})
        for name, (seconds, calls) in taken.items():
            out[name] = out.get(name, 0.0) + seconds
            out[f"{name}_calls"] = out.get(f"{name}_calls", 0.0) + calls
        out[f"hook_total_{phase}"] = sum(taken.get(n, (0.0, 0))[0] for n in outermost)
    return out


def instep_target(emit: Emit, system: str, steps: int, model_dims: tuple[int, int] | None = None,
                  seq: int = INSTEP_SEQ) -> None:
    import torch

    from . import llama
    from .ds_bench import setup_single_process_env
    from .ds_timers import MethodTimers, fixed_part_s
    from .z3_hooks import HookTimers, model_counts

    setup_single_process_env()
    import deepspeed

    # DS_ACCELERATOR=cpu: a smoke test of this code on a machine without a GPU (gloo; its times mean nothing).
    on_cpu = os.environ.get("DS_ACCELERATOR") == "cpu"
    device = "cpu" if on_cpu else "cuda"
    deepspeed.init_distributed(dist_backend="gloo" if on_cpu else "nccl")
    layers, hidden = model_dims if model_dims is not None else INSTEP_MODEL
    heads = hidden // 128
    shape = llama.LlamaShape(layers, hidden, heads, llama.default_kv_heads(heads), llama.swiglu_ffn(hidden), 32000)
    torch.manual_seed(0)
    with torch.device(device):
        model = llama.LlamaModel(shape, checkpoint_layers=True)
    model = model.to(torch.bfloat16)
    llama.init_weights_(model)
    counts = model_counts(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config_for(system))
    methods = MethodTimers()
    methods.wrap(engine.optimizer)
    hooks = HookTimers(MethodTimers())
    hooks.attach(engine)
    subgroups = len(getattr(engine.optimizer, "fp16_groups", []) or getattr(engine.optimizer, "bit16_groups", []))
    tokens = torch.randint(0, 32000, (INSTEP_BATCH, seq), device=device)
    labels = torch.roll(tokens, -1, dims=1)
    samples: dict[str, list[float]] = {}

    def sync() -> None:
        if not on_cpu:
            torch.cuda.synchronize()

    for index in range(2 + steps):
        sync()
        methods.take()
        hooks.take()
        phases: dict[str, dict[str, tuple[float, int]]] = {}
        t0 = time.perf_counter()
        loss = engine(tokens, labels)
        # No barrier between the phases: the host work is timed as a real step runs it (a refresh after a
        # synchronised backward cost up to 1.25x the unsynced steps' on the 2026-12-01 lease); fwd / bwd are then
        # the host's time to return from each phase, step_wall the whole step.
        t1 = time.perf_counter()
        phases["fwd_hooks"] = hooks.take()
        engine.backward(loss)
        t2 = time.perf_counter()
        phases["bwd_hooks"], phases["bwd_methods"] = hooks.take(), methods.take()
        engine.step()
        sync()
        t3 = time.perf_counter()
        phases["opt_hooks"], phases["opt_methods"] = hooks.take(), methods.take()
        if index < 2:
            continue
        walls = {"step_wall": t3 - t0, "fwd": t1 - t0, "bwd": t2 - t1, "opt": t3 - t2}
        for name, value in step_values(phases, walls, fixed_part_s).items():
            samples.setdefault(name, []).append(value)
    dims = {"elements": shape.params_count(), "subgroups": subgroups, "threads": len(os.sched_getaffinity(0)),
            "layers": layers, "hidden": hidden, "seq": seq, "batch": INSTEP_BATCH}
    for row in instep_rows(system, samples, counts, dims):
        emit(row)
    engine.destroy()


def instep_rows(system: str, samples: dict[str, list[float]], counts: Mapping[str, int],
                dims: Mapping[str, float]) -> list[Any]:
    """The section's rows from one system's per-step samples: instep/<system>_<name>@<part> (positive medians
    only), the model's counts, and for zero3 / superoffload the ds_step_fixed rows."""
    rows: list[Any] = []
    for name, values in samples.items():
        for part, chunk in split_parts(values).items():
            # Why only positive medians: sosim's calibration table refuses a row whose median_s is 0 (a method
            # this system never calls, a part of the run where it did not run), and one such row would make
            # the whole measurements.csv, and the profile naming it, unreadable.
            if chunk and statistics.median(chunk) > 0:
                rows.append(("instep", f"{system}_{name}@{part}", "bf16", chunk, dims))
    for key, value in counts.items():
        if value > 0:
            rows.append(("instep", f"{system}_{key}@all", "count", [float(value)], dims))
    if system in ("zero3", "superoffload"):
        # The ds_step_fixed section's rows, from the same steps (its model, sub-group size and timers).
        fixed_dims = {"elements": dims["elements"], "subgroups": dims["subgroups"], "threads": dims["threads"]}
        if samples.get("fixed") and statistics.median(samples["fixed"]) > 0:
            rows.append(("ds_step_fixed", system, "bf16", samples["fixed"], fixed_dims))
        for name in ("step_wall", "opt_step", "wait_async", "pre_step", "partition_all", "overflow_check", "norm",
                     "unscale_clip", "optimizer", "refresh", "post_step"):
            key = "opt" if name == "step_wall" else name  # ds_step_fixed's step_wall is step() alone
            if samples.get(key) and statistics.median(samples[key]) > 0:
                rows.append(("ds_step_fixed", f"{system}_{name}", "bf16", samples[key], fixed_dims))
    return rows
