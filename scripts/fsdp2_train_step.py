"""Measure real PyTorch FSDP2 training steps with CPUOffloadPolicy on one GPU (end-to-end truth for sosim).

One process = one (model size, configuration) run, torch only. It builds the Llama-style model of
sosim/calibrate/llama.py in fp32 (the master weights FSDP2 keeps on the CPU), applies ``fully_shard`` to
every decoder layer and then to the root (torchtitan's order: embed / norm / lm_head in the root unit),
with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` and
``CPUOffloadPolicy(pin_memory=...)``, and an AdamW on the CPU shards (``--adam`` for-loop / foreach /
fused: torch.optim.AdamW's three implementations). World size 1 via torch.distributed on 127.0.0.1
(nccl on cuda, gloo for the CPU smoke test).

What FSDP2 does with CPUOffloadPolicy (torch/distributed/fsdp/_fully_shard, torch 2.6+): each unit's
sharded fp32 parameters live on the CPU (pinned when pin_memory); before the unit runs they are copied to
the GPU (H2D, non_blocking), cast to bf16 and all-gathered; after forward the unit is resharded
(reshard_after_forward, root excepted) and gathered again in backward; each unit's fp32 gradient is
reduce-scattered and copied to the CPU (D2H) right after its backward, and the root's final backward
callback waits for those copies; the optimizer step then runs on the CPU shards.

It warms up, then times steps "unsynced" (one synchronize at the end of the step: the true step time) and
"phased" (synchronize after forward, backward and the optimizer step), and appends one CSV row per timing
mode to ``<out>/fsdp2_steps.csv`` (columns like scripts/ds_train_step.py's deepspeed_steps.csv, plus the
FSDP2 knobs and torch's thread count), and the raw per-step times as JSON under ``<out>/runs/``.

  python3 scripts/fsdp2_train_step.py --size 1.1b --adam fused --out /tmp/fsdp2
  python3 scripts/fsdp2_train_step.py --size 1.1b --adam foreach --no-pin-memory --out /tmp/fsdp2
  python3 scripts/fsdp2_train_step.py --tiny --device cpu --steps 2 --out /tmp/fsdp2_smoke   # gloo smoke test
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Shared with the DeepSpeed harness (torch-free at import): sizes, the custom-size syntax, helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds_train_step as dsh

ADAM_IMPLS: tuple[str, ...] = ("forloop", "foreach", "fused")
CSV_COLUMNS: tuple[str, ...] = (
    "run_id",
    "system",
    "timing",
    "cpu_offload",
    "pin_memory",
    "adam_impl",
    "torch_threads",
    "reshard_after_forward",
    "fsdp_units",
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
    "activation_offload",
    "warmup_steps",
    "n_steps",
    "step_median_s",
    "step_p10_s",
    "step_p90_s",
    "fwd_median_s",
    "bwd_median_s",
    "optimizer_step_median_s",
    "zero_grad_median_s",
    "fwd_p10_s",
    "fwd_p90_s",
    "bwd_p10_s",
    "bwd_p90_s",
    "optimizer_step_p10_s",
    "optimizer_step_p90_s",
    "tokens_per_s",
    "gpu_mem_peak_gib",
    "host_pinned_gib",
    "device",
    "cpu_model",
    "cpu_cores",
    "cpus_allowed",
    "torch_version",
    "date",
    "gpus",
    "lease",
    "status",
    "error",
)


def run_id_for(args: argparse.Namespace) -> str:
    size_tag = "tiny" if args.tiny else args.size
    run_id = f"{size_tag}-s{args.seq}-mb{args.micro_batch}-fsdp2"
    run_id += "-offload" if not args.no_offload else "-gpu"
    if not args.no_offload:
        run_id += "-pin" if args.pin_memory else "-nopin"
    run_id += f"-{args.adam}"
    if args.threads:
        run_id += f"-t{args.threads}"
    if args.no_reshard:
        run_id += "-noreshard"
    if args.no_ckpt:
        run_id += "-nockpt"
    if args.activation_offload:
        run_id += "-actoffload"
    return run_id


def init_process_group(torch: Any, on_gpu: bool) -> None:
    import torch.distributed as dist

    dsh.setup_single_process_env()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if on_gpu else "gloo", rank=0, world_size=1)


def build_optimizer(torch: Any, params: list[Any], impl: str) -> Any:
    """torch.optim.AdamW with the implementation named explicitly (the default on CPU tensors, and so on
    CPU-offloaded FSDP2 shards, is the for-loop: torch/optim/optimizer.py _default_to_fused_or_foreach
    picks foreach only for CUDA tensors)."""
    flags = {"forloop": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False},
             "fused": {"foreach": False, "fused": True}}[impl]
    return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, **flags)


def pinned_bytes(params: list[Any]) -> int:
    total = 0
    for param in params:
        local = param.to_local() if hasattr(param, "to_local") else param
        if local.device.type == "cpu" and local.is_pinned():
            total += local.numel() * local.element_size()
    return total


def fast_init_(torch: Any, model: Any) -> None:
    """Non-zero weights in seconds: a 1M-element random block (std 0.02) tiled over every local shard, ones
    for norms. Why not llama.init_weights_: CPU normal_ is serial, ~10 s per billion elements, on every run;
    the values do not change the step time (only zeros could, hence random)."""
    block = torch.randn(2**20, dtype=torch.float32) * 0.02
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            if name.endswith("norm.weight"):
                local.fill_(1.0)
                continue
            flat = local.view(-1)
            source = block.to(flat.device)
            for start in range(0, flat.numel(), source.numel()):
                length = min(source.numel(), flat.numel() - start)
                flat[start:start + length].copy_(source[:length])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    llama = dsh.load_llama_module()
    if args.threads:
        torch.set_num_threads(args.threads)
    on_gpu = args.device == "cuda"
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(0)
    init_process_group(torch, on_gpu)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (1,))
    shape = dsh.model_shape(args, llama)
    torch.manual_seed(1234)
    # fp32 on the meta device, then materialized where FSDP2 keeps the shards (torchtitan's flow): FSDP2
    # keeps the original dtype as the sharded (master) parameter and casts to param_dtype at all-gather;
    # the lazy init pins CPU shards materialized by to_empty (FSDPParam.reset_sharded_param).
    with torch.device("meta"):
        model = llama.LlamaModel(shape, checkpoint_layers=not args.no_ckpt)
    offload: Any = OffloadPolicy() if args.no_offload else CPUOffloadPolicy(pin_memory=args.pin_memory)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload,
                    reshard_after_forward=not args.no_reshard)
    # The root is not resharded after forward (its lm_head is needed first in backward), as torchtitan does.
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
    model.to_empty(device=device if args.no_offload else torch.device("cpu"))
    fast_init_(torch, model)
    model.train()
    params = list(model.parameters())
    optimizer = build_optimizer(torch, params, args.adam)
    generator = torch.Generator(device="cpu").manual_seed(1000)
    tokens = torch.randint(0, shape.vocab, (args.micro_batch, args.seq), generator=generator).to(device)
    labels = torch.roll(tokens, -1, dims=1)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    import contextlib

    def offload_context() -> Any:
        # torch.autograd.graph.save_on_cpu: every tensor autograd saves in forward is copied to pinned host
        # memory and copied back when backward needs it (PyTorch's activation offload, instead of recompute).
        if args.activation_offload:
            return torch.autograd.graph.save_on_cpu(pin_memory=True)
        return contextlib.nullcontext()

    def one_step(phased: bool) -> tuple[float, float, float, float, float]:
        """(total, fwd, bwd, optimizer step, zero_grad) seconds; phases NaN when not phased."""
        sync()
        start_s = time.perf_counter()
        with offload_context():
            loss = model(tokens, labels)
        if phased:
            sync()
        fwd_end_s = time.perf_counter()
        loss.backward()  # ends after the root's final callback has waited for every gradient D2H
        if phased:
            sync()
        bwd_end_s = time.perf_counter()
        optimizer.step()
        opt_end_s = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        sync()
        end_s = time.perf_counter()
        if not phased:
            nan = float("nan")
            return end_s - start_s, nan, nan, nan, nan
        return (end_s - start_s, fwd_end_s - start_s, bwd_end_s - fwd_end_s, opt_end_s - bwd_end_s,
                end_s - opt_end_s)

    for _ in range(args.warmup):
        one_step(phased=True)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    unsynced = [one_step(phased=False) for _ in range(args.steps)]
    phased = [one_step(phased=True) for _ in range(args.phased_steps)]
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    state_pinned = sum(pinned_bytes([t for t in s.values() if hasattr(t, "numel")])
                       for s in optimizer.state.values())
    result = {
        "shape": shape,
        "params": shape.params_count(),
        "fsdp_units": len(model.layers) + 1,
        "unsynced": unsynced,
        "phased": phased,
        "peak_gib": peak_gib,
        "host_pinned_gib": (pinned_bytes(params) + state_pinned) / 2**30,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "param_device": str(params[0].to_local().device if hasattr(params[0], "to_local") else params[0].device),
        "affinity": dsh.affinity_report(),
    }
    import torch.distributed as dist

    dist.destroy_process_group()
    return result


def _stat(values: list[float], q: float | None) -> str:
    finite = [v for v in values if v == v]
    if not finite:
        return ""
    return f"{statistics.median(finite) if q is None else dsh.percentile(finite, q):.6f}"


def rows_for(args: argparse.Namespace, run_id: str, result: dict[str, Any]) -> list[dict[str, str]]:
    shape = result["shape"]
    common = {
        "run_id": run_id,
        "system": "fsdp2_offload" if not args.no_offload else "fsdp2",
        "cpu_offload": "false" if args.no_offload else "true",
        "pin_memory": "" if args.no_offload else str(args.pin_memory).lower(),
        "adam_impl": args.adam,
        "torch_threads": str(result["torch_threads"]),
        "reshard_after_forward": str(not args.no_reshard).lower(),
        "fsdp_units": str(result["fsdp_units"]),
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
        "params": str(result["params"]),
        "activation_checkpointing": "false" if args.no_ckpt else "true",
        "activation_offload": str(args.activation_offload).lower(),
        "warmup_steps": str(args.warmup),
        "gpu_mem_peak_gib": f"{result['peak_gib']:.2f}",
        "host_pinned_gib": f"{result['host_pinned_gib']:.2f}",
        "device": result["device"],
        "cpu_model": dsh.cpu_model_name(),
        "cpu_cores": str(os.cpu_count()),
        "cpus_allowed": str(len(os.sched_getaffinity(0))),
        "torch_version": result["torch_version"],
        "date": dt.date.today().isoformat(),
        "gpus": "1",
        "lease": args.lease,
        "status": "ok",
        "error": "",
    }
    rows = []
    for timing in ("unsynced", "phased"):
        steps = result[timing]
        totals = [s[0] for s in steps]
        median_s = statistics.median(totals)
        row = dict(common, timing=timing, n_steps=str(len(totals)))
        row |= {
            "step_median_s": f"{median_s:.6f}",
            "step_p10_s": f"{dsh.percentile(totals, 0.1):.6f}",
            "step_p90_s": f"{dsh.percentile(totals, 0.9):.6f}",
            "tokens_per_s": f"{args.micro_batch * args.seq / median_s:.1f}",
        }
        if timing == "phased":
            for index, name in ((1, "fwd"), (2, "bwd"), (3, "optimizer_step")):
                values = [s[index] for s in steps]
                row[f"{name}_median_s"] = _stat(values, None)
                row[f"{name}_p10_s"] = _stat(values, 0.1)
                row[f"{name}_p90_s"] = _stat(values, 0.9)
            row["zero_grad_median_s"] = _stat([s[4] for s in steps], None)
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=dsh._size_arg, default="1.1b",
                        help=f"{', '.join(sorted(dsh.SIZES))}, or L<layers>h<hidden>a<heads>kv<kv_heads>f<ffn>")
    parser.add_argument("--adam", choices=ADAM_IMPLS, default="foreach",
                        help="torch.optim.AdamW implementation on the CPU shards (torchtitan's default: fused)")
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--pin-memory", dest="pin_memory", action="store_true", default=True,
                     help="CPUOffloadPolicy(pin_memory=True) (default)")
    pin.add_argument("--no-pin-memory", dest="pin_memory", action="store_false",
                     help="CPUOffloadPolicy(pin_memory=False): pageable host memory")
    parser.add_argument("--no-offload", action="store_true", help="plain FSDP2 on the GPU (the baseline)")
    parser.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False on the layers")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--no-ckpt", action="store_true", help="activation checkpointing off")
    parser.add_argument("--activation-offload", action="store_true",
                        help="torch.autograd.graph.save_on_cpu(pin_memory=True) around forward (needs --no-ckpt)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="timed steps without phase barriers")
    parser.add_argument("--phased-steps", type=int, default=3, help="timed steps with phase barriers")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="'cpu': gloo smoke test of the same code path (no timing meaning)")
    parser.add_argument("--tiny", action="store_true", help="2-layer, hidden-256 model: smoke tests only")
    parser.add_argument("--lease", default=os.environ.get("SOSIM_LEASE", ""), help="device lease id per row")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.activation_offload and not args.no_ckpt:
        print("--activation-offload replaces recomputation: give --no-ckpt too", file=sys.stderr)
        return 2
    if args.threads < 0:
        print("--threads must be >= 0", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(exist_ok=True)
    run_id = run_id_for(args)
    start_s = time.perf_counter()
    try:
        result = run(args)
    except Exception as error:  # a failed run is data too: record why
        traceback.print_exc()
        append_rows(args.out / "fsdp2_steps.csv", [{
            "run_id": run_id, "system": "fsdp2_offload", "adam_impl": args.adam,
            "pin_memory": str(args.pin_memory).lower(), "model": "tiny" if args.tiny else args.size,
            "seq": str(args.seq), "micro_batch": str(args.micro_batch), "lease": args.lease, "status": "failed",
            "error": f"{type(error).__name__}: {error}"[:300].replace("\n", " "),
        }])
        return 1
    raw = {
        "run_id": run_id,
        "args": {k: str(v) for k, v in vars(args).items()},
        "shape": result["shape"].as_dict(),
        "wall_s": time.perf_counter() - start_s,
        "param_device": result["param_device"],
        "unsynced_steps_s": result["unsynced"],
        "phased_steps_s": result["phased"],
        "affinity": result["affinity"],
    }
    (args.out / "runs" / f"{run_id}.json").write_text(json.dumps(raw, indent=1) + "\n")
    rows = rows_for(args, run_id, result)
    append_rows(args.out / "fsdp2_steps.csv", rows)
    for row in rows:
        print(f"[fsdp2] {run_id} {row['timing']}: step {row['step_median_s']} s (p10 {row['step_p10_s']}, "
              f"p90 {row['step_p90_s']}) fwd {row.get('fwd_median_s', '')} bwd {row.get('bwd_median_s', '')} "
              f"opt {row.get('optimizer_step_median_s', '')} threads {row['torch_threads']} "
              f"peak {row['gpu_mem_peak_gib']} GiB pinned {row['host_pinned_gib']} GiB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
