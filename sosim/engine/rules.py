"""What one op draws on, per second at full speed: one rule per kind of resource an op runs on.

The loop over a plan's ops is written once (:func:`sosim.engine.contention.contention_for`); each rule fills in
the demand of its kind of op, from the machine's shared resources (:class:`Site`), and keeps what it works out
once per resource (routes, indices) to itself. A new kind of sharing is a new rule here (and the shared resource
it draws on, in :meth:`sosim.hardware.machine.Machine.shared_resources`), not a new branch of the loop. The
pattern is SimPy's ``resources/base.py`` (the queueing loop written once, each resource kind filling its hooks)
and ASTRA-sim's network API (a model behind a narrow interface, swappable).

The rules, by the kind of resource an op runs on:

* :class:`CopyRule` (H2D, D2H): its bytes per second on every resource of its route; far below the link's pinned
  rate, a copy the CPU stages, which also takes the rank's threads and crosses the socket's DRAM three times;
* :class:`NvmeRule` (NVMe read, write): the node's volume in that direction and the socket's DRAM;
* :class:`CpuRule` (the training process, the optimizer worker): the host thread's own work one core, bulk work
  its pool's threads and the socket's DRAM by its bytes (or in proportion to its threads).

Every other op (GPU kernels, collectives, ranks not simulated) draws on nothing shared.
"""

from __future__ import annotations

from dataclasses import dataclass

from sosim.engine.plan import Category, Op, Plan, Resource, ResourceKind
from sosim.hardware.machine import Machine, SharedId, cores_id, dram_id, nvme_id

# One op's demand: (index of a shared resource, its draw per second at full speed), in the order the engine reads.
Demand = tuple[tuple[int, float], ...]

_COPY = {ResourceKind.H2D: "h2d", ResourceKind.D2H: "d2h"}
_CPU = frozenset({ResourceKind.CPU_OPT, ResourceKind.CPU_MAIN})
# CPU ops that are the host thread's own single-threaded work (hooks, bookkeeping, host syncs).
_HOST_THREAD = frozenset({Category.FRAMEWORK, Category.HOOK, Category.SYNC})
# A copy moving its bytes at less than this fraction of the link's pinned rate is staged by the CPU.
STAGED_FRACTION = 0.5
_NVME = {ResourceKind.NVME_READ: nvme_id(write=False), ResourceKind.NVME_WRITE: nvme_id(write=True)}
NVME_KINDS = frozenset(_NVME)


@dataclass(frozen=True)
class Site:
    """What every rule reads: the machine, the position of each shared resource in the contention handed to
    the engine, the link's pinned rates, the sockets' DRAM bandwidth, and a rank's CPU pools."""

    m: Machine
    index: dict[SharedId, int]
    rate_Bps: dict[str, float]  # "h2d", "d2h": the link's pinned rate in that direction
    dram_Bps: float  # a socket's DRAM bandwidth (0: not modelled)
    threads: float  # a rank's CPU threads
    # Threads of each CPU pool: the optimizer worker's and the training process's split the rank's threads when
    # the plan gives the worker a share of them (Plan.optimizer_core_share); otherwise each takes turns on all.
    split: dict[ResourceKind, float]
    saturation: float  # threads at which a memory-bound kernel reaches the socket's DRAM bandwidth
    borrow: bool  # an optimizer on another socket (cluster.optimizer_socket)

    @staticmethod
    def of(m: Machine, plan: Plan, index: dict[SharedId, int]) -> Site:
        hw = m.profile
        node = hw.node
        fraction = plan.optimizer_core_share
        threads = float(m.threads_per_rank)
        split = {ResourceKind.CPU_OPT: max(1.0, threads * fraction),
                 ResourceKind.CPU_MAIN: max(1.0, threads * (1 - fraction))} \
            if fraction < 1 else {ResourceKind.CPU_OPT: threads, ResourceKind.CPU_MAIN: threads}
        return Site(m, index, {"h2d": hw.link.h2d_GBps * 1e9, "d2h": hw.link.d2h_GBps * 1e9},
                    node.dram_GBps * 1e9 if node is not None and node.dram_GBps is not None else 0.0,
                    threads, split, float(hw.cpu.adam_saturation_cores), m.borrows_sockets)

    def cores_of(self, socket: int) -> SharedId:
        """One node-wide pool of cores unless a neighbour's cores are borrowed (then one pool per socket)."""
        return cores_id(socket if self.borrow else None)

    def socket_of(self, rank: int) -> int:
        """The socket of the rank's GPU (a legacy profile: one socket per rank)."""
        return self.m.rank_socket[rank] if not self.m.legacy else rank


