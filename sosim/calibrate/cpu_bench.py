"""CPU measurements: one Adam step (torch and DeepSpeed CPUAdam) and fp32<->bf16 casts, by thread count."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

from .platform_detect import host_thread_counts
from .records import Table
from .timing import cpu_times_s, repeats_for


def thread_counts(quick: bool) -> tuple[int, ...]:
    """1..16 threads and every core this process may run on (platform_detect.host_thread_counts)."""
    return host_thread_counts(len(os.sched_getaffinity(0)), quick)


def adam_sizes(quick: bool) -> tuple[int, ...]:
    return (10**6, 10**7, 10**8)


def set_threads(torch: Any, threads: int) -> None:
    """Set the OpenMP thread count for torch and for every other OpenMP runtime loaded in this process.

    Why the ctypes walk: DeepSpeed's CPUAdam extension may link a different libgomp than torch's bundled
    one, and torch.set_num_threads only reaches torch's. omp_set_num_threads acts on the calling thread,
    which is the thread that later runs the optimizer step.
    """
    torch.set_num_threads(threads)
    for library in _loaded_openmp_libraries():
        try:
            ctypes.CDLL(str(library)).omp_set_num_threads(threads)
        except (OSError, AttributeError):
            continue


def _loaded_openmp_libraries() -> list[Path]:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    found: set[str] = set()
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        name = os.path.basename(path)
        if name.startswith(("libgomp", "libiomp", "libomp")) and ".so" in name:
            found.add(path)
    return [Path(p) for p in sorted(found)]


def deepspeed_cpu_adam_class() -> tuple[Any | None, str]:
    """DeepSpeedCPUAdam if it imports and its op builds/loads here, else (None, reason)."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # type: ignore[import-not-found]
    except Exception as error:  # any import failure: not measured
        return None, f"deepspeed not importable: {type(error).__name__}: {error}"
    return DeepSpeedCPUAdam, ""


def bench_cpu_adam(torch: Any, table: Table, quick: bool, log: Any = sys.stderr) -> None:
    ds_adam, reason = deepspeed_cpu_adam_class()
    if ds_adam is None:
        print(f"[calibrate] DeepSpeed CPUAdam skipped ({reason})", file=log)
    impls = ["torch"] + (["deepspeed"] if ds_adam is not None else [])
    for impl in impls:
        for elements in adam_sizes(quick):
            param = torch.nn.Parameter(torch.randn(elements, dtype=torch.float32))
            param.grad = torch.randn(elements, dtype=torch.float32) * 1e-3
            try:
                if impl == "torch":
                    # foreach=True is torch's default fast path on CPU; fused=False keeps it the plain one.
                    optimizer = torch.optim.Adam([param], lr=1e-4, foreach=True, fused=False)
                elif ds_adam is not None:  # always here: "deepspeed" is only listed when it imported
                    optimizer = ds_adam([param], lr=1e-4, adamw_mode=True)
            except Exception as error:  # e.g. the JIT build of the op failed
                print(f"[calibrate] cpu_adam {impl} failed to construct: {error}", file=log)
                break
            optimizer.step()  # creates the moment buffers outside the timed region
            for threads in thread_counts(quick):
                set_threads(torch, threads)
                # Why a rough per-element guess: keeps 1e8 elements at 1 thread to a couple of repeats.
                guess_s = elements * (20e-9 if impl == "torch" else 4e-9) / threads
                repeats = repeats_for(guess_s, budget_s=2.0 if quick else 5.0, lo=3, hi=20)
                times_s = cpu_times_s(optimizer.step, warmup=1, repeats=repeats)
                table.add("cpu_adam", impl, "fp32", times_s, elements=elements, threads=threads)
            del optimizer, param
    set_threads(torch, len(os.sched_getaffinity(0)))


def bench_cpu_cast(torch: Any, table: Table, quick: bool) -> None:
    for elements in (10**6, 10**7, 10**8):
        fp32 = torch.randn(elements, dtype=torch.float32)
        bf16 = torch.empty(elements, dtype=torch.bfloat16)
        for threads in thread_counts(quick):
            set_threads(torch, threads)
            repeats = repeats_for(elements * 2e-9 / threads, budget_s=1.0, lo=3, hi=20)
            to_bf16_s, to_fp32_s = _time_cpu_cast(fp32, bf16, repeats)
            table.add(
                "cast",
                "cpu_fp32_to_bf16",
                "fp32",
                to_bf16_s,
                elements=elements,
                threads=threads,
                bytes=elements * 6,
            )
            table.add(
                "cast",
                "cpu_bf16_to_fp32",
                "bf16",
                to_fp32_s,
                elements=elements,
                threads=threads,
                bytes=elements * 6,
            )
    set_threads(torch, len(os.sched_getaffinity(0)))


def _time_cpu_cast(fp32: Any, bf16: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Casts into preallocated outputs: we time the conversion, not the allocator."""
    return (
        cpu_times_s(lambda: bf16.copy_(fp32), 1, repeats),
        cpu_times_s(lambda: fp32.copy_(bf16), 1, repeats),
    )
