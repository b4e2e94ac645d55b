"""Host wall-clock timers wrapped around DeepSpeed 0.19.8's own optimizer methods (no torch import here).

Used by the ``ds_step_fixed`` harness section and by scripts/ds_train_step.py. Each timer wraps one method
of the engine's ZeRO optimizer instance (an instance attribute shadows the class method, so every
``self.method(...)`` call inside DeepSpeed goes through the wrapper) and accumulates the seconds spent in
it until ``take()`` is called. No synchronisation is added: a method that only launches GPU work is
charged its launch time. The methods are those of DeepSpeed 0.19.8 (read in its sources):

ZeRO-3 / SuperOffload (``deepspeed/runtime/zero/stage3.py`` DeepSpeedZeroOptimizer_Stage3 and
``deepspeed/runtime/superoffload/superoffload_stage3.py`` SuperOffloadOptimizer_Stage3):
  step                                    the whole optimizer step (engine.step() calls it)
  _wait_for_async_operations              SuperOffload: wait for the worker's outstanding sub-group Adams
  _pre_step, _partition_all_parameters, _overflow_check_and_loss_scale_update, _get_norm_groups,
  unscale_and_clip_grads, _optimizer_step, _reassign_or_swap_out_partitioned_parameters (the refresh),
  _post_step, _sync_cpu_optimizer_step (SuperOffload with clipping: the worker's Adam, waited for)
  partition_grads                         backward: gradient partitions to the fp32 buffers (per flush)
  independent_gradient_partition_epilogue end of backward (ZeRO-3 waits for its gradient copies here)
  _reassign_or_swap_out_partitioned_parameters_async  SuperOffload: a finished sub-group copied back
ZeRO-1/2 (``deepspeed/runtime/zero/stage_1_and_2.py`` DeepSpeedZeroOptimizer):
  step, _wait_for_offload_copies, scaled_global_norm, unscale_and_clip_grads, _optimizer_step
  (the bf16 refresh is inline in step(): step minus the others).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

TIMED_METHODS: tuple[str, ...] = (
    "step",
    "_wait_for_async_operations",
    "_pre_step",
    "_partition_all_parameters",
    "_overflow_check_and_loss_scale_update",
    "_get_norm_groups",
    "unscale_and_clip_grads",
    "_optimizer_step",
    "_reassign_or_swap_out_partitioned_parameters",
    "_post_step",
    "_sync_cpu_optimizer_step",
    "partition_grads",
    "independent_gradient_partition_epilogue",
    "_reassign_or_swap_out_partitioned_parameters_async",
    "_wait_for_offload_copies",
    "scaled_global_norm",
)

# Short names used as CSV columns (t_<name>_s) and JSON keys.
SHORT_NAMES: dict[str, str] = {
    "step": "opt_step",
    "_wait_for_async_operations": "wait_async",
    "_pre_step": "pre_step",
    "_partition_all_parameters": "partition_all",
    "_overflow_check_and_loss_scale_update": "overflow_check",
    "_get_norm_groups": "norm",
    "unscale_and_clip_grads": "unscale_clip",
    "_optimizer_step": "optimizer",
    "_reassign_or_swap_out_partitioned_parameters": "refresh",
    "_post_step": "post_step",
    "_sync_cpu_optimizer_step": "sync_cpu_optimizer",
    "partition_grads": "partition_grads",
    "independent_gradient_partition_epilogue": "grad_epilogue",
    "_reassign_or_swap_out_partitioned_parameters_async": "async_copy_back",
    "_wait_for_offload_copies": "wait_offload_copies",
    "scaled_global_norm": "norm",
}
# Each short name once, in the order above (ds_train_step.py's t_<name>_s columns).
TIMER_NAMES: tuple[str, ...] = tuple(dict.fromkeys(SHORT_NAMES.values()))


class MethodTimers:
    """Accumulated seconds and call counts per wrapped method since the last ``take()``."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.wrapped: list[str] = []
        self._depth: dict[str, int] = {}

    def wrap(self, obj: Any, names: tuple[str, ...] = TIMED_METHODS) -> list[str]:
        """Wrap every method of ``obj`` in ``names`` that exists; returns the wrapped names."""
        for name in names:
            method = getattr(obj, name, None)
            if method is None or not callable(method):
                continue
            setattr(obj, name, self._timed(name, method))
            self.wrapped.append(name)
        return list(self.wrapped)

    def wrap_callable(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` timed under ``name`` (a hook closure that is not a method: z3_hooks puts the returned
        wrapper back where the closure was registered)."""
        if name not in self.wrapped:
            self.wrapped.append(name)
        return self._timed(name, function)

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            # Why a depth count: a wrapped method that calls itself (or a subclass calling super() through the
            # instance) must be charged once, not once per level.
            depth = self._depth.get(name, 0)
            self._depth[name] = depth + 1
            start_s = self._clock()
            try:
                return method(*args, **kwargs)
            finally:
                self._depth[name] = depth
                if depth == 0:
                    self.seconds[name] = self.seconds.get(name, 0.0) + self._clock() - start_s
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def take(self) -> dict[str, tuple[float, int]]:
        """{short name: (seconds, calls)} since the last take(), then reset. Names sharing a short name add."""
        out: dict[str, tuple[float, int]] = {}
        for name in self.wrapped:
            short = SHORT_NAMES.get(name, name)
            seconds, calls = out.get(short, (0.0, 0))
            out[short] = (seconds + self.seconds.get(name, 0.0), calls + self.calls.get(name, 0))
        self.seconds.clear()
        self.calls.clear()
        return out


def fixed_part_s(timers: dict[str, tuple[float, int]]) -> float:
    """step() minus the optimizer's own work: the wait for the worker, the Adam and the refresh.

    What is left is DeepSpeed's fixed bookkeeping of a step (pre-step, re-partition, norm with its host
    syncs, unscale-and-clip, post-step), the quantity `ds_step_fixed` records.
    """

    def seconds(name: str) -> float:
        return timers.get(name, (0.0, 0))[0]

    return max(
        0.0,
        seconds("opt_step")
        - seconds("wait_async")
        - seconds("optimizer")
        - seconds("sync_cpu_optimizer")
        - seconds("refresh"),
    )
