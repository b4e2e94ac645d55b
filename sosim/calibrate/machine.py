"""Facts about the machine a calibration ran on (device, driver, CPU), for the CSV rows and the meta JSON."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (x86 'model name'; Arm boards may lack it)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def driver_version() -> str:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""


def device_slug(device_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': a folder name that sorts and greps well."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown-device"


def today_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


def machine_meta(torch: Any, quick: bool) -> dict[str, object]:
    props = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "device_count": torch.cuda.device_count(),
        "device_memory_bytes": int(props.total_memory),
        "multiprocessors": int(props.multi_processor_count),
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": driver_version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "cpu_model": cpu_model(),
        "cpu_cores_visible": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)),
        "host_memory_bytes": host_memory_bytes(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": today_utc(),
        "quick": quick,
    }


def host_memory_bytes() -> int | None:
    """Installed host memory from /proc/meminfo (None where there is none)."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None
