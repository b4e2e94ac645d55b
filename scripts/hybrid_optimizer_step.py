"""Time the optimizer step of Megatron-Core's HybridDeviceOptimizer as its code does it, with torch only (no
Megatron-Core on the lent machine): a component measurement for sosim's megatron_offload, not a Megatron step.

What is reproduced (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py, read 2026-12): the first
parameters up to ``--fraction`` of the elements get pinned fp32 CPU copies, each with its own
``torch.optim.AdamW(fused=True)`` when ``--overlap`` (one optimizer per parameter), else one for all; ``step()``
copies their fp32 gradients to pinned buffers (on a side stream with ``--overlap``, else on the compute stream,
one event per optimizer), steps the GPU part (torch's fused CUDA AdamW on fp32 master copies stands for
Transformer Engine's FusedAdam), then per CPU optimizer waits for its copy, steps it and copies each parameter
back into the bf16 GPU weight (``gpu_param.data.copy_(cpu_fp32, non_blocking=True)`` on an H2D stream that waits
for the compute stream). The model is sosim/calibrate/llama.py's, forward + backward included in the step.

  python3 scripts/hybrid_optimizer_step.py --size 1.1b --fraction 1.0 --overlap --out /tmp/hdo
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds_train_step as dsh

COLUMNS = ("run_id", "model", "layers", "hidden", "params", "seq", "micro_batch", "fraction", "overlap",
           "cpu_elements", "torch_threads", "n_steps", "step_median_s", "fwd_bwd_median_s", "optimizer_median_s",
           "torch_version", "device", "cpu_model", "date", "status", "error")


class Hybrid:
    """The HybridDeviceOptimizer step, as the module docstring describes it."""

    def __init__(self, torch: Any, params: list[Any], fraction: float, overlap: bool) -> None:
        self.torch, self.overlap = torch, overlap
        threshold = fraction * sum(p.numel() for p in params)
        placed = 0
        self.cpu: list[tuple[Any, Any, Any]] = []  # (gpu bf16 param, pinned fp32 copy, pinned fp32 grad)
        self.gpu: list[tuple[Any, Any]] = []  # (gpu bf16 param, fp32 master)
        for p in params:
            if placed < threshold:
                copy = p.detach().float().cpu().pin_memory()
                self.cpu.append((p, copy, torch.empty(copy.shape, dtype=torch.float32, pin_memory=True)))
                placed += p.numel()
            else:
                self.gpu.append((p, p.detach().float()))
        self.cpu_elements = placed
        adamw = torch.optim.AdamW
        if overlap:
            self.cpu_opts = [adamw([c], lr=1e-5, fused=True) for _, c, _ in self.cpu]
        else:
            self.cpu_opts = [adamw([c for _, c, _ in self.cpu], lr=1e-5, fused=True)] if self.cpu else []
        self.gpu_opt = adamw([m for _, m in self.gpu], lr=1e-5, fused=True) if self.gpu else None
        current = torch.cuda.current_stream()
        self.d2h = torch.cuda.Stream() if overlap else current
        self.h2d = torch.cuda.Stream() if overlap else current

    def step(self) -> None:
        torch = self.torch
        self.d2h.wait_stream(torch.cuda.current_stream())
        events = []
        with torch.cuda.stream(self.d2h):
            groups = [[entry] for entry in self.cpu] if self.overlap else ([self.cpu] if self.cpu else [])
            for group in groups:
                for p, copy, grad in group:
                    grad.copy_(p.grad, non_blocking=True)
                    copy.grad = grad
                events.append(self.d2h.record_event())
        for p, master in self.gpu:
            master.grad = p.grad.float()
        if self.gpu_opt is not None:
            self.gpu_opt.step()
            for p, master in self.gpu:
                p.data.copy_(master)
        for opt, event, group in zip(self.cpu_opts, events, groups, strict=True):
            event.synchronize()
            opt.step()
            self.h2d.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.h2d):
                for p, copy, _ in group:
                    p.data.copy_(copy, non_blocking=True)
            torch.cuda.current_stream().wait_event(self.h2d.record_event())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=dsh._size_arg, default="1.1b")
    parser.add_argument("--fraction", type=float, default=1.0, help="--optimizer-offload-fraction")
    parser.add_argument("--overlap", action="store_true", help="--overlap-cpu-optimizer-d2h-h2d")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not 0.0 <= args.fraction <= 1.0:
        print("--fraction must be in [0, 1]", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    run_id = f"{args.size}-s{args.seq}-mb{args.micro_batch}-hdo-f{args.fraction:g}" + ("-overlap" * args.overlap)
    row: dict[str, str] = {"run_id": run_id, "model": args.size, "seq": str(args.seq),
                           "micro_batch": str(args.micro_batch), "fraction": f"{args.fraction:g}",
                           "overlap": str(args.overlap).lower(), "date": dt.date.today().isoformat()}
    try:
        import torch

        llama = dsh.load_llama_module()
        shape = dsh.model_shape(argparse.Namespace(tiny=False, size=args.size), llama)
        with torch.device("cuda"):
            model = llama.LlamaModel(shape, checkpoint_layers=True).to(torch.bfloat16)
        llama.init_weights_(model)
        hybrid = Hybrid(torch, list(model.parameters()), args.fraction, args.overlap)
        tokens = torch.randint(0, shape.vocab, (args.micro_batch, args.seq), device="cuda")
        labels = torch.roll(tokens, -1, dims=1)
        totals, fwd_bwd, opt = [], [], []
        for i in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(tokens, labels).backward()
            torch.cuda.synchronize()
            mid = time.perf_counter()
            hybrid.step()
            for p in model.parameters():
                p.grad = None
            torch.cuda.synchronize()
            end = time.perf_counter()
            if i >= args.warmup:
                totals.append(end - start)
                fwd_bwd.append(mid - start)
                opt.append(end - mid)
        row |= {"layers": str(shape.layers), "hidden": str(shape.hidden), "params": str(shape.params_count()),
                "cpu_elements": str(hybrid.cpu_elements), "torch_threads": str(torch.get_num_threads()),
                "n_steps": str(len(totals)), "step_median_s": f"{statistics.median(totals):.6f}",
                "fwd_bwd_median_s": f"{statistics.median(fwd_bwd):.6f}",
                "optimizer_median_s": f"{statistics.median(opt):.6f}", "torch_version": torch.__version__,
                "device": torch.cuda.get_device_name(0), "cpu_model": dsh.cpu_model_name(), "status": "ok"}
        print(f"[hdo] {run_id}: step {row['step_median_s']} s, optimizer {row['optimizer_median_s']} s", flush=True)
    except Exception as error:  # a failed run is data too
        row |= {"status": "failed", "error": f"{type(error).__name__}: {error}"[:300].replace("\n", " ")}
        print(f"[hdo] {run_id}: failed: {row['error']}", flush=True)
    path = args.out / "hybrid_optimizer_steps.csv"
    new = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS), restval="")
        if new:
            writer.writeheader()
        writer.writerow(row)
    return 0 if row["status"] == "ok" else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
