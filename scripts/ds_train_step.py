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

Single process, world size 1, rendezvous on 127.0.0.1 only. Example:
  python3 scripts/ds_train_step.py --config zero2 --size 1.1b --seq 2048 --micro-batch 4 --out calibration/x
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import random
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
    "1.1b": (22, 2048),
    "2.0b": (10, 4096),
    "3.8b": (20, 4096),
}
VOCAB = 32000
CONFIGS: tuple[str, ...] = ("floor", "zero2", "zero3", "superoffload")

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
)


def load_llama_module() -> Any:
    """sosim.calibrate.llama if sosim imports; else the file itself, so this script never needs the
    simulator's dependencies (pydantic, simpy, ...) on the GPU machine."""
    try:
        from sosim.calibrate import llama

        return llama
    except Exception:  # any failure of the package import: use the file
        import importlib.util

        path = Path(__file__).resolve().parents[1] / "sosim" / "calibrate" / "llama.py"
        spec = importlib.util.spec_from_file_location("sosim_llama_standalone", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


def ds_config(
    config: str, micro_batch: int, clip: float, sub_group_size: int, ratio: float, cores_perc: float
) -> dict[str, Any]:
    """The exact DeepSpeed JSON config of one run (recorded verbatim next to the timings)."""
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
    else:
        raise ValueError(f"no DeepSpeed config for {config!r}")
    return base | {"zero_optimization": zero}


def setup_single_process_env() -> None:
    """World size 1 over loopback; a random port so back-to-back runs never collide on TIME_WAIT."""
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
    layers, hidden = (2, 256) if args.tiny else SIZES[args.size]
    heads = hidden // 128
    shape = llama.LlamaShape(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=llama.default_kv_heads(heads),
        ffn=llama.swiglu_ffn(hidden),
        vocab=VOCAB,
    )
    torch.manual_seed(1234)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(0)
    with device:
        model = llama.LlamaModel(shape, checkpoint_layers=True)
    model = model.to(torch.bfloat16)
    llama.init_weights_(model)
    model.train()
    tokens = torch.randint(0, VOCAB, (args.micro_batch, args.seq), device=device)
    labels = torch.roll(tokens, -1, dims=1)

    config_dict: dict[str, Any] | None = None
    deepspeed_version = ""
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
        if not on_gpu:
            raise ValueError("DeepSpeed configurations need --device cuda")
        setup_single_process_env()
        import deepspeed  # type: ignore[import-not-found]

        deepspeed_version = deepspeed.__version__
        deepspeed.init_distributed(dist_backend="nccl")
        config_dict = ds_config(
            args.config, args.micro_batch, args.clip, int(args.sub_group_size), args.ratio, args.cores_perc
        )
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config_dict
        )

        def forward() -> Any:
            return engine(tokens, labels)

        def backward(loss: Any) -> None:
            engine.backward(loss)

        def optimizer_step() -> None:
            engine.step()

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    def one_step(phased: bool) -> tuple[float, float, float, float]:
        """(total, fwd, bwd, step) seconds; phase times are NaN when not phased."""
        sync()
        start_s = time.perf_counter()
        loss = forward()
        if phased:
            sync()
        fwd_end_s = time.perf_counter()
        backward(loss)
        if phased:
            sync()
        bwd_end_s = time.perf_counter()
        optimizer_step()
        sync()
        end_s = time.perf_counter()
        if not phased:
            return end_s - start_s, float("nan"), float("nan"), float("nan")
        return end_s - start_s, fwd_end_s - start_s, bwd_end_s - fwd_end_s, end_s - bwd_end_s

    for _ in range(args.warmup):
        one_step(phased=True)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    phased = [one_step(phased=True) for _ in range(args.steps)]
    unsynced = [one_step(phased=False) for _ in range(args.steps)]
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()  # closes SuperOffload's worker process cleanly before the next run starts
    return {
        "shape": shape,
        "params": shape.params_count(),
        "config_dict": config_dict,
        "phased": phased,
        "unsynced": unsynced,
        "peak_gib": peak_gib,
        "torch_version": torch.__version__,
        "deepspeed_version": deepspeed_version,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
    }


