"""The machine a scenario runs on, resolved from its hardware profile and cluster: nodes, the ranks on one
node, what each rank reaches host memory through, and the shared resources they contend for.

A profile describes a *node* (``node:`` block, see :class:`~sosim.inputs.config.NodeSpec`): its GPUs, CPU sockets,
the host link of each GPU (``link:``, one per GPU: a PCIe x16 port or a Superchip's own C2C), PCIe uplinks
that several GPUs share, each socket's DRAM bandwidth, the GPU fabric, NICs and an NVMe volume. A cluster is
``nodes`` such nodes on a network.

Ranks that behave alike are simulated once: every node runs the same plan (data and sequence parallelism
are symmetric), so only one node is simulated, with all of its ranks, because they share a host (cores,
DRAM, uplinks, NICs, NVMe) and their shared resources are contended in the engine. What crosses nodes enters
through collective durations (:mod:`sosim.costs.collectives`) computed for the whole cluster.

Shared resources have typed ids (:class:`SharedId`: a kind, an index, a part such as a link direction):
:meth:`Machine.shared_resources` lists the node's, and :meth:`Machine.route` gives the ids a transfer between
two memory tiers (HBM, a socket's host DRAM, the NVMe volume) draws on. An id's ``name`` (``link0.h2d``) is
only a label for outputs; nothing parses it.

A profile without a ``node`` block is the legacy description: each GPU of a run has its own copy of the
profile's ``cpu`` and ``link`` (nothing shared between ranks), GPUs per node from ``interconnect``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from sosim.inputs.config import Curve, HardwareProfile, Scenario
from sosim.inputs.units import GB, us_to_s

TierKind = Literal["hbm", "host", "nvme"]
Direction = Literal["h2d", "d2h"]


SharedKind = Literal["link", "uplink", "dram", "socket_link", "nic", "nvme", "cores"]


class SharedId(NamedTuple):
    """A shared resource's id: its kind, which one (a rank's link, an uplink, a socket; -1 for the node-wide
    core pool) and which part of it (a link's ``h2d`` / ``d2h`` / ``bidir`` total, the socket link's ``out`` /
    ``in``, the NVMe volume's ``read`` / ``write``). A named tuple: hashed in C where contention looks it up."""

    kind: SharedKind
    index: int = 0  # type: ignore[assignment]  # shadows tuple.index, a method nothing calls on an id
    part: str = ""

    @property
    def name(self) -> str:
        """The label in outputs (``link0.h2d``, ``dram1``, ``socket_link.out0``, ``nvme.read``, ``cores``)."""
        if self.kind in ("link", "uplink"):
            return f"{self.kind}{self.index}.{self.part}"
        if self.kind == "socket_link":
            return f"socket_link.{self.part}{self.index}"
        if self.kind == "nvme":
            return f"nvme.{self.part}"
        if self.kind == "cores" and self.index < 0:
            return "cores"
        return f"{self.kind}{self.index}"


def link_id(kind: Literal["link", "uplink"], index: int, part: Direction | Literal["bidir"]) -> SharedId:
    return SharedId(kind, index, part)


def dram_id(socket: int) -> SharedId:
    return SharedId("dram", socket)


def nvme_id(write: bool) -> SharedId:
    return SharedId("nvme", 0, "write" if write else "read")


def cores_id(socket: int | None) -> SharedId:
    """A socket's core pool, or the node-wide pool (``None``)."""
    return SharedId("cores", -1 if socket is None else socket)


@dataclass(frozen=True)
class SharedResource:
    """A capacity that ops running at the same time draw on (bytes/s, or cores for a core pool)."""

    id: SharedId
    capacity: float

    @property
    def name(self) -> str:
        return self.id.name

    @property
    def kind(self) -> SharedKind:
        return self.id.kind


@dataclass(frozen=True)
class Machine:
    profile: HardwareProfile
    gpus: int  # ranks in the whole run
    gpus_per_node: int  # ranks on each node
    nodes: int
    legacy: bool  # profile without a node block: every rank has a private host
    rank_socket: tuple[int, ...]  # socket of each local rank's GPU (its NUMA node)
    threads_per_rank: int  # CPU threads of each rank (its OpenMP pool)
    sockets: int
    cores_per_socket: int
    rank_uplink: tuple[int, ...]  # uplink index of each local rank, -1 when its port is its own
    rank_nic: tuple[int, ...]  # NIC index of each local rank, -1 when the profile has no NICs
    # Socket holding each local rank's optimizer state and running its CPU Adam (cluster.optimizer_socket);
    # equal to rank_socket unless the scenario borrows a neighbour's.
    rank_opt_socket: tuple[int, ...] = ()

    # ---- construction -----------------------------------------------------------------------------------------
    @classmethod
    def from_scenario(cls, sc: Scenario) -> Machine:
        hw = sc.hardware
        total = sc.cluster.gpus
        per_node = sc.cluster.gpus_per_node or min(total, hw.gpus_per_node)
        nodes = -(-total // per_node)
        node = hw.node
        cores = hw.cpu.cores
        # A system whose launcher sets the threads (torchrun's OMP_NUM_THREADS=1 for FSDP2) says so on its knobs.
        default_threads = getattr(sc.schedule, "rank_threads_default", None)
        if node is None:
            legacy_threads = default_threads(per_node, cores) if callable(default_threads) else cores
            return cls(hw, total, per_node, nodes, True, tuple(range(per_node)),
                       sc.cluster.cpu_threads_per_rank or legacy_threads, per_node, cores,
                       tuple([-1] * per_node), tuple(range(per_node)) if hw.interconnect else tuple([-1] * per_node),
                       tuple(range(per_node)))
        sockets = node.cpu_sockets
        gpu_socket = node.gpu_socket or [g * sockets // node.gpus for g in range(node.gpus)]
        # The run uses the node's first per_node GPUs (CUDA_VISIBLE_DEVICES order).
        rank_socket = tuple(gpu_socket[g] for g in range(per_node))
        # DeepSpeed's launcher with --bind_cores_to_rank: physical cores // local ranks (numa.get_numactl_cmd);
        # with fewer ranks than sockets a rank still stays on its own socket (numactl binds it to that NUMA
        # domain), so it gets at most one socket's cores unless the scenario says otherwise. Without binding
        # (the launcher's default) each rank's pool has torch's default, every core: modelled as the cores of
        # its GPU's socket, time-shared with the other ranks there (what the single-socket lent machine
        # measured); an unbound pool spreading over other sockets' cores and memory is not modelled.
        launched = max(1, min(cores, cores * sockets // per_node)) if sc.cluster.bind_cores_to_rank else cores
        if callable(default_threads):
            launched = default_threads(per_node, launched)
        threads = sc.cluster.cpu_threads_per_rank or launched
        uplink_of = {g: i for i, up in enumerate(node.uplinks) for g in up.gpus}
        rank_uplink = tuple(uplink_of.get(g, -1) for g in range(per_node))
        if node.nics is None:
            rank_nic = tuple([-1] * per_node)
        else:
            nic = node.nics
            gpu_nic = nic.gpu_nic or [g * nic.count // node.gpus for g in range(node.gpus)]
            rank_nic = tuple(gpu_nic[g] for g in range(per_node))
        opt_socket = _optimizer_sockets(sc.cluster.optimizer_socket, rank_socket, sockets)
        return cls(hw, total, per_node, nodes, False, rank_socket, threads, sockets, cores, rank_uplink, rank_nic,
                   opt_socket)

    # ---- what the ranks see -----------------------------------------------------------------------------------
    @property
    def local_ranks(self) -> int:
        return self.gpus_per_node

    def ranks_on_socket(self, socket: int) -> int:
        return sum(1 for s in self.rank_socket if s == socket)

    # ---- routes between memory tiers --------------------------------------------------------------------------
    def route(self, rank: int, src: TierKind, dst: TierKind, socket: int | None = None) -> tuple[SharedId, ...]:
        """Shared resources a transfer of local ``rank`` from tier ``src`` to ``dst`` draws on.

        ``socket``: the host socket involved (default: the rank's own; another one crosses the socket link).
        """
        host = self._host_of(rank) if socket is None else socket
        own = self._host_of(rank)
        if {src, dst} == {"hbm", "host"}:
            d: Direction = "h2d" if src == "host" else "d2h"
            ids = [link_id("link", rank, d), link_id("link", rank, "bidir")]
            up = self.rank_uplink[rank]
            if up >= 0:
                ids += [link_id("uplink", up, d), link_id("uplink", up, "bidir")]
            if host != own:
                ids.append(SharedId("socket_link", host, "out" if d == "h2d" else "in"))
            if self._has_dram:
                ids.append(dram_id(host))
            return tuple(ids)
        if {src, dst} == {"host", "nvme"}:
            ids = [nvme_id(write=src != "nvme")]
            if self._has_dram:
                ids.append(dram_id(host))
            return tuple(ids)
        if {src, dst} == {"hbm", "nvme"}:
            # Without GPUDirect Storage the data bounces through the rank's host memory.
            names = [nvme_id(write=src != "nvme")]
            node = self.profile.node
            if node is None or node.nvme is None or not node.nvme.gds:
                names += list(self.route(rank, "host" if src == "nvme" else "hbm", "hbm" if src == "nvme" else "host"))
            return tuple(names)
        raise ValueError(f"no route from {src} to {dst}")

    @property
    def borrows_sockets(self) -> bool:
        """True when some rank's optimizer state and CPU Adam sit on another socket than its GPU's."""
        return not self.legacy and self.rank_opt_socket != self.rank_socket

    def opt_socket(self, rank: int) -> int:
        """Socket of local ``rank``'s optimizer state and CPU Adam."""
        return self.rank_opt_socket[rank] if self.rank_opt_socket else self._host_of(rank)

    def _host_of(self, rank: int) -> int:
        return rank if self.legacy else self.rank_socket[rank]

    @property
    def _has_dram(self) -> bool:
        node = self.profile.node
        return node is not None and node.dram_GBps is not None

    # ---- shared resources ---------------------------------------------------------------------------------------
    def shared_resources(self) -> list[SharedResource]:
        """Every shared capacity of the simulated node (only those the run's ranks can reach)."""
        hw = self.profile
        link = hw.link
        out: list[SharedResource] = []
        for r in range(self.local_ranks):
            out += [SharedResource(link_id("link", r, "h2d"), link.h2d_GBps * GB),
                    SharedResource(link_id("link", r, "d2h"), link.d2h_GBps * GB),
                    SharedResource(link_id("link", r, "bidir"), link.bidir_GBps * GB)]
        node = hw.node
        if node is None:
            return out
        used_uplinks = sorted({u for u in self.rank_uplink if u >= 0})
        for u in used_uplinks:
            up = node.uplinks[u]
            out += [SharedResource(link_id("uplink", u, "h2d"), up.h2d_GBps * GB),
                    SharedResource(link_id("uplink", u, "d2h"), up.d2h_GBps * GB),
                    SharedResource(link_id("uplink", u, "bidir"), up.bidir_GBps * GB)]
        if node.dram_GBps is not None:
            out += [SharedResource(dram_id(s), node.dram_GBps * GB) for s in range(self.sockets)]
        if node.socket_link is not None:
            for s in range(self.sockets):
                out += [SharedResource(SharedId("socket_link", s, "out"), node.socket_link.GBps * GB),
                        SharedResource(SharedId("socket_link", s, "in"), node.socket_link.GBps * GB)]
        if node.nics is not None:
            out += [SharedResource(SharedId("nic", i), node.nics.GBps * GB)
                    for i in sorted({n for n in self.rank_nic if n >= 0})]
        if node.nvme is not None:
            out += [SharedResource(nvme_id(write=False), node.nvme.read_GBps * GB),
                    SharedResource(nvme_id(write=True), node.nvme.write_GBps * GB)]
        if self.borrows_sockets:
            # Borrowed cores belong to one socket: each socket is its own pool, so a rank's Adam on a neighbour
            # competes only with what runs on that neighbour's cores.
            out += [SharedResource(cores_id(s), float(self.cores_per_socket)) for s in range(self.sockets)]
        else:
            # Each rank's pool stays on its own socket (one socket at most, see from_scenario): one node-wide pool.
            out.append(SharedResource(cores_id(None), float(self.cores_per_socket * self.sockets)))
        return out

    # ---- link and collective parameters -----------------------------------------------------------------------
    @property
    def fabric_Bps(self) -> float:
        """Per GPU and direction into the node's GPU fabric (0: no fabric)."""
        hw = self.profile
        if hw.node is not None:
            fab = hw.node.fabric
            return fab.GBps * GB if fab is not None and fab.kind != "none" else 0.0
        return hw.interconnect.gpu_gpu_GBps * GB if hw.interconnect is not None else 0.0

    @property
    def fabric_latency_s(self) -> float:
        hw = self.profile
        if hw.node is not None:
            return us_to_s(hw.node.fabric.latency_us) if hw.node.fabric is not None else 0.0
        return us_to_s(hw.interconnect.latency_us) if hw.interconnect is not None else 0.0

    @property
    def nic_Bps_per_gpu(self) -> float:
        """Network bandwidth per GPU when all GPUs of a node send at once (0: no network)."""
        hw = self.profile
        if hw.node is not None:
            nic = hw.node.nics
            if nic is None:
                return 0.0
            # NICs serving the ranks of one node, divided among those ranks (they communicate together).
            used = {n for n in self.rank_nic if n >= 0}
            return nic.GBps * GB * len(used) / self.local_ranks
        return hw.interconnect.node_node_GBps * GB if hw.interconnect is not None else 0.0

    @property
    def network_latency_s(self) -> float:
        hw = self.profile
        if hw.network is not None:
            return us_to_s(hw.network.latency_us)
        return self.fabric_latency_s

    def measured_busbw(self, kind: str, across_nodes: bool) -> tuple[Curve | None, int]:
        """Measured NCCL bus-bandwidth curve for ``kind`` (MiB -> GB/s) and the node count it was taken on."""
        hw = self.profile
        if across_nodes:
            if hw.network is not None and kind in hw.network.nccl_busbw_GBps_by_mib:
                return hw.network.nccl_busbw_GBps_by_mib[kind], hw.network.nccl_nodes  # type: ignore[index]
            return None, 0
        if hw.node is not None and hw.node.fabric is not None and kind in hw.node.fabric.nccl_busbw_GBps_by_mib:
            return hw.node.fabric.nccl_busbw_GBps_by_mib[kind], 1  # type: ignore[index]
        return None, 0

    def describe(self) -> dict[str, object]:
        """Facts for a result's provenance."""
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "cpu_threads_per_rank": self.threads_per_rank,
            "host_model": "private host per GPU (legacy profile)" if self.legacy else "shared node",
            **({"optimizer_sockets": list(self.rank_opt_socket)} if self.borrows_sockets else {}),
        }


def _optimizer_sockets(placement: str | list[int], rank_socket: tuple[int, ...], sockets: int) -> tuple[int, ...]:
    """Socket of each local rank's optimizer (see ``ClusterSpec.optimizer_socket``)."""
    if isinstance(placement, list):
        return tuple(placement)
    if placement == "own":
        return rank_socket
    # "neighbour": the sockets no local rank's GPU sits on, handed out in turn (2 ranks on a quad-GH200 node
    # borrow the two idle Graces); with none idle, the next socket (it is then shared with that socket's rank).
    idle = [s for s in range(sockets) if s not in rank_socket]
    if idle:
        return tuple(idle[r % len(idle)] for r in range(len(rank_socket)))
    return tuple((s + 1) % sockets for s in rank_socket)


# --- the NVMe tier ---------------------------------------------------------------------------------------------
# DeepSpeed's aio defaults (deepspeed/runtime/swap_tensor/aio_config.py): 1 MiB blocks, queue depth 8, one
# thread per operation (intra_op_parallelism).
AIO_BLOCK_BYTES = 1 << 20
AIO_QUEUE_DEPTH = 8
AIO_THREADS = 1


def nvme_throughput_Bps(m: Machine, write: bool, block_bytes: float = AIO_BLOCK_BYTES,
                        queue_depth: int = AIO_QUEUE_DEPTH, threads: int = AIO_THREADS) -> float:
    """Sustained rate of one rank's direct I/O stream on the node's NVMe volume.

    Little's law: with ``queue_depth x threads`` blocks in flight, each taking the drive latency plus its
    transfer at one drive's share of the volume's rate, the stream moves at most that many blocks per block
    time; it never exceeds the volume's measured aggregate (RAID-0 of ``drives``). Small blocks or a shallow
    queue leave drives idle: that is why DeepSpeed's aio ``block_size``, ``queue_depth`` and
    ``intra_op_parallelism`` matter.
    """
    node = m.profile.node
    if node is None or node.nvme is None:
        raise ValueError(f"profile '{m.profile.name}' has no NVMe volume (node.nvme)")
    nv = node.nvme
    aggregate = (nv.write_GBps if write else nv.read_GBps) * GB
    per_drive = aggregate / nv.drives
    block_s = us_to_s(nv.latency_us) + block_bytes / per_drive
    in_flight = max(1, queue_depth) * max(1, threads)
    return min(aggregate, in_flight * block_bytes / block_s)


def nvme_s(m: Machine, n_bytes: float, write: bool, block_bytes: float = AIO_BLOCK_BYTES,
           queue_depth: int = AIO_QUEUE_DEPTH, threads: int = AIO_THREADS) -> float:
    """Seconds to read or write ``n_bytes`` on the node's NVMe volume, one rank alone on it."""
    if n_bytes <= 0:
        return 0.0
    node = m.profile.node
    assert node is not None and node.nvme is not None
    return us_to_s(node.nvme.latency_us) + n_bytes / nvme_throughput_Bps(m, write, block_bytes, queue_depth, threads)


# --- what the schedules ask of the machine ----------------------------------------------------------------------
def zero_group(sc: Scenario) -> int:
    """Ranks a ZeRO partition is spread over: data x sequence parallel. With Ulysses every sequence rank
    computes gradients of all parameters on its slice of the sequence, so DeepSpeed reduces and partitions
    over the combined sequence-data-parallel group (deepspeed/utils/groups.py
    ``_get_sequence_data_parallel_group``, used by the ZeRO optimizers when sequence parallelism is on)."""
    return sc.cluster.dp * sc.cluster.sequence_parallel
