"""Who does CPU work, on how many cores: the training process and, where a system has one, an optimizer worker.

Two serial resources stand for the host side:

* ``CPU_MAIN`` (the training process): its host thread (framework hooks, host synchronisations, blocking
  copies, step() bookkeeping) and the OpenMP work it starts (casts, unscale passes, and the CPU Adam of
  ZeRO-2/3, which runs in the training process);
* ``CPU_OPT`` (an optimizer worker): SuperOffload's Adam process, or the paper schedules' dedicated Adam
  threads.

``cpu_adam_core_fraction`` f splits the cores like DeepSpeed's ``SuperOffloadCPUOptimizer._set_cpu_affinity``
(``runtime/superoffload/superoffload_utils.py``): the training process gets the first int((1 - f) * n) whole
cores and the worker the rest. When int((1 - f) * n) is 0, psutil's ``cpu_affinity([])`` means *all* CPUs, so
both get every core and time-share them: bandwidth-bound work of the two then runs one after the other on
one resource (each at full speed), which is what two memory-bound kernels sharing all cores achieve
together. That is why f = 0.99 behaves like f = 1.0 (there is no one-core cliff).

The affinity call sets the affinity of the calling *thread* (``sched_setaffinity`` on the process id is the
main thread's id): the training process's OpenMP threads, created before it, keep every core. So the
DeepSpeed preset gives the training process's bulk work all cores (``main_threads_follow_affinity=False``);
the paper's schedule pins both sides (``True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sosim.engine.plan import CPU_MAIN, CPU_OPT, Resource

if TYPE_CHECKING:
    from sosim.inputs.config import AdamImpl


@dataclass(frozen=True)
class CpuPlan:
    """Where each kind of CPU work runs and with how many cores."""

    host: Resource  # the training process's host thread (hooks, syncs, blocking calls)
    bulk: Resource  # the training process's multi-threaded bandwidth-bound work (casts, unscale)
    bulk_cores: float
    optimizer: Resource  # where CPU Adam runs
    optimizer_cores: float
    adam: AdamImpl = "cpu_adam"  # which CPU Adam implementation
    # The share of the cores the optimizer worker was given (1: no split): the plan carries it to the engine's
    # contention model, which divides a rank's threads between the two pools by it.
    core_share: float = 1.0

    @property
    def shared(self) -> bool:
        """True when the training process's bulk work and the optimizer run on the same resource."""
        return self.bulk == self.optimizer


def one_process(cores: int, adam: AdamImpl) -> CpuPlan:
    """Everything in the training process on all cores (DeepSpeed ZeRO-2/3: CPU Adam runs in-process)."""
    return CpuPlan(CPU_MAIN, CPU_MAIN, float(cores), CPU_MAIN, float(cores), adam)


def split_cores(cores: int, adam_fraction: float, main_threads_follow_affinity: bool, adam: AdamImpl) -> CpuPlan:
    """A training process and an optimizer worker on ``adam_fraction`` of the cores (whole cores)."""
    main = int((1.0 - adam_fraction) * cores)
    if main == 0:
        # psutil cpu_affinity([]) = all CPUs: both processes on every core, time-sharing them.
        return CpuPlan(CPU_MAIN, CPU_OPT, float(cores), CPU_OPT, float(cores), adam, adam_fraction)
    bulk_cores = float(main) if main_threads_follow_affinity else float(cores)
    return CpuPlan(CPU_MAIN, CPU_MAIN, bulk_cores, CPU_OPT, float(cores - main), adam, adam_fraction)