def rows_for(
    args: argparse.Namespace, run_id: str, result: dict[str, Any], config_file: str
) -> list[dict[str, str]]:
    shape = result["shape"]
    offload = (result["config_dict"] or {}).get("zero_optimization", {}).get("offload_optimizer", {})
    common = {
        "run_id": run_id,
        "config": args.config,
        "zero_stage": str((result["config_dict"] or {}).get("zero_optimization", {}).get("stage", "")),
        "offload_optimizer": offload.get("device", ""),
        "super_offload": str(offload.get("super_offload", "")),
        "ratio": str(offload.get("ratio", "")),
        "cpuadam_cores_perc": str(offload.get("cpuadam_cores_perc", "")),
        "sub_group_size": str(
            (result["config_dict"] or {}).get("zero_optimization", {}).get("sub_group_size", "")
        ),
        "gradient_clipping": "" if args.config == "floor" else str(args.clip),
        "model": args.size,
        "layers": str(shape.layers),
        "hidden": str(shape.hidden),
        "heads": str(shape.heads),
        "kv_heads": str(shape.kv_heads),
        "head_dim": str(shape.head_dim),
        "ffn": str(shape.ffn),
        "vocab": str(shape.vocab),
        "seq": str(args.seq),
        "micro_batch": str(args.micro_batch),
        "params": str(result["params"]),
        "activation_checkpointing": "true",
        "warmup_steps": str(args.warmup),
        "n_steps": str(args.steps),
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
    }
    rows = []
    for timing in ("phased", "unsynced"):
        steps = result[timing]
        totals = [s[0] for s in steps]
        row = dict(common, timing=timing)
        median_s = statistics.median(totals)
        row |= {
            "step_median_s": f"{median_s:.6f}",
            "step_p10_s": f"{percentile(totals, 0.1):.6f}",
            "step_p90_s": f"{percentile(totals, 0.9):.6f}",
            "tokens_per_s": f"{args.micro_batch * args.seq / median_s:.1f}",
        }
        if timing == "phased":
            for index, name in ((1, "fwd_median_s"), (2, "bwd_median_s"), (3, "optimizer_step_median_s")):
                row[name] = f"{statistics.median(s[index] for s in steps):.6f}"
        rows.append(row)
    return rows


def append_rows(csv_path: Path, rows: list[dict[str, str]]) -> None:
    new_file = not csv_path.exists()
    with csv_path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS), restval="")
        if new_file:
            writer.writeheader()
        writer.writerows(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.0, help="gradient_clipping (0 = off)")
    parser.add_argument("--sub-group-size", type=float, default=1e8, help="ZeRO-3 sub_group_size")
    parser.add_argument(
        "--ratio", type=float, default=1.0, help="superoffload: fraction of sub-groups on CPU"
    )
    parser.add_argument("--cores-perc", type=float, default=0.8, help="superoffload: cpuadam_cores_perc")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="'cpu' only to smoke-test the floor config")
    parser.add_argument("--tiny", action="store_true", help="2-layer, hidden-256 model: smoke tests only")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(exist_ok=True)
    clip_tag = f"-clip{args.clip:g}" if args.config != "floor" else ""
    size_tag = "tiny" if args.tiny else args.size
    run_id = f"{size_tag}-s{args.seq}-mb{args.micro_batch}-{args.config}{clip_tag}"
    if args.config == "superoffload" and args.ratio != 1.0:
        run_id += f"-ratio{args.ratio:g}"
    start_s = time.perf_counter()
    try:
        result = run(args)
    except Exception as error:  # a failed run is data too: record why
        traceback.print_exc()
        layers, hidden = SIZES[args.size]
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
                    "status": "failed",
                    "error": f"{type(error).__name__}: {error}"[:300].replace("\n", " "),
                }
            ],
        )
        return 1
    config_file = ""
    if result["config_dict"] is not None:
        config_file = f"runs/{run_id}.ds_config.json"
        (args.out / config_file).write_text(json.dumps(result["config_dict"], indent=2) + "\n")
    raw = {
        "run_id": run_id,
        "args": {k: str(v) for k, v in vars(args).items()},
        "shape": result["shape"].as_dict(),
        "wall_s": time.perf_counter() - start_s,
        "phased_steps_s": result["phased"],
        "unsynced_steps_s": result["unsynced"],
        "ds_config": result["config_dict"],
    }
    (args.out / "runs" / f"{run_id}.json").write_text(json.dumps(raw, indent=2) + "\n")
    rows = rows_for(args, run_id, result, config_file)
    append_rows(args.out / "deepspeed_steps.csv", rows)
    for row in rows:
        print(
            f"[ds] {run_id} {row['timing']}: step {row['step_median_s']} s (p10 {row['step_p10_s']}, "
            f"p90 {row['step_p90_s']}) fwd {row.get('fwd_median_s', '')} bwd {row.get('bwd_median_s', '')} "
            f"opt {row.get('optimizer_step_median_s', '')} peak {row['gpu_mem_peak_gib']} GiB",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    # The guard matters: SuperOffload starts its CPU-Adam worker with the 'spawn' method, which re-imports
    # this file in the child; nothing may run at import time.
    raise SystemExit(main())
