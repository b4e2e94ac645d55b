"""Which kind of machine the calibration runs on, and what that selects: x86 + PCIe, or Grace (aarch64) + C2C.

Torch-free and sosim-free (the harness loads it standalone on a GPU machine, and the tests fake every input):
:func:`detect` reads the architecture, ``/proc/cpuinfo`` and the GPU's name; :func:`plan_for` turns the result
into the sections ``sosim calibrate --profile`` runs, the host thread counts, the link kind the written profile
states and the shipped profile it starts from (the "nearest kind" for what a quick calibration does not time).

Why Grace is detected from the CPU and not only from the GPU's name: a GH200's GPU reports itself as
"NVIDIA GH200 480GB" (or "... 144G HBM3e"), but an H100 PCIe card in an aarch64 Grace server (no C2C) must not
be given a C2C link; the link kind follows from both facts together (:attr:`Platform.link_kind`).
"""

from __future__ import annotations

import os
import platform as _platform
from dataclasses import dataclass, field
from pathlib import Path

# Arm's part number of the Neoverse V2 core that Grace uses (implementer 0x41 = Arm Ltd); /proc/cpuinfo's
# "CPU part" line. Source: Arm Neoverse V2 TRM, MIDR_EL1.PartNum = 0xD4F.
NEOVERSE_V2_PART = "0xd4f"
ARM_IMPLEMENTER = "0x41"

# The harness sections a profile needs, in the order that keeps CPU timings clean: the GPU sections first (a
# background CPUAdam compile may still be running), then everything that times host work.
GPU_SECTIONS: tuple[str, ...] = ("gemm", "attention", "layer", "gpu_cast")
# host_warmup first: it touches host memory once so that no later section times a fresh VM's page backing.
HOST_SECTIONS: tuple[str, ...] = ("host_warmup", "copy", "cpu_cast", "cpu_adam")
# DeepSpeed's own access patterns (need DeepSpeed; transformers for layer_z3): the stage-3 refresh, the hooks,
# step()'s fixed part, SuperOffload's worker round trip and gradient flush, ZeRO-2's flush and ZeRO-Infinity's
# fetch (layer_offload).
DEEPSPEED_SECTIONS: tuple[str, ...] = ("ds_refresh", "layer_z3", "ds_step_fixed", "so_worker", "so_grads",
                                       "layer_offload")
# Grace only: copies that C2C makes cheap and a PCIe host cannot do at all (system-allocated memory read by the
# GPU through the coherent link; see c2c_bench.py).
GRACE_SECTIONS: tuple[str, ...] = ("c2c_access",)
# Sections that need two GPUs of one host (issue 27): NCCL between them, and both ranks' host work at once (CPU Adam
# and copies of two processes sharing the cores and DRAM), which a 2-GPU step's prediction rests on.
MULTI_GPU_SECTIONS: tuple[str, ...] = ("nccl", "host_shared")


@dataclass(frozen=True)
class Platform:
    """What :func:`detect` found (every field can be given by hand in tests)."""

    arch: str  # platform.machine(): x86_64, aarch64, ...
    cpu_implementer: str = ""  # /proc/cpuinfo "CPU implementer" (Arm), lower case
    cpu_part: str = ""  # /proc/cpuinfo "CPU part" (Arm), lower case
    gpu_name: str = ""
    cores: int = 1
    gpus: int = 1  # torch.cuda.device_count(): the 2-GPU sections run only where there are two

    @property
    def is_aarch64(self) -> bool:
        return self.arch.lower() in ("aarch64", "arm64")

    @property
    def is_grace(self) -> bool:
        """An Arm Neoverse V2 host (Grace), or any aarch64 host whose GPU is a GH200 / GB200 superchip."""
        neoverse_v2 = self.cpu_implementer == ARM_IMPLEMENTER and self.cpu_part == NEOVERSE_V2_PART
        superchip = any(tag in self.gpu_name.upper() for tag in ("GH200", "GB200"))
        return self.is_aarch64 and (neoverse_v2 or superchip)

    @property
    def link_kind(self) -> str:
        """``c2c`` for a Grace superchip (GPU name says GH200/GB200), else ``pcie`` (a PCIe card in any host)."""
        superchip = any(tag in self.gpu_name.upper() for tag in ("GH200", "GB200"))
        return "c2c" if self.is_grace and superchip else "pcie"


