"""Collective durations on the machine's topology, from measured NCCL curves where the profile has them.

A collective runs over a *group* of ``ranks`` GPUs, ``per_node`` of them on each node. Its analytic time is
the hierarchical (two-level) algorithm NCCL uses across nodes, with both levels pipelined:

* inside a node, over the GPU fabric: ring reduce-scatter / all-gather move ``(g-1)/g`` of the buffer per
  GPU, all-reduce twice that (nccl-tests' bus-bandwidth factors, NVIDIA/nccl-tests doc/PERFORMANCE.md);
* across nodes, over each GPU's share of its node's NICs: after the intra-node reduce-scatter each GPU holds
  ``1/g`` of the buffer, and the inter-node ring moves ``(N-1)/N`` of that (twice for all-reduce);
* all-to-all: each GPU sends ``(n-1)/n`` of its buffer, ``(n-g)/n`` of it across the network.

time = latency + max(intra, inter). The latency is the fabric's inside a node, the network's per tree level
(``ceil(log2 N)`` levels) across nodes.

Measured beats analytic: a profile's NCCL bus-bandwidth curve (nccl-tests ``busbw`` by message size) gives
the time directly inside a node (bus bandwidth is normalised for the rank count), and across nodes the ratio
measured / analytic *at the measured configuration* corrects the analytic time of any other node count at
the same message size (latency floor and protocol efficiency carry over; the scaling with nodes is the
model's).

The NICs of a node are shared by the group's ranks on that node inside the collective (they send together,
each through its share): one collective is one operation of all its ranks, so its NIC share is part of its
algorithm. Traffic of *other* streams on the same NIC is contended in the engine.
"""

from __future__ import annotations

import math
from typing import Literal

from sosim.costs.analytic import interp_log_x
from sosim.hardware.machine import Machine
from sosim.inputs.config import Curve
from sosim.inputs.units import MIB

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]
# Bytes each rank moves per byte of the buffer, times (n-1)/n (nccl-tests bus-bandwidth factors).
BUS_FACTOR: dict[str, float] = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0}


def _check(kind: str, n_bytes: float, ranks: int, per_node: int) -> None:
    if kind not in BUS_FACTOR:
        raise ValueError(f"collective kind must be one of {', '.join(BUS_FACTOR)}, not {kind!r}")
    if n_bytes < 0 or ranks < 1 or per_node < 1 or ranks % per_node:
        raise ValueError(f"collective over {ranks} ranks, {per_node} per node, {n_bytes} bytes: invalid group")


def _busbw_time_s(curve: Curve, kind: str, n_bytes: float, ranks: int) -> float:
    """Time from a bus-bandwidth curve: busbw = factor * (n-1)/n * S / t (nccl-tests definition)."""
    busbw = interp_log_x(curve, n_bytes / MIB) * 1e9
    return BUS_FACTOR[kind] * (ranks - 1) / ranks * n_bytes / busbw


def analytic_s(m: Machine, kind: str, n_bytes: float, ranks: int, per_node: int) -> float:
    """The two-level model without measured corrections."""
    _check(kind, n_bytes, ranks, per_node)
    if ranks <= 1 or n_bytes == 0:
        return 0.0
    g = per_node
    nodes = ranks // per_node
    f = BUS_FACTOR[kind]
    fabric = m.fabric_Bps
    if g > 1 and fabric <= 0:
        # No GPU fabric: peer traffic crosses the host links (GPU -> host -> GPU, the slower direction).
        link = m.profile.link
        fabric = min(link.h2d_GBps, link.d2h_GBps) * 1e9
    if kind == "all_to_all":
        intra = n_bytes * (g - 1) / ranks / fabric if g > 1 else 0.0
        inter = n_bytes * (ranks - g) / ranks / _nic(m) if nodes > 1 else 0.0
    else:
        intra = f * (g - 1) / g * n_bytes / fabric if g > 1 else 0.0
        inter = f * (nodes - 1) / nodes * (n_bytes / g) / _nic(m) if nodes > 1 else 0.0
    return _latency_s(m, nodes) + max(intra, inter)


def collective_s(m: Machine, kind: str, n_bytes: float, ranks: int, per_node: int | None = None) -> float:
    """Seconds for one collective over ``n_bytes`` (the whole buffer, not one rank's shard)."""
    per_node = min(ranks, m.gpus_per_node) if per_node is None else per_node
    _check(kind, n_bytes, ranks, per_node)
    if ranks <= 1 or n_bytes == 0:
        return 0.0
    nodes = ranks // per_node
    if nodes == 1:
        curve, _ = m.measured_busbw(kind, across_nodes=False)
        if curve is not None:
            return _busbw_time_s(curve, kind, n_bytes, ranks)
        return analytic_s(m, kind, n_bytes, ranks, per_node)
    t = analytic_s(m, kind, n_bytes, ranks, per_node)
    curve, measured_nodes = m.measured_busbw(kind, across_nodes=True)
    if curve is not None:
        # The correction is taken where it was measured: measured_nodes full nodes at this message size.
        g = m.profile.gpus_per_node
        ref_ranks = measured_nodes * g
        measured = _busbw_time_s(curve, kind, n_bytes, ref_ranks)
        model = analytic_s(m, kind, n_bytes, ref_ranks, g)
        t *= measured / model
    return t


def inter_node_bytes(m: Machine, kind: str, n_bytes: float, ranks: int, per_node: int | None = None) -> float:
    """Bytes one rank sends across the network in this collective (for traffic accounting)."""
    per_node = min(ranks, m.gpus_per_node) if per_node is None else per_node
    _check(kind, n_bytes, ranks, per_node)
    nodes = ranks // per_node
    if nodes <= 1:
        return 0.0
    if kind == "all_to_all":
        return n_bytes * (ranks - per_node) / ranks
    return BUS_FACTOR[kind] * (nodes - 1) / nodes * n_bytes / per_node


def _nic(m: Machine) -> float:
    bw = m.nic_Bps_per_gpu
    if bw <= 0:
        raise ValueError(f"profile '{m.profile.name}' has no network: a collective across nodes needs NICs")
    return bw


def _latency_s(m: Machine, nodes: int) -> float:
    if nodes <= 1:
        return m.fabric_latency_s
    return m.fabric_latency_s + m.network_latency_s * math.ceil(math.log2(nodes))

