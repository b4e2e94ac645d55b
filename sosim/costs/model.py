"""The one cost object the schedules see: component costs, the machine's topology, one explicit cache.

:class:`Costs` is built once per simulation (``sosim.run.simulate.make_costs``) from

* the *components*: the analytic model, or the measured table over it (what-if rescaling included:
  :mod:`sosim.costs.table`), or a sampled table for one error-band replay (``sosim.answers.bands``): whatever
  produced a duration, the schedules ask this object for it;
* the *topology* (the scenario's :class:`~sosim.hardware.machine.Machine`): collectives run over the node's
  fabric, NICs and network with the profile's measured NCCL curves (:mod:`sosim.costs.collectives`), and disk
  I/O on the node's NVMe volume at the rank's aio settings (:func:`sosim.hardware.machine.nvme_s`). On a
  legacy profile (no node block) collectives whose grouping the schedule leaves to the machine are the
  components' own, and disk is the components' per-drive estimate (:meth:`Costs.collective_s` says why).

Every cost is a pure function of its arguments for a given object, so each method remembers its answers in
its own dict, keyed by the call's arguments (iterations, groups and layers of the same size ask the same
questions). The cache lives and dies with the object: nothing global, no attribute interception. A table's
provenance ledger therefore counts *distinct* lookups (cache misses) of this object.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from sosim.costs import collectives
from sosim.costs.analytic import AnalyticCostModel, CollectiveKind
from sosim.costs.calibration_table import CalibrationTable
from sosim.hardware.machine import AIO_BLOCK_BYTES, AIO_QUEUE_DEPTH, AIO_THREADS, Machine, nvme_s

P = ParamSpec("P")
R = TypeVar("R", bound=float | None)  # every cost is seconds (so_flush_s: or None)

_METHODS: tuple[str, ...] = (
    "layer_fwd_s", "layer_bwd_s", "head_fwd_s", "head_bwd_s", "gpu_adam_s", "gpu_cast_s", "gpu_quantize_s", "copy_s",
    "cpu_adam_s",
    "cpu_cast_s", "cpu_norm_s", "collective_s", "disk_s", "ds_refresh_s", "stage3_hook_s", "ds_unscale_clip_s",
    "ds_step_fixed_s", "so_worker_roundtrip_s", "so_flush_s",
)


def _cached(method: Callable[Concatenate[Costs, P], R]) -> Callable[Concatenate[Costs, P], R]:
    """Remember ``method``'s answers in the object's dict for that method, keyed by the call's arguments."""
    name = method.__name__

    def call(self: Costs, *args: P.args, **kwargs: P.kwargs) -> R:
        key: object = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        memo = self._cache[name]
        try:
            return memo[key]  # type: ignore[return-value]  # one lookup when remembered (most calls)
        except KeyError:
            value = method(self, *args, **kwargs)
            memo[key] = value
            return value

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


def _cost(method: Callable[Concatenate[AnalyticCostModel, P], R]) -> Callable[Concatenate[Costs, P], R]:
    """The components' cost ``method`` (declared there, once; a table model overrides the measured ones), asked
    of this object's components and remembered as :func:`_cached` remembers."""
    name = method.__name__

    def ask(self: Costs, *args: P.args, **kwargs: P.kwargs) -> R:
        # By name: the components' own class answers (a table model's override where it has one).
        answer: Callable[P, R] = getattr(self.components, name)
        return answer(*args, **kwargs)

    ask.__name__ = name
    ask.__doc__ = method.__doc__
    return _cached(ask)