class Rule:
    """The demand of one kind of op: :meth:`demand` of an op that runs ``duration`` seconds alone (> 0), or None
    when it draws on nothing shared."""

    def __init__(self, site: Site) -> None:
        self.site = site

    def demand(self, op: Op, duration: float) -> Demand | None:
        raise NotImplementedError


class CopyRule(Rule):
    """A host<->device copy: its bytes per second on its route (the GPU's link direction and the link's total,
    the PCIe uplink behind it, the socket link to a borrowed socket's memory, the socket's DRAM)."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        # By the resource object's identity: route indices, cores, staging DRAM, pinned rate, staging threshold.
        self._static: dict[int, tuple[list[int], int | None, int | None, float, float]] = {}
        # Demands already worked out, by (resource identity, bytes, duration): all a copy's demand reads, and
        # every layer's copies of one size ask the same (resources live as long as the plan this rule serves).
        self._seen: dict[tuple[int, float, float], Demand] = {}

    def _prepare(self, resource: Resource) -> tuple[list[int], int | None, int | None, float, float]:
        site, m, rank = self.site, self.site.m, resource.instance
        direction = _COPY[resource.kind]
        # The rank's host buffers live with its optimizer state: on a borrowed socket the copy also crosses the
        # socket link and draws on that socket's DRAM.
        host = m.opt_socket(rank) if site.borrow else None
        route = m.route(rank, "host", "hbm", host) if direction == "h2d" else m.route(rank, "hbm", "host", host)
        own = site.socket_of(rank)
        staged_socket = m.opt_socket(rank) if site.borrow else own
        index = site.index
        return ([index[r] for r in route if r in index], index.get(site.cores_of(own)),
                index.get(dram_id(staged_socket)), site.rate_Bps[direction], STAGED_FRACTION * site.rate_Bps[direction])

    def demand(self, op: Op, duration: float) -> Demand | None:
        key = (id(op.resource), op.n_bytes, duration)
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = self._demand(op, duration)
        return seen

    def _demand(self, op: Op, duration: float) -> Demand:
        static = self._static.get(id(op.resource))
        if static is None:
            static = self._static[id(op.resource)] = self._prepare(op.resource)
        route_ks, cores_k, dram_k, full_Bps, staged_below_Bps = static
        # Its average rate over its whole duration (latency included): the rate the engine scales, so a copy's
        # time under a fair share is its bytes over that share whatever its nominal speed.
        bps = op.n_bytes / duration if op.n_bytes > 0 else full_Bps
        if bps >= staged_below_Bps:
            return tuple([(k, bps) for k in route_ks])
        # Far below the link's pinned rate: a copy the CPU stages (pageable memory through a bounce buffer,
        # DeepSpeed's cast-and-copy refresh with its page faults). Its speed is the CPU's: it takes the rank's
        # threads, and its bytes cross the socket's memory three times (read the source, write the staging
        # buffer, the DMA's read).
        demand = [(k, bps) for k in route_ks]
        if cores_k is not None:
            demand.append((cores_k, self.site.threads))
        return tuple((res, 3.0 * d) if res == dram_k else (res, d) for res, d in demand)


class NvmeRule(Rule):
    """A read from or a write to the node's NVMe volume: the volume in that direction and the pinned host buffer
    it fills or drains (the socket's DRAM)."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self._static: dict[tuple[ResourceKind, int], list[int]] = {}

    def demand(self, op: Op, duration: float) -> Demand | None:
        bps = op.n_bytes / duration if op.n_bytes > 0 else 0.0
        if bps <= 0:
            return None
        kind, rank = op.resource.kind, op.resource.instance
        ks = self._static.get((kind, rank))
        if ks is None:
            index = self.site.index
            ks = self._static[(kind, rank)] = [index[r] for r in (_NVME[kind], dram_id(self.site.socket_of(rank)))
                                               if r in index]
        return tuple((k, bps) for k in ks)


class CpuRule(Rule):
    """CPU work of a rank: the training process's host thread one core of its pool; its bulk work and the
    optimizer's their pool's threads, and the socket's DRAM by the op's bytes per second (CPU Adam moves 28
    B/param), else a memory-bound kernel's share of the socket by its threads. With a borrowed socket the
    optimizer's work draws on that socket's cores and DRAM."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self._host: dict[int, Demand | None] = {}
        self._bulk: dict[tuple[ResourceKind, int, bool], tuple[float, tuple[int, float] | None, int | None]] = {}

    def draws(self, resource: Resource) -> bool:
        """Whether this CPU's work can draw on anything shared (its socket's cores or DRAM)."""
        site = self.site
        if site.borrow:
            return True
        own = site.socket_of(resource.instance)
        return site.cores_of(own) in site.index or (site.dram_Bps > 0 and dram_id(own) in site.index)

    def _host_thread(self, rank: int) -> Demand | None:
        site = self.site
        cores = site.cores_of(site.socket_of(rank))
        return ((site.index[cores], 1.0),) if cores in site.index else None

    def _pool(self, kind: ResourceKind, rank: int, borrowed: bool) -> tuple[float, tuple[int, float] | None,
                                                                            int | None]:
        site, index = self.site, self.site.index
        t = site.split[kind]
        # CPU Adam on a borrowed socket: its cores and the DRAM holding the optimizer state.
        socket = site.m.opt_socket(rank) if borrowed else site.socket_of(rank)
        cores = (index[site.cores_of(socket)], t) if site.cores_of(socket) in index else None
        dram = index[dram_id(socket)] if site.dram_Bps > 0 and dram_id(socket) in index else None
        return t, cores, dram

    def demand(self, op: Op, duration: float) -> Demand | None:
        kind, rank = op.resource.kind, op.resource.instance
        if op.category in _HOST_THREAD:
            # The training process's host thread itself (framework hooks, step()'s bookkeeping, waits): one core
            # of Python, not a memory-bound kernel.
            if rank not in self._host:
                self._host[rank] = self._host_thread(rank)
            return self._host[rank]
        borrowed = self.site.borrow and (kind == ResourceKind.CPU_OPT or op.category == Category.OPTIMIZER)
        pool = self._bulk.get((kind, rank, borrowed))
        if pool is None:
            pool = self._bulk[(kind, rank, borrowed)] = self._pool(kind, rank, borrowed)
        t, cores, dram = pool
        if dram is None:
            return (cores,) if cores is not None else None
        bps = op.n_bytes / duration if op.n_bytes > 0 else self.site.dram_Bps * min(1.0, t / self.site.saturation)
        return ((dram, bps), cores) if cores is not None else ((dram, bps),)


class Rules:
    """The rule of each resource an op runs on (None: it draws on nothing shared), one instance per kind."""

    def __init__(self, site: Site, simulated_ranks: int) -> None:
        self.simulated_ranks = simulated_ranks
        self.copy, self.nvme, self.cpu = CopyRule(site), NvmeRule(site), CpuRule(site)

    def of(self, resource: Resource) -> Rule | None:
        kind = resource.kind
        if resource.instance >= self.simulated_ranks:
            return None
        if kind in _COPY:
            return self.copy
        if kind in _NVME:
            return self.nvme
        if kind in _CPU:
            # CPU work draws on its socket's cores and DRAM: when the machine shares neither, nothing.
            return self.cpu if self.cpu.draws(resource) else None
        return None
