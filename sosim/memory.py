"""Memory footprints on both sides and the feasibility verdict.

Each schedule reports what it keeps resident on the GPU and in host memory, per rank, as named byte
counts (:class:`MemoryUsage`). The peak is the sum of the resident items; activations are already their
peak over the step (see :func:`sosim.model.activation_bytes_peak`). A result is infeasible when either
side exceeds its usable capacity (capacity minus the profile's ``reserved_gib``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sosim.config import HardwareProfile
from sosim.units import GIB


@dataclass(frozen=True)
class MemoryUsage:
    gpu_bytes: dict[str, float] = field(default_factory=dict)
    # Per rank; a hardware profile describes one GPU's share of its host, so this is also the host's need.
    cpu_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def gpu_peak_bytes(self) -> float:
        return sum(self.gpu_bytes.values())

    @property
    def cpu_peak_bytes(self) -> float:
        return sum(self.cpu_bytes.values())


@dataclass(frozen=True)
class Feasibility:
    feasible: bool
    reason: str = ""


def _items(parts: dict[str, float]) -> str:
    big = sorted(parts.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / GIB:.1f}" for k, v in big if v > 0)


def check_fit(usage: MemoryUsage, hw: HardwareProfile) -> Feasibility:
    gpu_cap = (hw.gpu.hbm_gib - hw.gpu.reserved_gib) * GIB
    cpu_cap = (hw.cpu.mem_gib - hw.cpu.reserved_gib) * GIB
    reasons = []
    if usage.gpu_peak_bytes > gpu_cap:
        reasons.append(
            f"GPU memory: needs {usage.gpu_peak_bytes / GIB:.1f} GiB ({_items(usage.gpu_bytes)}) "
            f"> {gpu_cap / GIB:.1f} GiB usable on {hw.gpu.name}"
        )
    if usage.cpu_peak_bytes > cpu_cap:
        reasons.append(
            f"CPU memory: needs {usage.cpu_peak_bytes / GIB:.1f} GiB ({_items(usage.cpu_bytes)}) "
            f"> {cpu_cap / GIB:.1f} GiB usable on {hw.cpu.name}"
        )
    return Feasibility(not reasons, "; ".join(reasons))