class Costs:
    """Every duration a schedule needs (systems are given this object, typed: no protocol besides it), in seconds for
    one GPU's share of the work, with the machine's topology built in and each answer cached."""

    def __init__(self, components: AnalyticCostModel, machine: Machine | None = None) -> None:
        self.components = components
        self.machine = machine
        # A legacy profile (no node block) keeps its components' collectives for groups the schedule does not
        # shape itself (its golden numbers were made so); a node block puts every collective on the topology.
        self.topology = machine is not None and not machine.legacy
        # method name -> call arguments -> seconds (None: so_flush_s without measured rows).
        self._cache: dict[str, dict[object, float | None]] = {name: {} for name in _METHODS}

    def cache_sizes(self) -> dict[str, int]:
        """Distinct calls remembered per method (for tests and profiling)."""
        return {name: len(memo) for name, memo in self._cache.items() if memo}

    # --- the components' costs, each declared once (on AnalyticCostModel; a table model overrides the measured
    # ones) and asked here through this object's cache ------------------------------------------------------
    # GPU
    layer_fwd_s = _cost(AnalyticCostModel.layer_fwd_s)
    layer_bwd_s = _cost(AnalyticCostModel.layer_bwd_s)
    head_fwd_s = _cost(AnalyticCostModel.head_fwd_s)
    head_bwd_s = _cost(AnalyticCostModel.head_bwd_s)
    gpu_adam_s = _cost(AnalyticCostModel.gpu_adam_s)
    gpu_cast_s = _cost(AnalyticCostModel.gpu_cast_s)
    gpu_quantize_s = _cost(AnalyticCostModel.gpu_quantize_s)

    # host link and CPU
    copy_s = _cost(AnalyticCostModel.copy_s)
    cpu_adam_s = _cost(AnalyticCostModel.cpu_adam_s)
    cpu_cast_s = _cost(AnalyticCostModel.cpu_cast_s)
    cpu_norm_s = _cost(AnalyticCostModel.cpu_norm_s)

    # --- topology: collectives and disk ----------------------------------------------------------------------
    @_cached
    def collective_s(self, kind: CollectiveKind, n_bytes: float, ranks: int, per_node: int | None = None) -> float:
        """One collective over ``ranks`` GPUs, ``per_node`` of them on each node, on the machine's topology
        (:func:`sosim.costs.collectives.collective_s`). ``per_node`` None: as many as share a node; on a legacy
        profile, the components' own collective (its ring over ``interconnect``, or the table's NCCL rows).
        A schedule that shapes its groups itself (ZeRO++'s hpZ and qgZ, sosim/schedules/zero3.py) passes
        ``per_node`` and gets the two-level model on either kind of profile, as it always did."""
        if per_node is None:
            if not self.topology or self.machine is None:
                return self.components.collective_s(kind, n_bytes, ranks)
            if ranks <= 1:
                return 0.0
            per_node = math.gcd(ranks, min(ranks, self.machine.gpus_per_node))
        if self.machine is None:
            return self.components.collective_s(kind, n_bytes, ranks)
        return collectives.collective_s(self.machine, kind, n_bytes, ranks, per_node)

    @_cached
    def disk_s(self, n_bytes: float, write: bool, block_bytes: float = AIO_BLOCK_BYTES,
               queue_depth: int = AIO_QUEUE_DEPTH, threads: int = AIO_THREADS) -> float:
        """``n_bytes`` to or from the node's NVMe volume at the rank's aio settings (DeepSpeed's defaults unless
        given); without a volume in the profile, the components' per-drive estimate (or table rows)."""
        node = None if self.machine is None else self.machine.profile.node  # a legacy profile has none
        if self.machine is None or node is None or node.nvme is None:
            return self.components.disk_s(n_bytes, write)
        return nvme_s(self.machine, n_bytes, write, block_bytes, queue_depth, threads)

    # DeepSpeed stage-3 paths
    ds_refresh_s = _cost(AnalyticCostModel.ds_refresh_s)
    stage3_hook_s = _cost(AnalyticCostModel.stage3_hook_s)
    ds_unscale_clip_s = _cost(AnalyticCostModel.ds_unscale_clip_s)
    ds_step_fixed_s = _cost(AnalyticCostModel.ds_step_fixed_s)
    so_worker_roundtrip_s = _cost(AnalyticCostModel.so_worker_roundtrip_s)
    so_flush_s = _cost(AnalyticCostModel.so_flush_s)

    def measured_table(self) -> CalibrationTable | None:
        """The calibration table behind the components (a replay's sampled one in a band), or None: DeepSpeed's
        per-tensor host costs are read from its rows (sosim/costs/offload_mechanisms.py)."""
        return self.components.measured_table()

    @property
    def provenance(self) -> dict[str, str]:
        out = dict(self.components.provenance)
        if self.topology:
            out["collectives"] = "topology (sosim/costs/collectives.py)"
        return out
