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

Each kind's demand is a rule (:mod:`sosim.engine.rules`); :func:`contention_for` is the one loop over the ops.

Ranks that behave alike are simulated once: when no shared resource is reachable by two ranks (a GH200
node: each Superchip has its own Grace, C2C and NIC), one rank stands for all; otherwise every rank of one
node is simulated and its collectives wait for all of them (a collective starts when the last rank is there).
"""

from __future__ import annotations

from sosim.engine.fluid import Contention, RepeatedUses
from sosim.engine.plan import Op, Plan, Resource, ResourceKind
from sosim.engine.rules import NVME_KINDS, Demand, Rule, Rules, Site
from sosim.hardware.machine import Machine, SharedId, SharedResource, cores_id, dram_id

_COLLECTIVE = frozenset({ResourceKind.NET})


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
        m, any(op.resource.kind in NVME_KINDS for op in plan.ops)) else 1
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
    """The machine's shared resources and what each op of ``plan`` (its first ``simulated_ranks`` ranks) draws on
    them: each op's demand is its kind's rule's (sosim/engine/rules.py); the loop is this one."""
    shared = m.shared_resources()
    if _only_links_that_cannot_contend(shared):
        return Contention(tuple(r.name for r in shared), tuple(r.capacity for r in shared), {})
    rules = Rules(Site.of(m, plan, {s.id: k for k, s in enumerate(shared)}), simulated_ranks)
    # The rule of each resource, by the resource object's identity (resources are shared objects: the lookup is
    # one dict read per op, where the kind tests hash an enum); None: it draws on nothing shared.
    rule_of: dict[int, Rule | None] = {}
    uses: dict[int, Demand] = {}
    # A repeated plan's copies draw what its one-iteration template draws: the demands are built for the
    # template's ops only (sosim.engine.fluid.RepeatedUses reads them for every copy).
    template = plan.template_if_current()
    for op in plan.ops if template is None else template.ops:
        duration = op.duration_s
        if duration <= 0:
            continue
        key = id(op.resource)
        if key in rule_of:
            rule = rule_of[key]
        else:
            rule = rule_of[key] = rules.of(op.resource)
        if rule is not None:
            demand = rule.demand(op, duration)
            if demand is not None:
                uses[op.id] = demand
    capacity = tuple(s.capacity for s in shared)
    _fit_alone(uses, capacity, {k for k, s in enumerate(shared) if s.kind == "socket_link"})
    names = tuple(s.name for s in shared)
    if template is not None:
        return Contention(names, capacity, RepeatedUses(uses, len(template.ops), plan.copies))
    return Contention(names, capacity, uses)


def _fit_alone(uses: dict[int, Demand], capacity: tuple[float, ...], bridge: set[int]) -> None:
    """An op alone runs at its planned duration (the cost model's, measured or analytic): where its estimated
    demand exceeds a capacity on its own (a measured copy slightly faster than the profile's nominal rate, or a
    what-if direction above the link's bidirectional total), its demands are scaled down to fit. The socket
    link (``bridge``) is left out: a copy to a borrowed socket's memory is planned at its GPU link's rate and
    must be slowed to the socket link's, which is what the engine does with an over-capacity demand."""
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
