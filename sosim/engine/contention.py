"""Contention as a model handed to the engine: from one rank's plan and the machine, the node's plan (one
copy per rank that shares a host) and which ops draw on which shared resource.

What each kind of op draws on, per second at full speed:

* a host<->device copy of rank r: its bytes per second on every resource of its route (the GPU's own link
  direction and the link's bidirectional total, the PCIe uplink it sits behind, the cross-socket link when
  the memory is on another socket, the socket's DRAM);
* CPU work of rank r (the optimizer worker and the training process's casts and passes): its threads from the
  node's core pool, and the socket's DRAM bandwidth in proportion to its threads (memory-bound kernels reach
  the socket's bandwidth at ``adam_saturation_cores`` threads);
* with ``cluster.optimizer_socket`` borrowing another socket, the rank's optimizer work draws on that
  socket's cores and DRAM (cores then form one pool per socket) and its copies go to that socket's memory,
  across the socket link;
* GPU kernels and collectives draw on nothing shared (a collective's NIC share is inside its duration, see
  :mod:`sosim.costs.collectives`).

Ranks that behave alike are simulated once: when no shared resource is reachable by two ranks (a GH200
node: each Superchip has its own Grace, C2C and NIC), one rank stands for all; otherwise every rank of one
node is simulated and its collectives wait for all of them (a collective starts when the last rank is there).
"""

from __future__ import annotations

from sosim.engine.fluid import Contention, RepeatedUses
from sosim.engine.plan import Category, Op, Plan, Resource, ResourceKind
from sosim.hardware.machine import Machine, SharedId, SharedResource, cores_id, dram_id, nvme_id

_COPY = {ResourceKind.H2D: "h2d", ResourceKind.D2H: "d2h"}
_CPU = frozenset({ResourceKind.CPU_OPT, ResourceKind.CPU_MAIN})
# CPU ops that are the host thread's own single-threaded work (hooks, bookkeeping, host syncs).
_HOST_THREAD = frozenset({Category.FRAMEWORK, Category.HOOK, Category.SYNC})
_COLLECTIVE = frozenset({ResourceKind.NET})
# A copy moving its bytes at less than this fraction of the link's pinned rate is staged by the CPU.
STAGED_FRACTION = 0.5
_NVME = {ResourceKind.NVME_READ: nvme_id(write=False), ResourceKind.NVME_WRITE: nvme_id(write=True)}


def rank_resource(resource: Resource, rank: int) -> Resource:
    """The same resource on another local rank (a resource's instance is its rank)."""
    return resource if rank == 0 else Resource(resource.kind, rank)


def ranks_share_host(m: Machine, uses_nvme: bool = False) -> bool:
    """Whether two simulated ranks can draw on one shared resource (then each must be simulated)."""
    if m.legacy or m.local_ranks <= 1:
        return False
    node = m.profile.node
    assert node is not None
    if node.dram_GBps is not None and len(set(m.rank_socket)) < m.local_ranks:
        return True
    if m.borrows_sockets:
        # A socket one rank's GPU sits on and another rank's optimizer borrows (or two ranks borrow).
        touched = [{m.rank_socket[r], m.opt_socket(r)} for r in range(m.local_ranks)]
        if any(touched[a] & touched[b] for a in range(m.local_ranks) for b in range(a)):
            return True
    ups = [u for u in m.rank_uplink if u >= 0]
    if len(ups) != len(set(ups)):
        return True
    if node.nvme is not None and uses_nvme:
        return True
    return m.threads_per_rank * m.local_ranks > m.cores_per_socket * m.sockets  # oversubscribed cores


