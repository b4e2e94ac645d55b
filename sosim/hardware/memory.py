"""Memory footprints per tier and the feasibility verdict.

Each schedule reports what one rank keeps resident on the GPU, in host memory and on NVMe as named byte
counts (:class:`MemoryUsage`). The peak is the sum of the resident items; activations are already their
peak over the step (see :func:`sosim.hardware.model.activation_bytes_peak`). A result is infeasible when a tier
exceeds its usable capacity (capacity minus the profile's ``reserved_gib``).

Host memory and the NVMe volume are shared: every rank whose GPU sits on a socket keeps its host state in
that socket's memory (one ``cpu.mem_gib`` per socket), and all ranks of a node share its NVMe volume. A
legacy profile (no ``node`` block) gives each rank a host of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sosim.inputs.config import HardwareProfile
from sosim.inputs.units import GIB

if TYPE_CHECKING:
    from sosim.hardware.machine import Machine


@dataclass(frozen=True)
class MemoryUsage:
    gpu_bytes: dict[str, float] = field(default_factory=dict)
    # Per rank; ranks sharing a socket add up (see check_fit).
    cpu_bytes: dict[str, float] = field(default_factory=dict)
    # Per rank, on the node's NVMe volume (ZeRO-Infinity offload_optimizer / offload_param: nvme).
    nvme_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def gpu_peak_bytes(self) -> float:
        return sum(self.gpu_bytes.values())

    @property
    def cpu_peak_bytes(self) -> float:
        return sum(self.cpu_bytes.values())

    @property
    def nvme_peak_bytes(self) -> float:
        return sum(self.nvme_bytes.values())


@dataclass(frozen=True)
class Feasibility:
    feasible: bool
    reason: str = ""


def _items(parts: dict[str, float]) -> str:
    big = sorted(parts.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / GIB:.1f}" for k, v in big if v > 0)


def check_fit(usage: MemoryUsage, hw: HardwareProfile, machine: Machine | None = None) -> Feasibility:
    """Whether one rank's usage fits, with host memory and NVMe shared as the machine shares them."""
    gpu_cap = (hw.gpu.hbm_gib - hw.gpu.reserved_gib) * GIB
    cpu_cap = (hw.cpu.mem_gib - hw.cpu.reserved_gib) * GIB
    # The busiest socket holds this many ranks' host state (1 on a legacy profile: a host per GPU).
    sharing = 1
    if machine is not None and not machine.legacy:
        sharing = max(machine.ranks_on_socket(s) for s in set(machine.rank_socket))
    reasons = []
    if usage.gpu_peak_bytes > gpu_cap:
        reasons.append(
            f"GPU memory: needs {usage.gpu_peak_bytes / GIB:.1f} GiB ({_items(usage.gpu_bytes)}) "
            f"> {gpu_cap / GIB:.1f} GiB usable on {hw.gpu.name}"
        )
    if usage.cpu_peak_bytes * sharing > cpu_cap:
        per = f"{sharing} ranks x " if sharing > 1 else ""
        reasons.append(
            f"CPU memory: needs {per}{usage.cpu_peak_bytes / GIB:.1f} GiB ({_items(usage.cpu_bytes)}) "
            f"> {cpu_cap / GIB:.1f} GiB usable on {hw.cpu.name}"
        )
    if usage.nvme_peak_bytes > 0:
        nvme = hw.node.nvme if hw.node is not None else None
        ranks = machine.local_ranks if machine is not None else 1
        if nvme is None:
            reasons.append(f"NVMe: needs {usage.nvme_peak_bytes / GIB:.1f} GiB but profile '{hw.name}' has no nvme")
        elif usage.nvme_peak_bytes * ranks > nvme.capacity_gib * GIB:
            reasons.append(
                f"NVMe: needs {ranks} ranks x {usage.nvme_peak_bytes / GIB:.1f} GiB ({_items(usage.nvme_bytes)}) "
                f"> {nvme.capacity_gib:.0f} GiB on the node's volume"
            )
    return Feasibility(not reasons, "; ".join(reasons))
