"""``sosim calibrate [--out DIR] [--quick]``: time real kernels, copies and CPU Adam on this machine.

Runs as ``sosim calibrate`` (the main CLI calls :func:`main`), as ``python3 -m sosim.calibrate.cli``, or
standalone as ``python3 sosim/calibrate/cli.py`` without importing the rest of sosim.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Standalone script: load this folder as a package of its own, so relative imports work and
    # sosim/__init__.py (the simulator, maybe mid-edit or missing deps on a GPU box) is never imported.
    _DIR = Path(__file__).resolve().parent
    _SPEC = importlib.util.spec_from_file_location(
        "sosim_calibrate_standalone", _DIR / "__init__.py", submodule_search_locations=[str(_DIR)]
    )
    assert _SPEC is not None and _SPEC.loader is not None
    _PACKAGE = importlib.util.module_from_spec(_SPEC)
    sys.modules[_SPEC.name] = _PACKAGE
    _SPEC.loader.exec_module(_PACKAGE)
    __package__ = _SPEC.name

SECTIONS: tuple[str, ...] = ("gemm", "attention", "layer", "gpu_cast", "copy", "cpu_cast", "cpu_adam")
# Sections that time DeepSpeed's own access patterns, the disk, quantization and several GPUs (2026-11-30).
# They need DeepSpeed (and transformers for layer_z3; 2 GPUs for nccl and host_shared), so they run only when
# named with --only; the default run stays the component set above.
EXTRA_SECTIONS: tuple[str, ...] = (
    "ds_refresh",
    "layer_z3",
    "ds_step_fixed",
    "so_worker",
    "so_grads",
    "disk",
    "quantize",
    "nccl",
    "host_shared",
)
ALL_SECTIONS: tuple[str, ...] = SECTIONS + EXTRA_SECTIONS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sosim calibrate",
        description="Time GEMMs, attention, a Llama layer, host<->device copies, CPU Adam and casts on this "
        "machine; write measurements.csv and calibration_meta.json.",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: calibration/<device-slug>-<date>)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats; well under 10 minutes")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows already in DIR/measurements.csv and add to them (a second invocation with --only)",
    )
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections (default: {','.join(SECTIONS)}); also: {','.join(EXTRA_SECTIONS)}",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in ALL_SECTIONS]
    if unknown:
        print(
            f"sosim calibrate: unknown section(s) {', '.join(unknown)}; choose from {', '.join(ALL_SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    problem = _unwritable(args.out) if args.out is not None else ""
    if problem:  # before torch is imported and anything is measured
        print(f"sosim calibrate: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    torch = _import_torch_with_cuda()
    if torch is None:
        return 2
    return _run(torch, args.out, args.quick, sections, args.append)


def _unwritable(out: Path) -> str:
    """'' when the folder ``out`` can be created and written, else why not (checked by writing: os.access says
    yes to root on read-only and pseudo file systems). Standalone: this script does not import the simulator."""
    import os
    import tempfile

    if not str(out).strip():
        return "empty folder name"
    if out.exists() and not out.is_dir():
        return "exists and is not a folder"
    parent = out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".sosim-write-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {parent}: {exc.strerror or exc}"
    return ""


def _import_torch_with_cuda() -> Any | None:
    """torch if it imports and sees a CUDA GPU; otherwise one line on stderr and None."""
    try:
        import torch
    except (ImportError, OSError):  # OSError: a torch whose shared libraries are broken
        print(
            "sosim calibrate: torch is not installed (pip install -e .[calibrate]); nothing measured",
            file=sys.stderr,
        )
        return None
    if not torch.cuda.is_available():
        print(
            "sosim calibrate: no CUDA GPU visible to torch; calibration needs one, nothing measured",
            file=sys.stderr,
        )
        return None
    return torch


def _run(torch: Any, out: Path | None, quick: bool, sections: list[str], append: bool) -> int:
    from . import copy_bench, cpu_bench, ds_bench, gpu_bench, host_bench, multi_gpu, so_grads_bench
    from .machine import cpu_model, device_slug, machine_meta, today_utc
    from .records import Context, Table, read_rows

    meta = machine_meta(torch, quick)
    default_dir = Path("calibration") / f"{device_slug(str(meta['device']))}-{today_utc()}"
    out_dir = out if out is not None else default_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    table = Table(
        Context(
            device=str(meta["device"]),
            host_cpu=cpu_model(),
            torch_version=torch.__version__,
            date=today_utc(),
        )
    )
    csv_path = out_dir / "measurements.csv"
    meta_path = out_dir / "calibration_meta.json"
    previous_meta: dict[str, Any] = {}
    if append and csv_path.exists():
        table.rows.extend(read_rows(csv_path))
        if meta_path.exists():
            previous_meta = json.loads(meta_path.read_text())
    torch.manual_seed(0)
    # Why no TF32 switch: every GPU measurement is bf16, which never uses TF32.
    runners: dict[str, Callable[[Any, Table, bool], None]] = {
        "gemm": gpu_bench.bench_gemm,
        "attention": gpu_bench.bench_attention,
        "layer": gpu_bench.bench_layer,
        "gpu_cast": gpu_bench.bench_gpu_cast,
        "copy": copy_bench.bench_copies,
        "cpu_cast": cpu_bench.bench_cpu_cast,
        "cpu_adam": cpu_bench.bench_cpu_adam,
        "ds_refresh": ds_bench.bench_ds_refresh,
        "layer_z3": ds_bench.bench_layer_z3,
        "ds_step_fixed": lambda t, tab, q: ds_bench.bench_ds_step_fixed(t, tab, q, out_dir=out_dir),
        "so_worker": ds_bench.bench_so_worker,
        "so_grads": so_grads_bench.bench_so_grads,
        "disk": host_bench.bench_disk,
        "quantize": host_bench.bench_quantize,
        "nccl": multi_gpu.bench_nccl,
        "host_shared": multi_gpu.bench_host_shared,
    }
    failed: list[str] = list(previous_meta.get("failed_sections", []))
    timings_s: dict[str, float] = dict(previous_meta.get("section_wall_s", {}))
    for name in sections:
        start_s = time.perf_counter()
        before = len(table.rows)
        try:
            runners[name](torch, table, quick)
        except Exception as error:  # one broken section must not lose the rest
            failed.append(name)
            print(f"[calibrate] section {name} failed: {type(error).__name__}: {error}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        finally:
            torch.cuda.empty_cache()
        timings_s[name] = round(time.perf_counter() - start_s, 2)
        added = len(table.rows) - before
        print(f"[calibrate] {name}: {added} rows in {timings_s[name]:.1f} s", file=sys.stderr, flush=True)
        table.write_csv(csv_path)
    done = [*previous_meta.get("sections", []), *sections]
    meta |= {
        "sections": done,
        "failed_sections": failed,
        "section_wall_s": timings_s,
        "deepspeed_version": _deepspeed_version(),
        "rows": len(table.rows),
    }
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    print(f"[calibrate] wrote {len(table.rows)} rows to {csv_path}", file=sys.stderr)
    return 1 if failed else 0


def _deepspeed_version() -> str | None:
    module = sys.modules.get("deepspeed")
    return getattr(module, "__version__", None) if module is not None else None


if __name__ == "__main__":
    raise SystemExit(main())
