"""Time torch's CPU AdamW implementations (for-loop, foreach, fused) by threads and size, and the host<->GPU
copies FSDP2's CPU offload makes (pinned and pageable), for sosim's calibration. Torch only.

Cells (one CSV row each, ``<out>/torch_cpu_adam.csv``):
  op=cpu_adamw  impl=forloop|foreach|fused  variant=plain|dtensor  elements  threads
     one torch.optim.AdamW.step() over ``elements`` fp32 parameters split into tensors of
     ``--tensor-numel`` (a model's weight matrices: the for-loop pays per tensor), moments already
     created. variant=dtensor wraps every tensor as a 1-rank DTensor (Shard(0), gloo): what FSDP2's
     CPU-offloaded shards are, so the optimizer pays DTensor dispatch per op.
  op=copy  impl=h2d|d2h  variant=pinned|pageable  bytes   (with --device cuda only)
     tensor.to(..., non_blocking=True) then synchronize, as FSDP2 copies a unit's shards in and
     its gradients out.

Cells are run most-needed first (all the threads this process may use, then fewer) and the bench stops
cleanly at ``--budget-s``, so a cut run still leaves its rows.

  python3 scripts/torch_cpu_adam_bench.py --out /tmp/adam --device cuda --budget-s 150
  python3 scripts/torch_cpu_adam_bench.py --out /tmp/adam --device cpu --sizes 1e6 --threads 1,2   # smoke
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

IMPLS: tuple[str, ...] = ("fused", "foreach", "forloop")
COLUMNS: tuple[str, ...] = (
    "op", "impl", "variant", "elements", "n_tensors", "bytes", "threads", "repeats", "median_s", "p10_s",
    "p90_s", "ns_per_element", "GBps", "torch_version", "cpu_model", "cpu_cores", "cpus_allowed", "device",
    "date", "lease",
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
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


def adamw(torch: Any, params: list[Any], impl: str) -> Any:
    flags = {"forloop": {"foreach": False, "fused": False}, "foreach": {"foreach": True, "fused": False},
             "fused": {"foreach": False, "fused": True}}[impl]
    return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, **flags)


def make_params(torch: Any, elements: int, tensor_numel: int, mesh: Any) -> list[Any]:
    sizes = [tensor_numel] * (elements // tensor_numel)
    if elements % tensor_numel:
        sizes.append(elements % tensor_numel)
    params = []
    for numel in sizes:
        data = torch.randn(numel, dtype=torch.float32)
        if mesh is not None:
            from torch.distributed.tensor import DTensor, Shard

            data = DTensor.from_local(data, mesh, [Shard(0)], run_check=False)
        param = torch.nn.Parameter(data)
        param.grad = torch.randn_like(data) * 1e-3
        params.append(param)
    return params


def time_s(fn: Any, repeats: int, sync: Any = None) -> list[float]:
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return times


# Tensor sizes of the per-tensor sweep: the same elements in more, smaller tensors separate the per-tensor cost
# (the for-loop's kernel launches and allocations, DTensor dispatch per op) from the per-element one.
SWEEP_ELEMENTS = 5 * 10**7
SWEEP_TENSOR_NUMEL = (2**18, 2**20, 2**22)


def adam_cells(args: argparse.Namespace, all_threads: int) -> list[tuple[str, str, int, int, int]]:
    """(impl, variant, elements, threads, tensor_numel), most-needed first."""
    threads = sorted({t for t in args.threads if t <= all_threads} | {all_threads}, reverse=True)
    cells = []
    for count in threads:
        # The big size only with every thread: a model's whole optimizer, to check the per-element rate
        # measured at the smaller sizes holds at model scale (the bandwidth bound, no cache effects).
        for elements in args.sizes + (args.big if count == all_threads else []):
            for impl in IMPLS:
                cells.append((impl, "plain", elements, count, args.tensor_numel))
                if count == all_threads and not args.no_dtensor:
                    cells.append((impl, "dtensor", elements, count, args.tensor_numel))
        if count == all_threads and not args.no_dtensor:
            for numel in SWEEP_TENSOR_NUMEL:
                for impl in IMPLS:
                    cells.append((impl, "dtensor", SWEEP_ELEMENTS, count, numel))
    return cells


def write_row(path: Path, row: dict[str, str]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS), restval="")
        if new:
            writer.writeheader()
        writer.writerow(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: also the copy cells")
    parser.add_argument("--sizes", type=lambda s: [int(float(x)) for x in s.split(",")],
                        default=[10**7, 5 * 10**7, 2 * 10**8], help="elements, comma-separated (1e7,5e7,2e8)")
    parser.add_argument("--big", type=lambda s: [int(float(x)) for x in s.split(",") if x],
                        default=[10**9], help="sizes run with every thread only ('' for none)")
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8],
                        help="thread counts besides all the cpus this process may use")
    parser.add_argument("--tensor-numel", type=int, default=2048 * 5632, help="elements per parameter tensor")
    parser.add_argument("--no-dtensor", action="store_true", help="skip the DTensor variant")
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop starting new cells after this")
    parser.add_argument("--cell-s", type=float, default=1.5, help="time per cell (repeats: 2..10)")
    parser.add_argument("--lease", default=os.environ.get("SOSIM_LEASE", ""))
    args = parser.parse_args(argv)
    if any(t < 1 for t in args.threads) or any(e < 1 for e in args.sizes) or args.tensor_numel < 1:
        print("--threads, --sizes and --tensor-numel must be positive", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "torch_cpu_adam.csv"
    start_all = time.perf_counter()
    all_threads = len(os.sched_getaffinity(0))
    common = {"torch_version": torch.__version__, "cpu_model": cpu_model_name(), "cpu_cores": str(os.cpu_count()),
              "cpus_allowed": str(all_threads), "date": dt.date.today().isoformat(), "lease": args.lease,
              "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}
    print(f"[adam] torch {torch.__version__}, default threads {torch.get_num_threads()}, cpus allowed "
          f"{all_threads}", flush=True)
    mesh = None
    if not args.no_dtensor:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(random.randint(29500, 29999)))
        dist.init_process_group("gloo", rank=0, world_size=1)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (1,))
    if args.device == "cuda":
        bench_copies(torch, csv_path, common)
    for impl, variant, elements, threads, tensor_numel in adam_cells(args, all_threads):
        if time.perf_counter() - start_all > args.budget_s:
            print(f"[adam] budget reached: skipping {impl} {variant} {elements} t{threads}", flush=True)
            continue
        torch.set_num_threads(threads)
        params = make_params(torch, elements, tensor_numel, mesh if variant == "dtensor" else None)
        try:
            optimizer = adamw(torch, params, impl)
            first = time_s(optimizer.step, 1)[0]  # creates the moments (not timed as a step)
            repeats = max(2, min(10, int(args.cell_s / max(first, 1e-6))))
            times = time_s(optimizer.step, repeats)
        except Exception as error:  # e.g. an implementation a torch build lacks
            print(f"[adam] {impl} {variant} failed: {type(error).__name__}: {error}", flush=True)
            del params
            continue
        median = statistics.median(times)
        write_row(csv_path, common | {
            "op": "cpu_adamw", "impl": impl, "variant": variant, "elements": str(elements),
            "n_tensors": str(len(params)), "bytes": str(elements * 16), "threads": str(threads),
            "repeats": str(repeats), "median_s": f"{median:.6f}", "p10_s": f"{percentile(times, 0.1):.6f}",
            "p90_s": f"{percentile(times, 0.9):.6f}", "ns_per_element": f"{median / elements * 1e9:.3f}"})
        print(f"[adam] {impl:8s} {variant:8s} {elements:>10d} x{len(params):<4d} t{threads:<3d} {median:.4f} s "
              f"({median / elements * 1e9:.2f} ns/elem, {repeats} reps)", flush=True)
        del optimizer, params
    torch.set_num_threads(all_threads)
    if mesh is not None:
        dist.destroy_process_group()
    print(f"[adam] done in {time.perf_counter() - start_all:.1f} s", flush=True)
    return 0


def bench_copies(torch: Any, csv_path: Path, common: dict[str, str]) -> None:
    """H2D and D2H at three sizes, pinned and pageable host memory (a layer's fp32 shards are ~0.1-1 GiB)."""
    def sync() -> None:
        torch.cuda.synchronize()

    for nbytes in (64 * 2**20, 256 * 2**20, 1024 * 2**20):
        gpu = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
        for variant in ("pinned", "pageable"):
            host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=(variant == "pinned"))
            host.fill_(1.0)  # touch the pages: first-touch faults are not a copy
            for impl, fn in (("h2d", lambda h=host, g=gpu: g.copy_(h, non_blocking=True)),
                             ("d2h", lambda h=host, g=gpu: h.copy_(g, non_blocking=True))):
                time_s(fn, 2, sync)
                times = time_s(fn, 8, sync)
                median = statistics.median(times)
                write_row(csv_path, common | {
                    "op": "copy", "impl": impl, "variant": variant, "elements": str(nbytes // 4),
                    "bytes": str(nbytes), "threads": str(torch.get_num_threads()), "repeats": "8",
                    "median_s": f"{median:.6f}", "p10_s": f"{percentile(times, 0.1):.6f}",
                    "p90_s": f"{percentile(times, 0.9):.6f}", "GBps": f"{nbytes / median / 1e9:.2f}"})
                print(f"[copy] {impl} {variant:8s} {nbytes / 2**20:6.0f} MiB {nbytes / median / 1e9:.1f} GB/s",
                      flush=True)
            del host
        del gpu


if __name__ == "__main__":
    raise SystemExit(main())