def symmetric_shares(m: Machine) -> dict[SharedId, int] | None:
    """How many ranks draw on each shared resource, when the node's ranks are interchangeable; else None.

    Interchangeable: every rank runs the same plan, and each kind of shared resource (a link part, an
    uplink part, a socket's DRAM, the NVMe volume, the core pool) splits the ranks into blocks of one size
    (the ranks that reach one instance), of one capacity, and the blocks of all kinds nest (an uplink's
    ranks inside one socket's, a socket's inside the node's). Then some permutation of the ranks that keeps
    every resource maps any rank to any other, so all ranks start and end every op together, and on a
    resource that ``n`` ranks reach each gets the same share of every fill: rank 0 alone with ``1 / n`` of
    the capacity runs the same timeline (progressive filling scales exactly: the fill level of ``n`` equal
    users of ``C`` is that of one user of ``C / n``), up to the rounding of the summed shares
    (tests/test_multigpu.py compares it with every rank simulated)."""
    if m.legacy or m.borrows_sockets or m.local_ranks <= 1:
        return None
    capacity = {r.id: r.capacity for r in m.shared_resources()}
    reach: dict[SharedId, set[int]] = {}
    for rank in range(m.local_ranks):
        for rid in _reachable(m, rank):
            reach.setdefault(rid, set()).add(rank)
    by_kind: dict[tuple[str, str], list[SharedId]] = {}
    for rid in reach:
        by_kind.setdefault((rid.kind, rid.part), []).append(rid)
    blocks: list[frozenset[int]] = []
    for ids in by_kind.values():
        kind_blocks = [frozenset(reach[i]) for i in ids]
        covered = sorted(r for b in kind_blocks for r in b)
        if covered != list(range(m.local_ranks)) or len({len(b) for b in kind_blocks}) != 1 \
                or len({capacity[i] for i in ids}) != 1:
            return None  # not a partition into equal blocks of equal capacity
        blocks += kind_blocks
    if any(a & b and not (a <= b or b <= a) for a in blocks for b in blocks):
        return None  # blocks that overlap without nesting
    return {rid: len(ranks) for rid, ranks in reach.items()}


def _reachable(m: Machine, rank: int) -> set[SharedId]:
    """The shared resources that ``rank``'s ops can draw on in :func:`contention_for` (sockets not borrowed)."""
    out = {*m.route(rank, "host", "hbm"), *m.route(rank, "hbm", "host"), cores_id(None)}
    node = m.profile.node
    if node is not None and node.nvme is not None:
        out |= {*m.route(rank, "host", "nvme"), *m.route(rank, "nvme", "host")}
    if node is not None and node.dram_GBps is not None:
        out.add(dram_id(m.rank_socket[rank]))
    return {r for r in out if r in {s.id for s in m.shared_resources()}}


def expand_ranks(plan: Plan, ranks: int) -> Plan:
    """The node's plan: ``ranks`` copies of one rank's plan, each on its own resources.

    Op ``i`` of rank ``r`` gets id ``i * ranks + r`` (so every dependency still points to a smaller id); rank
    0's ops are ``plan``'s ops at ids multiplied by ``ranks``. A collective of rank r additionally waits for
    what the same collective waits for on every other rank.
    """
    if ranks <= 1:
        return plan
    out = Plan()
    ops = out.ops
    # Each resource's copy on every rank, made once (not once per op).
    on_rank: dict[Resource, list[Resource]] = {}
    for op in plan.ops:
        shifted = [tuple([d * ranks + r for d in op.deps]) for r in range(ranks)]
        synced = tuple(sorted({d for deps in shifted for d in deps})) if op.resource.kind in _COLLECTIVE else None
        copies = on_rank.get(op.resource)
        if copies is None:
            copies = on_rank[op.resource] = [rank_resource(op.resource, r) for r in range(ranks)]
        for r in range(ranks):
            ops.append(Op(op.id * ranks + r, copies[r], op.name, op.duration_s,
                          synced if synced is not None else shifted[r], op.layer, op.iteration, op.category,
                          op.phase, op.n_bytes, op.flops, op.group))
    out.iteration_starts = [i * ranks for i in plan.iteration_starts]
    out.optimizer_core_share = plan.optimizer_core_share
    return out


