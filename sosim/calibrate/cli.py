"""``sosim calibrate [--out DIR] [--quick]``: time real kernels, copies and CPU Adam on this machine.

``sosim calibrate --profile NAME [--profiles DIR] [--quick]`` measures everything a profile needs (the sections
that :mod:`.platform_detect` selects for this platform) into ``DIR/NAME.calibration/`` and writes a ready
profile ``DIR/NAME.yaml`` (:mod:`.profile_writer`); ``sosim calibrate --check --profile NAME`` then runs a few
short real DeepSpeed steps on this machine and prints predicted vs measured (sosim.answers.calibration_check,
which the main CLI hands to :func:`main`: predicting needs the simulator, which this package never imports). DIR
defaults to the first folder of $SOSIM_PROFILES, else ``$XDG_CONFIG_HOME/sosim/profiles``
(``~/.config/sosim/profiles``), the folder ``sosim run --hardware NAME`` searches by default.

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
    "c2c_access",
    "host_warmup",
    "layer_offload",
    "instep",
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
        "--force",
        action="store_true",
        help="replace an existing DIR/measurements.csv (without it, or --append, a measured table is never lost)",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        default=None,
        help="measure what a hardware profile needs and write DIR/NAME.yaml (DIR: --profiles)",
    )
    parser.add_argument(
        "--profiles",
        metavar="DIR",
        type=Path,
        default=None,
        help="user profile folder (default: first of $SOSIM_PROFILES, else ~/.config/sosim/profiles)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --profile: run a few short DeepSpeed steps here and print predicted vs measured",
    )
    parser.add_argument(
        "--check-jobs",
        default=None,
        help="with --check: comma-separated scripts/ds_run_all.py jobs (default: 0.5b ZeRO-2/ZeRO-3/SuperOffload)",
    )
    parser.add_argument("--check-deadline-s", type=float, default=None, help="with --check: wall-clock budget")
    parser.add_argument(
        "--check-bands", type=int, default=40, help="with --check: band replays per run (0: no bands)"
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated sections (default: {','.join(SECTIONS)}); also: {','.join(EXTRA_SECTIONS)}",
    )
    return parser


# ``--check``'s runner: (profile, profiles folder, jobs text, quick, deadline_s, bands) -> exit code. It predicts with
# the simulator, so the caller that has one (sosim.cli) passes it in; this package imports nothing of sosim.
CheckRunner = Callable[[str, Path, str | None, bool, float | None, int], int]


def main(argv: list[str] | None = None, run_check: CheckRunner | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check:
        if not args.profile:
            print("sosim calibrate: --check needs --profile NAME (the profile to check)", file=sys.stderr)
            return 2
        if run_check is None:
            print("sosim calibrate: --check predicts with the simulator: run it as `sosim calibrate --check`",
                  file=sys.stderr)
            return 2
        return run_check(args.profile, profiles_folder(args.profiles), args.check_jobs, args.quick,
                         args.check_deadline_s, args.check_bands)
    if args.profile is not None:
        return _calibrate_profile(args)
    sections = [s.strip() for s in (args.only or ",".join(SECTIONS)).split(",") if s.strip()]
    unknown = [s for s in sections if s not in ALL_SECTIONS]
    if unknown:
        print(
            f"sosim calibrate: unknown section(s) {', '.join(unknown)}; choose from {', '.join(ALL_SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    problem = _unwritable(args.out) if args.out is not None else ""
    if not problem and args.out is not None:
        problem = _would_replace(args.out / "measurements.csv", args.append or args.force)
    if problem:  # before torch is imported and anything is measured
        print(f"sosim calibrate: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    torch = _import_torch_with_cuda()
    if torch is None:
        return 2
    return _run(torch, args.out, args.quick, sections, args.append)


PROFILES_ENV = "SOSIM_PROFILES"  # the same variable sosim.run.loader reads (tests/test_calibrate_profile.py)


def default_profiles_folder() -> Path:
    """``$XDG_CONFIG_HOME/sosim/profiles`` or ``~/.config/sosim/profiles`` (sosim.run.loader searches it too)."""
    import os

    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sosim" / "profiles"


def profiles_folder(given: Path | None) -> Path:
    """Where ``--profile`` writes: ``--profiles DIR``, else the first folder of $SOSIM_PROFILES, else the default."""
    import os

    if given is not None:
        return given
    env = [d for d in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if d]
    return Path(env[0]) if env else default_profiles_folder()


def shipped_profiles_folder() -> Path:
    """The shipped profiles (the templates): the checkout's hardware_profiles/ or the wheel's sosim/_data copy."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "hardware_profiles", here.parent / "_data" / "hardware_profiles"):
        if candidate.is_dir():
            return candidate
    return here.parent.parent / "hardware_profiles"