@dataclass(frozen=True)
class CalibrationPlan:
    """What ``sosim calibrate --profile`` does on one platform."""

    sections: tuple[str, ...]
    template_profile: str  # the shipped profile whose unmeasured numbers the written profile starts from
    link_kind: str
    thread_counts: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())


def _cpuinfo_field(text: str, key: str) -> str:
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == key:
            return value.strip().lower()
    return ""


def detect(
    arch: str | None = None, cpuinfo_text: str | None = None, gpu_name: str = "", cores: int | None = None,
    gpus: int = 1,
) -> Platform:
    """This machine's platform; each argument replaces the corresponding probe (tests fake them all)."""
    if cpuinfo_text is None:
        path = Path("/proc/cpuinfo")
        cpuinfo_text = path.read_text(errors="replace") if path.exists() else ""
    return Platform(
        arch=arch if arch is not None else _platform.machine(),
        cpu_implementer=_cpuinfo_field(cpuinfo_text, "cpu implementer"),
        cpu_part=_cpuinfo_field(cpuinfo_text, "cpu part"),
        gpu_name=gpu_name,
        cores=cores if cores is not None else len(os.sched_getaffinity(0)),
        gpus=gpus,
    )


def host_thread_counts(cores: int, quick: bool) -> tuple[int, ...]:
    """Thread counts for CPU Adam and casts: a few below 16, and always every core the run may use (a 72-core
    Grace's all-cores rate is the one a profile needs; the old 1..16 grid never reached it)."""
    wanted = (1, 4, 16) if quick else (1, 2, 4, 8, 16)
    counts = sorted({t for t in wanted if t <= cores} | {cores})
    return tuple(counts)


def plan_for(plat: Platform, quick: bool, deepspeed: bool) -> CalibrationPlan:
    """The sections, template profile, link kind and thread counts for ``plat``."""
    notes: list[str] = []
    sections = [*GPU_SECTIONS, *HOST_SECTIONS]
    if plat.is_grace:
        sections += list(GRACE_SECTIONS)
        template = "gh200"
        notes.append("Grace host: CPU Adam as DeepSpeed builds it on aarch64 (NEON/SVE, no AVX), C2C copies "
                     "including system-allocated memory read coherently by the GPU")
    else:
        template = "h200-pcie-gen5-x86"
        if plat.is_aarch64:
            notes.append("aarch64 host without a Grace superchip: treated as a PCIe host")
    if deepspeed:
        sections += list(DEEPSPEED_SECTIONS)
        # In-step host costs (instep_bench, issue 23 item 1), right after ds_step_fixed's place (before the
        # longer layer sections, so that a run cut short by a lease limit has them). Quick: it replaces
        # ds_step_fixed, whose rows it writes from the same model's steps (two more systems' short runs).
        at = sections.index("ds_step_fixed")
        sections.insert(at + 1, "instep")
        if quick:
            sections.remove("ds_step_fixed")
        if plat.gpus >= 2:
            sections += list(MULTI_GPU_SECTIONS)
            notes.append(f"{plat.gpus} GPUs: NCCL between two of them and two ranks' host work at once "
                         "(nccl, host_shared)")
    else:
        notes.append("DeepSpeed not importable: no ds_refresh/layer_z3/ds_step_fixed/so_worker/so_grads/"
                     "layer_offload rows; the profile's stage-3 costs stay analytic")
    return CalibrationPlan(
        sections=tuple(sections),
        template_profile=template,
        link_kind=plat.link_kind,
        thread_counts=host_thread_counts(plat.cores, quick),
        notes=tuple(notes),
    )
