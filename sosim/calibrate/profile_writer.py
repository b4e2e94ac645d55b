"""Write a ready hardware profile from one calibration (``sosim calibrate --profile NAME``).

Torch-free and sosim-free (the harness runs it on the GPU machine, standalone; pyyaml is the one dependency).
Input: the calibration folder (``measurements.csv`` + ``calibration_meta.json``) and the platform plan. Output:
``<profiles>/<NAME>.yaml`` naming the table relative to itself (``<NAME>.calibration/measurements.csv``), so
``sosim run --hardware NAME`` (with ``--profiles DIR``, ``$SOSIM_PROFILES`` or the default folder) uses it at once.

What each number is:

* **measured here** (the source names the table and the rows): GPU name and memory, host cores and memory,
  the link's pinned / bidirectional / pageable rates, CPU Adam and casts at every measured thread count, the
  GEMM and attention efficiencies, and the GPU cast bandwidth. Everything the table holds is also looked up
  directly by the simulator (the profile's ``calibration:``), so these analytic numbers matter only outside it.
* **datasheet** by GPU name (:data:`GPU_DATASHEETS`): dense bf16 peak and HBM bandwidth.
* **from the nearest shipped kind** (the template profile the platform plan names): the few constants a quick
  calibration does not time (elementwise traffic factor, launch floor, reserved memory, latency), each source
  prefixed with where it came from.
* **lease-to-lease spread** (``lease_spread``): one lease cannot measure how much the next lease of the same kind
  differs, so the profile states the spread measured over repeated leases of the nearest kind
  (:data:`KIND_LEASE_SPREAD`), with a note; calibrating again on another lease and listing both tables in
  ``calibration:`` makes it measured (``CalibrationTable.session_log_sd`` then wins).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Dense bf16 peak (TFLOP/s) and HBM bandwidth (GB/s) by a substring of the device name, most specific first.
GPU_DATASHEETS: tuple[tuple[str, float, float, str], ...] = (
    ("GH200 144G", 989.0, 4900.0, "NVIDIA GH200 datasheet: H100-class 989 TFLOPS dense bf16, 144 GB HBM3e 4.9 TB/s"),
    ("GH200", 989.0, 4000.0, "NVIDIA GH200 datasheet: 989 TFLOPS dense bf16, 96 GB HBM3 4.0 TB/s"),
    ("H200", 989.0, 4800.0, "NVIDIA H200 datasheet: 1979 TFLOPS bf16 with sparsity = 989 dense, 4.8 TB/s HBM3e"),
    ("H100 PCIe", 756.0, 2000.0, "NVIDIA H100 PCIe datasheet: 1513 TFLOPS bf16 sparse = 756 dense, 2.0 TB/s"),
    ("H100", 989.0, 3350.0, "NVIDIA H100 SXM datasheet: 989 TFLOPS dense bf16, 3.35 TB/s"),
    ("A100", 312.0, 2039.0, "NVIDIA A100 80GB SXM datasheet: 312 TFLOPS dense bf16, 2.0 TB/s"),
)

# Lease-to-lease spread of a machine kind: pooled log-sd of a component's median between leases (docs/
# calibration.md "Lease to lease"); keyed by the template profile the platform plan picks.
KIND_LEASE_SPREAD: dict[str, tuple[float, float, str]] = {
    "h200-pcie-gen5-x86": (
        0.186,
        0.047,
        "measured over 5 leases of the lent H200 kind: pooled log-sd of a component's median between leases "
        "(CalibrationTable.session_log_sd over calibration/nvidia-h200-2026-11-29, -11-30, -11-30b, -11-30c and "
        "-12-01: 91 host points, 59 device points; docs/calibrate-your-machine.md)",
    ),
}
NEAREST_KIND_FOR: dict[str, str] = {"gh200": "h200-pcie-gen5-x86"}

Row = Mapping[str, str]


@dataclass(frozen=True)
class WrittenProfile:
    name: str
    path: Path
    table: Path
    notes: tuple[str, ...]


def _f(row: Row, key: str) -> float:
    text = (row.get(key) or "").strip()
    return float(text) if text else math.nan


def read_measurements(path: Path) -> list[Row]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _rows(rows: Iterable[Row], op: str, variant: str) -> list[Row]:
    return [r for r in rows if r.get("op") == op and r.get("variant") == variant]


def _largest(rows: list[Row], key: str) -> Row | None:
    return max(rows, key=lambda r: _f(r, key)) if rows else None


def link_numbers(rows: list[Row]) -> dict[str, tuple[float, str]]:
    """h2d / d2h / bidir GB/s and the pageable factor from the largest measured copies."""
    out: dict[str, tuple[float, str]] = {}
    for key, variant in (("h2d_GBps", "h2d_pinned"), ("d2h_GBps", "d2h_pinned")):
        r = _largest(_rows(rows, "copy", variant), "bytes")
        if r is not None:
            gbps = _f(r, "bytes") / _f(r, "median_s") / 1e9
            out[key] = (round(gbps, 1), f"{variant} {int(_f(r, 'bytes')) >> 20} MiB: {gbps:.1f} GB/s")
    up = _largest(_rows(rows, "copy", "bidir_pinned_h2d"), "bytes")
    down = _largest(_rows(rows, "copy", "bidir_pinned_d2h"), "bytes")
    if up is not None and down is not None:
        total = _f(up, "bytes") / _f(up, "median_s") / 1e9 + _f(down, "bytes") / _f(down, "median_s") / 1e9
        out["bidir_GBps"] = (round(total, 1), f"both directions at once, largest size: {total:.1f} GB/s together")
    pageable = _largest(_rows(rows, "copy", "h2d_pageable"), "bytes")
    if pageable is not None and "h2d_GBps" in out:
        gbps = _f(pageable, "bytes") / _f(pageable, "median_s") / 1e9
        factor = min(1.0, gbps / out["h2d_GBps"][0])
        out["pageable_factor"] = (round(factor, 3), f"pageable H2D {gbps:.1f} GB/s / pinned")
    return out


def _max_threads_rows(rows: list[Row]) -> tuple[int, list[Row]]:
    if not rows:
        return 0, []
    top = max(int(_f(r, "threads")) for r in rows)
    return top, [r for r in rows if int(_f(r, "threads")) == top]


def cpu_numbers(rows: list[Row]) -> dict[str, tuple[Any, str]]:
    """CPU Adam (s by billions of params at the largest thread count), memory and cast bandwidth."""
    out: dict[str, tuple[Any, str]] = {}
    curves: dict[str, list[list[float]]] = {}
    threads_used = 0
    for impl, variant in (("torch", "torch"), ("cpu_adam", "deepspeed")):
        threads, top = _max_threads_rows(_rows(rows, "cpu_adam", variant))
        if top:
            threads_used = max(threads_used, threads)
            ordered = sorted(top, key=lambda r: _f(r, "elements"))
            curves[impl] = [[_f(r, "elements") / 1e9, _f(r, "median_s")] for r in ordered]
    if curves:
        out["adam_s_by_gparams"] = (curves,
                                    f"cpu_adam rows at {threads_used} threads (torch foreach / DeepSpeed CPUAdam)")
        out["adam_ref_cores"] = (threads_used, "the thread count of the adam_s_by_gparams rows")
    ds = curves.get("cpu_adam")
    if ds:
        gp, s = ds[-1]
        gbps = 28 * gp * 1e9 / s / 1e9  # 28 B/param: fp32 param, grad, two moments read + param, moments written
        out["mem_GBps"] = (round(gbps, 1), f"DeepSpeed CPUAdam at {gp * 1e9:.0e} params: 28 B/param in {s:.4f} s")
    threads, top = _max_threads_rows(_rows(rows, "cast", "cpu_fp32_to_bf16"))
    cast = _largest(top, "elements")
    if cast is not None:
        gbps = 4 * _f(cast, "elements") / _f(cast, "median_s") / 1e9
        out["cast_GBps"] = (round(gbps, 1), f"fp32->bf16 of {_f(cast, 'elements'):.0e} elements on {threads} threads "
                                            f"(GB/s of fp32 read)")
    return out


def gpu_numbers(rows: list[Row], peak_tflops: float, hbm_GBps: float) -> dict[str, tuple[Any, str]]:
    """GEMM efficiency by GFLOP, attention efficiency and backward factor, HBM efficiency."""
    out: dict[str, tuple[Any, str]] = {}
    gemm = _rows(rows, "gemm", "fwd")
    if gemm:
        flops = [(2 * _f(r, "m") * _f(r, "n") * _f(r, "k"), _f(r, "median_s")) for r in gemm]
        points = sorted((f / 1e9, f / s / 1e12 / peak_tflops) for f, s in flops)
        buckets: list[list[float]] = []
        edges = [0, 25, 60, 200, 700, 2500, math.inf]
        for lo, hi in itertools.pairwise(edges):
            inside = [p for p in points if lo <= p[0] < hi]
            if inside:
                gf = statistics.median(p[0] for p in inside)
                buckets.append([round(gf, 1), round(min(1.0, statistics.median(p[1] for p in inside)), 3)])
        out["gemm_efficiency"] = (buckets, f"median achieved / peak of {len(gemm)} measured bf16 GEMMs per size bucket")
    fwd = {(r["batch"], r["seq"], r["heads"], r["head_dim"]): r for r in _rows(rows, "attention", "fwd")}
    both = {(r["batch"], r["seq"], r["heads"], r["head_dim"]): r for r in _rows(rows, "attention", "fwd_bwd")}
    big = [k for k in fwd if _f(fwd[k], "seq") >= 2048]
    if big:
        effs = [2 * _f(fwd[k], "batch") * _f(fwd[k], "heads") * _f(fwd[k], "seq") ** 2 * _f(fwd[k], "head_dim")
                / _f(fwd[k], "median_s") / 1e12 / peak_tflops for k in big]
        out["attention_efficiency"] = (round(min(1.0, statistics.median(effs)), 3),
                                       f"median of {len(effs)} causal SDPA forwards at seq >= 2048")
        ratios = [(_f(both[k], "median_s") - _f(fwd[k], "median_s")) / _f(fwd[k], "median_s")
                  for k in big if k in both]
        if ratios:
            out["attention_bwd_factor"] = (round(statistics.median(ratios), 2),
                                           f"median (fwd_bwd - fwd) / fwd of {len(ratios)} SDPA shapes at seq >= 2048")
    cast = _largest(_rows(rows, "cast", "gpu_fp32_to_bf16"), "elements")
    if cast is not None:
        gbps = 6 * _f(cast, "elements") / _f(cast, "median_s") / 1e9
        out["hbm_efficiency"] = (round(min(1.0, gbps / hbm_GBps), 3), f"GPU fp32->bf16 of {_f(cast, 'elements'):.0e} "
                                                                      f"elements: {gbps:.0f} GB/s of {hbm_GBps:.0f}")
    return out


def datasheet(device: str) -> tuple[float, float, str] | None:
    for tag, peak, hbm, source in GPU_DATASHEETS:
        if tag.lower() in device.lower():
            return peak, hbm, source
    return None


def lease_spread_for(template: str) -> dict[str, Any]:
    """The profile's ``lease_spread`` block: the template kind's measured spread, or its nearest kind's."""
    kind = template if template in KIND_LEASE_SPREAD else NEAREST_KIND_FOR.get(template, "h200-pcie-gen5-x86")
    host, device, source = KIND_LEASE_SPREAD[kind]
    note = "" if kind == template else (f"estimate: {template}'s own lease-to-lease spread is not measured; the "
                                        f"nearest measured kind, {kind}: ")
    return {"host_log_sd": host, "device_log_sd": device,
            "sources": {"host_log_sd": f"{note}{source}", "device_log_sd": f"{note}{source}"}}