def _calibrate_profile(args: argparse.Namespace) -> int:
    """Measure this machine and write a profile; the exit status is the harness's (1 if a section failed)."""
    import importlib.util
    import re

    from .platform_detect import detect, plan_for

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.profile):
        print(f"sosim calibrate: --profile {args.profile!r}: use letters, digits, '.', '_' and '-'", file=sys.stderr)
        return 2
    torch = _import_torch_with_cuda()
    if torch is None:
        return 2
    folder = profiles_folder(args.profiles)
    cal_dir = folder / f"{args.profile}.calibration"
    has_ds = importlib.util.find_spec("deepspeed") is not None
    plat = detect(gpu_name=torch.cuda.get_device_name(0), gpus=int(torch.cuda.device_count()))
    plan = plan_for(plat, args.quick, has_ds)
    sections = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else list(plan.sections)
    for note in plan.notes:
        print(f"[calibrate] {note}", file=sys.stderr)
    print(f"[calibrate] platform {plat.arch}, link {plan.link_kind}, template {plan.template_profile}; "
          f"sections {','.join(sections)} -> {cal_dir}", file=sys.stderr)
    build = _start_cpuadam_build(cal_dir / "cpuadam_build.json") if has_ds else None
    gpu_first = [s for s in sections if s in ("gemm", "attention", "layer", "gpu_cast")]
    status = _run(torch, cal_dir, args.quick, gpu_first, False) if gpu_first else 0
    if build is not None:
        code = build.wait()
        print(f"[calibrate] DeepSpeed CPUAdam build exit {code}", file=sys.stderr)
    from .profile_writer import write_profile

    template = shipped_profiles_folder() / f"{plan.template_profile}.yaml"
    rest = [s for s in sections if s not in gpu_first]
    appended = bool(gpu_first)
    for name in rest:
        # One section at a time, the profile written after each: a run stopped by a lease's time limit still
        # leaves a usable profile of what it measured (the table it names gains the later sections' rows).
        status = max(status, _run(torch, cal_dir, args.quick, [name], appended))
        appended = True
        if (cal_dir / "measurements.csv").is_file() and (cal_dir / "calibration_meta.json").is_file():
            write_profile(args.profile, folder, cal_dir, template, plan.template_profile, plan.link_kind)
    if not (cal_dir / "measurements.csv").is_file() or not (cal_dir / "calibration_meta.json").is_file():
        print(f"sosim calibrate: nothing was measured into {cal_dir}; no profile written", file=sys.stderr)
        return 1
    written = write_profile(args.profile, folder, cal_dir, template, plan.template_profile, plan.link_kind)
    for note in written.notes:
        print(f"[calibrate] profile note: {note}", file=sys.stderr)
    flag = "" if args.profiles is None else f" --profiles {folder}"
    print(f"[calibrate] wrote profile {written.path}; use it: sosim{flag} run SCENARIO --set hardware={args.profile} "
          f"(or --ds-config DS.json --hardware {args.profile}); check it: sosim calibrate --check --profile "
          f"{args.profile}{' --profiles ' + str(folder) if args.profiles is not None else ''}", file=sys.stderr)
    return status


# Run in the build child: compile CPUAdam, then report how DeepSpeed's op builder compiled it on this host (on
# aarch64 its cpu_arch() / simd_width() choose -mcpu=native and no AVX flags; on x86 -march=native and AVX-512 or
# AVX2), as one JSON line the profile writer quotes in the CPU Adam source.
_BUILD_CODE = """
import json, platform
from deepspeed.ops.op_builder import CPUAdamBuilder
b = CPUAdamBuilder()
b.load()
info = {"arch": platform.machine()}
for name in ("cpu_arch", "simd_width"):
    try:
        info[name] = str(getattr(b, name)())
    except Exception as error:
        info[name] = f"unknown ({type(error).__name__})"
print(json.dumps(info))
"""


def _start_cpuadam_build(report: Path | None = None) -> Any:
    """Compile DeepSpeed's CPUAdam in a child process while the GPU sections run (they barely use the CPU); the
    host sections wait for it, since a compiler on a few cores skews multi-threaded timings. ``report`` receives
    the child's JSON line (architecture and the compiler flags DeepSpeed chose)."""
    import subprocess

    out: Any = subprocess.DEVNULL
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        out = report.open("w")
    return subprocess.Popen([sys.executable, "-c", _BUILD_CODE], stdout=out, stderr=subprocess.DEVNULL)


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


def _would_replace(table: Path, allowed: bool) -> str:
    """'' unless writing would replace a measured table the user did not ask to replace (issue 26: no user file is
    ever destroyed): an earlier calibration's measurements.csv is hours of a lent GPU machine."""
    if allowed or not (table.exists() or table.is_symlink()):
        return ""
    return f"{table} exists: --append adds to it, --force replaces it"


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
    from . import (
        c2c_bench,
        copy_bench,
        cpu_bench,
        ds_bench,
        gpu_bench,
        host_bench,
        host_warmup,
        instep_bench,
        multi_gpu,
        offload_layer_bench,
        so_grads_bench,
    )
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
        "c2c_access": c2c_bench.bench_c2c_access,
        "host_warmup": host_warmup.bench_host_warmup,
        "layer_offload": offload_layer_bench.bench_layer_offload,
        "instep": lambda t, tab, q: instep_bench.bench_instep(t, tab, q, out_dir=out_dir),
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