def node_plan(m: Machine, plan: Plan) -> tuple[Plan, Contention, int]:
    """The plan the engine runs for one node, the contention it is handed, and how many ranks it holds
    (rank 0's op ``i`` is the node plan's op ``i * ranks``)."""
    # One rank on its own shares nothing: the scan of the plan for NVMe ops is only needed with several.
    several = not m.legacy and m.local_ranks > 1
    simulated = m.local_ranks if several and ranks_share_host(
        m, any(op.resource.kind in _NVME for op in plan.ops)) else 1
    shares = symmetric_shares(m) if simulated > 1 else None
    if shares is None:
        node = expand_ranks(plan, simulated)
        return node, contention_for(m, node, simulated), simulated
    # Interchangeable ranks: rank 0 alone, with its share of every resource (demands fitted to the whole
    # capacity first: an op alone on the machine may use all of it, it never is alone here).
    own = contention_for(m, plan, 1)
    ids = [r.id for r in m.shared_resources()]
    capacity = tuple(c / shares.get(rid, 1) for c, rid in zip(own.capacity, ids, strict=True))
    # Time lost on rank 0's resource is lost alike on every instance of its kind (the other ranks' copies).
    same_kind = {k: tuple(j for j, other in enumerate(ids) if (other.kind, other.part) == (rid.kind, rid.part)
                          and other in shares) for k, rid in enumerate(ids) if rid in shares}
    return plan, Contention(own.names, capacity, own.uses, m.local_ranks, same_kind), 1


_SKIP, _BRANCH_COPY, _BRANCH_NVME, _BRANCH_CPU = range(4)


def _branch(resource: Resource, simulated_ranks: int) -> int:
    kind = resource.kind
    if resource.instance >= simulated_ranks:
        return _SKIP
    if kind in _COPY:
        return _BRANCH_COPY
    if kind in _NVME:
        return _BRANCH_NVME
    if kind in _CPU:
        return _BRANCH_CPU
    return _SKIP


def _only_links_that_cannot_contend(shared: list[SharedResource]) -> bool:
    """Whether every shared resource is a rank's own link and each link's two directions at full rate fit
    its bidirectional total (the GH200's C2C: 450 + 450 = 900 GB/s).

    Then nothing can ever be oversubscribed: a link's direction is drawn on by that rank's one queue of
    copies in that direction, one copy at a time, whose demand the scaling in :func:`contention_for` caps at
    the direction's rate; the worst case of both directions together fits the total. So
    :func:`sosim.engine.fluid.effective_contention` would drop every resource, and the per-op demands need not be
    built (a search simulates such plans thousands of times)."""
    caps: dict[int, dict[str, float]] = {}
    for r in shared:
        if r.kind != "link":
            return False
        caps.setdefault(r.id.index, {})[r.id.part] = r.capacity
    return all(c["h2d"] + c["d2h"] <= c["bidir"] for c in caps.values())