def cpuadam_build_flags(path: Path) -> str:
    """'aarch64, cpu_arch -mcpu=native, simd_width -D__SIMD_WIDTH__=4' from the build child's JSON line, or ''."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
        info = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict) or not info:
        return ""
    return ", ".join(f"{k} {v}" if k != "arch" else str(v) for k, v in info.items())


def _set(section: dict[str, Any], key: str, value: Any, source: str) -> None:
    section[key] = value
    section.setdefault("sources", {})[key] = source


def build_profile(name: str, template: Mapping[str, Any], template_name: str, meta: Mapping[str, Any],
                  rows: list[Row], table_rel: str, link_kind: str, build_flags: str = "") -> tuple[dict[str, Any],
                                                                                                 list[str]]:
    """The profile dict (and notes on what was not measured) from one calibration."""
    date = str(meta.get("date", ""))
    device = str(meta.get("device", "GPU"))
    where = f"measured here, {date} ({table_rel})"
    notes: list[str] = []
    gpu = {k: v for k, v in dict(template.get("gpu", {})).items() if k != "sources"}
    cpu = {k: v for k, v in dict(template.get("cpu", {})).items() if k != "sources"}
    link = {k: v for k, v in dict(template.get("link", {})).items() if k != "sources"}
    for section, original in ((gpu, template.get("gpu", {})), (cpu, template.get("cpu", {})),
                              (link, template.get("link", {}))):
        section["sources"] = {k: f"from the nearest shipped kind ({template_name}): {v}"
                              for k, v in dict(original.get("sources", {})).items() if k in section}
    _set(gpu, "name", device, f"torch.cuda.get_device_name, {date}")
    if meta.get("device_memory_bytes"):
        _set(gpu, "hbm_gib", round(float(meta["device_memory_bytes"]) / 2**30, 1),
             f"torch.cuda.get_device_properties(0).total_memory, {date}")
    sheet = datasheet(device)
    if sheet is not None:
        _set(gpu, "peak_bf16_tflops", sheet[0], sheet[2])
        _set(gpu, "hbm_GBps", sheet[1], sheet[2])
    else:
        notes.append(f"no datasheet entry for {device!r}: peak and HBM bandwidth kept from {template_name}")
    for key, (value, how) in gpu_numbers(rows, float(gpu["peak_bf16_tflops"]), float(gpu["hbm_GBps"])).items():
        _set(gpu, key, value, f"{where}: {how}")
    cores = int(meta.get("cpu_cores_usable") or cpu.get("cores", 1))
    _set(cpu, "name", str(meta.get("cpu_model") or cpu.get("name", "CPU")), f"/proc/cpuinfo, {date}")
    _set(cpu, "cores", cores, f"os.sched_getaffinity of the calibrating process, {date}")
    if meta.get("host_memory_bytes"):
        _set(cpu, "mem_gib", round(float(meta["host_memory_bytes"]) / 2**30), f"/proc/meminfo MemTotal, {date}")
    _set(cpu, "adam_saturation_cores", cores, "assumption: all usable cores (not measured past them)")
    built = f"; DeepSpeed CPUAdam compiled here with {build_flags}" if build_flags else ""
    for key, (value, how) in cpu_numbers(rows).items():
        _set(cpu, key, value, f"{where}: {how}{built if key == 'adam_s_by_gparams' else ''}")
    _set(link, "kind", link_kind, "platform detection (sosim/calibrate/platform_detect.py)")
    for key, (value, how) in link_numbers(rows).items():
        _set(link, key, value, f"{where}: {how}")
    measured_ops = sorted({r.get("op", "") for r in rows})
    if not {"copy", "cpu_adam", "cast"} <= set(measured_ops):
        notes.append(f"not all host sections measured ({', '.join(measured_ops)}): the rest is {template_name}'s")
    profile: dict[str, Any] = {
        "name": name,
        "description": f"calibrated on this machine, {date}: {device}, {cores} cores {cpu['name']}, "
                       f"{cpu.get('mem_gib', '?')} GiB, {link_kind} link (sosim calibrate --profile {name}; "
                       f"unmeasured constants from {template_name})",
        "calibration": [table_rel],
        "lease_spread": lease_spread_for(template_name),
        "gpu": gpu,
        "cpu": cpu,
        "link": link,
    }
    for key in ("interconnect", "node", "network"):
        if key in template:
            profile[key] = template[key]
            notes.append(f"{key}: kept from {template_name} (one-GPU calibration does not measure it)")
    return profile, notes


def write_profile(name: str, profiles_dir: Path, cal_dir: Path, template_path: Path, template_name: str,
                  link_kind: str) -> WrittenProfile:
    """Write ``profiles_dir/<name>.yaml`` for the calibration in ``cal_dir`` (which must be
    ``profiles_dir/<name>.calibration`` or below ``profiles_dir``, so the table is named relative to it)."""
    import yaml

    meta = json.loads((cal_dir / "calibration_meta.json").read_text())
    table = cal_dir / "measurements.csv"
    rows = read_measurements(table)
    template = yaml.safe_load(template_path.read_text())
    rel = Path(table).resolve().relative_to(profiles_dir.resolve()).as_posix()
    profile, notes = build_profile(name, template, template_name, meta, rows, rel, link_kind,
                                   cpuadam_build_flags(cal_dir / "cpuadam_build.json"))
    from .instep_profile import write_instep_table
    from .records import COLUMNS

    # In-step figures where the instep section measured them (issue 23 item 1): a second table of the isolated
    # curves rescaled to the in-step cost, listed after the first; the table's lookups take them where they exist.
    try:
        instep_path, found = write_instep_table(cal_dir, COLUMNS)
    except (OSError, ValueError, KeyError) as error:  # a malformed instep.csv must not cost the profile
        instep_path, found = None, []
        notes.append(f"in-step figures not used: {type(error).__name__}: {error}")
    used = ""
    if instep_path is not None:
        profile["calibration"] = [rel, instep_path.resolve().relative_to(profiles_dir.resolve()).as_posix()]
        used = "".join(f"\n#   {f.op}/{f.variant}: {f.how}" for f in found)
        profile["description"] += "; host costs: in-step figures where measured (" + ", ".join(
            f"{f.op}/{f.variant} x{f.factor:.2f}" for f in found) + "), isolated sections elsewhere"
        notes.append("in-step figures used for " + ", ".join(f"{f.op}/{f.variant}" for f in found))
    else:
        notes.append("no in-step figures (no instep section): host costs from the isolated sections")
    path = profiles_dir / f"{name}.yaml"
    header = (f"# Written by `sosim calibrate --profile {name}` on {meta.get('date', '')}: every number says where it "
              f"came from\n# (measured here, datasheet, or the nearest shipped kind {template_name}).\n"
              + (f"# In-step host figures (sosim/calibrate/instep_profile.py):{used}\n" if used else ""))
    path.write_text(header + yaml.safe_dump(profile, sort_keys=False, width=120, allow_unicode=True))
    return WrittenProfile(name=name, path=path, table=table, notes=tuple(notes))