def contention_for(m: Machine, plan: Plan, simulated_ranks: int) -> Contention:
    shared = m.shared_resources()
    if _only_links_that_cannot_contend(shared):
        return Contention(tuple(r.name for r in shared), tuple(r.capacity for r in shared), {})
    index = {s.id: k for k, s in enumerate(shared)}
    hw = m.profile
    link = hw.link
    rate = {"h2d": link.h2d_GBps * 1e9, "d2h": link.d2h_GBps * 1e9}
    node = hw.node
    dram_Bps = node.dram_GBps * 1e9 if node is not None and node.dram_GBps is not None else 0.0
    fraction = plan.optimizer_core_share
    threads = float(m.threads_per_rank)
    # The optimizer worker's threads and the training process's (they split the rank's threads when the
    # worker is given a fraction of them; otherwise they take turns on all of them).
    split = {ResourceKind.CPU_OPT: max(1.0, threads * fraction),
             ResourceKind.CPU_MAIN: max(1.0, threads * (1 - fraction))} \
        if fraction < 1 else {ResourceKind.CPU_OPT: threads, ResourceKind.CPU_MAIN: threads}
    saturation = float(hw.cpu.adam_saturation_cores)
    borrow = m.borrows_sockets

    def cores_of(socket: int) -> SharedId:
        # One node-wide pool unless a neighbour's cores are borrowed (then one pool per socket).
        return cores_id(socket if borrow else None)
    uses: dict[int, tuple[tuple[int, float], ...]] = {}
    # What an op draws on depends on its kind, rank and (for CPU work) category, and only its rate on the op
    # itself: the routes and resource indices are worked out once per (kind, rank) below, not per op (this
    # loop runs over every op of every simulation of a search). Same demands, same order, as written out.
    # By the resource object's identity (see branch_of).
    copy_static: dict[int, tuple[list[int], int | None, int | None, float, float]] = {}
    nvme_static: dict[tuple[ResourceKind, int], list[int]] = {}
    host_static: dict[int, tuple[tuple[int, float], ...] | None] = {}
    cpu_static: dict[tuple[ResourceKind, int, bool], tuple[float, tuple[int, float] | None, int | None]] = {}
    # Which branch below an op's resource takes, by the resource object's identity (resources are shared
    # objects: the lookup is one dict read, where the kind tests hash an enum): _SKIP for resources that draw
    # on nothing shared (GPU streams, collectives, ranks not simulated).
    branch_of: dict[int, int] = {}
    # A repeated plan's copies draw what its one-iteration template draws: the demands are built for the
    # template's ops only (sosim.engine.fluid.RepeatedUses reads them for every copy).
    template = plan.template_if_current()
    for op in plan.ops if template is None else template.ops:
        duration = op.duration_s
        if duration <= 0:
            continue
        resource = op.resource
        branch = branch_of.get(id(resource))
        if branch is None:
            branch = _branch(resource, simulated_ranks)
            if branch == _BRANCH_CPU and not borrow:
                # CPU work draws on its socket's cores and DRAM: when the machine shares neither, nothing.
                own = m.rank_socket[resource.instance] if not m.legacy else resource.instance
                if cores_of(own) not in index and not (dram_Bps > 0 and dram_id(own) in index):
                    branch = _SKIP
            branch_of[id(resource)] = branch
        if branch == _SKIP:
            continue
        kind, rank = resource.kind, resource.instance
        if branch == _BRANCH_COPY:
            cs = copy_static.get(id(resource))
            if cs is None:
                direction = _COPY[kind]
                # The rank's host buffers live with its optimizer state: on a borrowed socket the copy also
                # crosses the socket link and draws on that socket's DRAM.
                host = m.opt_socket(rank) if borrow else None
                route = m.route(rank, "host", "hbm", host) if direction == "h2d" else m.route(rank, "hbm", "host",
                                                                                                 host)
                own = m.rank_socket[rank] if not m.legacy else rank
                staged_socket = m.opt_socket(rank) if borrow else own
                cs = ([index[r] for r in route if r in index], index.get(cores_of(own)),
                      index.get(dram_id(staged_socket)), rate[direction], STAGED_FRACTION * rate[direction])
                copy_static[id(resource)] = cs
            route_ks, cores_k, dram_k, full_Bps, staged_below_Bps = cs
            # Its average rate over its whole duration (latency included): the rate the engine scales, so
            # a copy's time under a fair share is its bytes over that share whatever its nominal speed.
            n_bytes = op.n_bytes
            bps = n_bytes / duration if n_bytes > 0 else full_Bps
            if bps < staged_below_Bps:
                # Far below the link's pinned rate: a copy the CPU stages (pageable memory through a bounce
                # buffer, DeepSpeed's cast-and-copy refresh with its page faults). Its speed is the CPU's: it
                # takes the rank's threads, and its bytes cross the socket's memory three times (read the
                # source, write the staging buffer, the DMA's read).
                demand = [(k, bps) for k in route_ks]
                if cores_k is not None:
                    demand.append((cores_k, threads))
                for j, (res, d) in enumerate(demand):
                    if res == dram_k:
                        demand[j] = (res, 3.0 * d)
                uses[op.id] = tuple(demand)
            else:
                uses[op.id] = tuple([(k, bps) for k in route_ks])
        elif branch == _BRANCH_NVME:
            # The node's volume in that direction, and the pinned host buffer it fills or drains.
            bps = op.n_bytes / duration if op.n_bytes > 0 else 0.0
            if bps > 0:
                nvme_ks = nvme_static.get((kind, rank))
                if nvme_ks is None:
                    socket = m.rank_socket[rank] if not m.legacy else rank
                    nvme_ks = [index[r] for r in (_NVME[kind], dram_id(socket)) if r in index]
                    nvme_static[(kind, rank)] = nvme_ks
                uses[op.id] = tuple((k, bps) for k in nvme_ks)
        elif op.category in _HOST_THREAD:  # CPU work
            # The training process's host thread itself (framework hooks, step()'s bookkeeping, waits): one
            # core of Python, not a memory-bound kernel.
            if rank not in host_static:
                own = m.rank_socket[rank] if not m.legacy else rank
                host_static[rank] = ((index[cores_of(own)], 1.0),) if cores_of(own) in index else None
            hs = host_static[rank]
            if hs is not None:
                uses[op.id] = hs
        else:  # CPU work
            borrowed = borrow and (kind == ResourceKind.CPU_OPT or op.category == Category.OPTIMIZER)
            cpu = cpu_static.get((kind, rank, borrowed))
            if cpu is None:
                t = split[kind]
                # CPU Adam on a borrowed socket: its cores and the DRAM holding the optimizer state.
                socket = m.opt_socket(rank) if borrowed else (m.rank_socket[rank] if not m.legacy else rank)
                cores = (index[cores_of(socket)], t) if cores_of(socket) in index else None
                dram = index[dram_id(socket)] if dram_Bps > 0 and dram_id(socket) in index else None
                cpu = (t, cores, dram)
                cpu_static[(kind, rank, borrowed)] = cpu
            t, cores, dram = cpu
            if dram is not None:
                # Its memory traffic per second: the op's bytes over its duration when the plan says (CPU Adam
                # moves 28 B/param), else a memory-bound kernel's share of the socket by its threads.
                bps = op.n_bytes / duration if op.n_bytes > 0 else dram_Bps * min(1.0, t / saturation)
                uses[op.id] = ((dram, bps), cores) if cores is not None else ((dram, bps),)
            elif cores is not None:
                uses[op.id] = (cores,)
    capacity = tuple(s.capacity for s in shared)
    # An op alone runs at its planned duration (the cost model's, measured or analytic): where its estimated
    # demand exceeds a capacity on its own (a measured copy slightly faster than the profile's nominal rate, or
    # a what-if direction above the link's bidirectional total), its demands are scaled down to fit.
    # The socket link is left out: a copy to a borrowed socket's memory is planned at its GPU link's rate and
    # must be slowed to the socket link's, which is what the engine does with an over-capacity demand.
    bridge = {k for k, s in enumerate(shared) if s.kind == "socket_link"}
    for op_id, ks in uses.items():
        # min(1.0, capacity / d...) is below 1 exactly when some d exceeds its capacity (for doubles c < d
        # rounds c / d below 1): the common case skips the division.
        for k, d in ks:
            if d > capacity[k] and k not in bridge:
                break
        else:
            continue
        scale = min(1.0, *(capacity[k] / d for k, d in ks if d > 0 and k not in bridge))
        if scale < 1.0:
            uses[op_id] = tuple((k, d * scale) for k, d in ks)
    names = tuple(s.name for s in shared)
    if template is not None:
        return Contention(names, capacity, RepeatedUses(uses, len(template.ops), plan.copies))
    return Contention(names, capacity, uses)
