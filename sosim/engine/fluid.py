"""The shared-resource (fluid) model both engines run: contention as data, progressive filling, stretch.

*Shared* resources (a link direction and its bidirectional total, a PCIe uplink, a socket's DRAM bandwidth,
a NIC, an NVMe volume) are not walked by anyone: they are capacities that the ops running at the same time
draw on. A :class:`Contention` says which ops draw on which shared resource and how much per second at full
speed. While ops compete, each runs at a *rate* r <= 1 of its full speed, chosen by progressive filling
(max-min fairness): every op's throughput, in the unit of its first listed resource (bytes/s, or threads),
rises together with the others'; an op reaching full speed stops there; the first resource to fill freezes
its remaining users at an equal share; the rest continue. Every user of a saturated resource that could use
more gets the same bytes per second, as the round-robin arbitration of a DMA engine, a PCIe switch or a
memory controller gives it. Rates are recomputed whenever an op starts or ends, so an op's duration depends
on what overlaps it, not on a factor fixed up front. An op's time beyond its full-speed duration is
attributed to the resource that limited it (:attr:`EngineRun.stretch_s`).

A shared resource that can never be oversubscribed (the largest demand of each serial resource that uses
it, summed, fits its capacity) is dropped before the run (:func:`effective_contention`), and ops left with
no contended resource take the plain path: without contention the result is bit for bit
:func:`sosim.engine.plan.list_schedule`.

:class:`Fluid` runs on any event clock with SimPy's interface (``now``, ``timeout(delay)``, ``event()``, an
event's ``callbacks`` and ``succeed()``): the SimPy engine (:mod:`sosim.engine.simpy_engine`) hands it a
``simpy.Environment``, the fast engine (:mod:`sosim.engine.fast`) its own loop ordered like SimPy's. Both
engines import it from here; neither imports the other.

Why this module is over 500 lines: the contention data (:class:`Contention`, its repeated-plan uses) and the
progressive-filling loop that reads it are one model with one set of invariants, and both engines must run
exactly this code (the SimPy property test holds them equal); the part that could move out next is
:func:`effective_contention` and its never-oversubscribed check, which only prepares a plan before a run.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sosim.engine.plan import Plan

# Two finish times closer than this (relative) complete together (float noise of repeated rate changes).
REL_EPS = 1e-12


class ClockEvent(Protocol):
    """What the fluid model needs of an event: callbacks run when it is processed, and a trigger."""

    @property
    def callbacks(self) -> list[Callable[..., None]] | None: ...

    def succeed(self) -> object: ...


class Clock(Protocol):
    """What the fluid model needs of an event loop (``simpy.Environment`` has it)."""

    @property
    def now(self) -> float: ...

    def timeout(self, delay: float) -> ClockEvent: ...

    def event(self) -> ClockEvent: ...


UsesOf = tuple[tuple[int, float], ...]


class RepeatedUses(Mapping[int, UsesOf]):
    """What the ops of a repeated plan (:meth:`sosim.engine.plan.Plan.repeat`) draw on, built from its template:
    op ``k * period + i`` draws what template op ``i`` does (an op's demands depend on its resource,
    duration, bytes and category, which every copy shares). The demands are worked out once per template,
    not once per copy; this is the plain mapping by global op id (what the SimPy engine reads), answered from
    the template on each lookup rather than stored per copy, and :attr:`template` is what the fast engine and
    :func:`effective_contention` read."""

    __slots__ = ("copies", "period", "template")

    def __init__(self, template: dict[int, UsesOf], period: int, copies: int) -> None:
        self.template = template
        self.period = period
        self.copies = copies

    def __getitem__(self, op_id: int) -> UsesOf:
        k, i = divmod(op_id, self.period)
        if not 0 <= k < self.copies:
            raise KeyError(op_id)
        return self.template[i]

    def __contains__(self, op_id: object) -> bool:
        if not isinstance(op_id, int):
            return False
        k, i = divmod(op_id, self.period)
        return 0 <= k < self.copies and i in self.template

    def __iter__(self) -> Iterator[int]:
        # Copy by copy, each in the template's order (the order a dict built copy by copy would have).
        for k in range(self.copies):
            base = k * self.period
            for i in self.template:
                yield base + i

    def __len__(self) -> int:
        return len(self.template) * self.copies

    def __repr__(self) -> str:
        return f"RepeatedUses({self.copies} copies of {len(self.template)} of {self.period} template ops)"


@dataclass(frozen=True)
class Contention:
    """Shared resources and the ops that draw on them.

    ``capacity[k]`` is resource k's capacity in its own unit per second (bytes/s for links and memory, cores
    for a core pool). ``uses[op_id]`` lists ``(k, demand)``: what the op draws from k per second when it runs
    at full speed (its duration in the plan). An op alone never exceeds a capacity by construction of the
    plan's durations; if it would, it is slowed to fit.
    """

    names: tuple[str, ...]
    capacity: tuple[float, ...]
    uses: Mapping[int, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    # Ranks each op stands for (interchangeable ranks simulated as one, sosim.engine.contention.symmetric_shares):
    # the time lost to contention is that of all of them, reported on every instance of the resource that
    # limited it (``report_as[k]``: the other sockets' DRAM for rank 0's, ...), in equal parts.
    stands_for: int = 1
    report_as: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.capacity):
            raise ValueError("Contention: one capacity per resource name")
        for k, cap in enumerate(self.capacity):
            if not cap > 0 or math.isinf(cap):
                raise ValueError(f"Contention: capacity of {self.names[k]} must be positive and finite, got {cap}")
        uses = self.uses.template if isinstance(self.uses, RepeatedUses) else self.uses
        n = len(self.names)
        # Each demand tuple once (ops of one size on one resource share theirs): the first op holding a bad one
        # is still the one named.
        checked: set[int] = set()
        for op_id, ks in uses.items():
            if id(ks) in checked:
                continue
            checked.add(id(ks))
            for k, demand in ks:
                if not 0 <= k < n or not demand >= 0:
                    raise ValueError(f"Contention: op {op_id} uses resource {k} with demand {demand}")


@dataclass(frozen=True)
class EngineRun:
    start_s: np.ndarray
    end_s: np.ndarray
    # Seconds by which contention lengthened ops, summed over ops, by the shared resource that limited them.
    stretch_s: dict[str, float]


def effective_contention(plan: Plan, contention: Contention | None) -> Contention | None:
    """``contention`` without the resources that can never be oversubscribed (None if nothing is left).

    Ops on one serial resource never overlap, so at most one op per serial resource draws on a shared
    resource at any time: if the largest demand of each serial resource, summed, fits the capacity, the
    resource never limits anyone.
    """
    if contention is None or not contention.uses:
        return None
    repeated = contention.uses if isinstance(contention.uses, RepeatedUses) else None
    all_uses: Mapping[int, UsesOf]
    if repeated is not None:
        # Every copy of the template draws what the template does: its worst demands are the run's.
        t = plan.template_if_current()
        if t is None or len(t.ops) != repeated.period:
            raise ValueError("Contention: repeated uses of another template than the plan's")
        ops, all_uses = t.ops, repeated.template
        n = repeated.period
    else:
        ops, all_uses = plan.ops, contention.uses
        n = len(ops)
    # The largest demand of each (shared resource, serial resource), in first-seen order. A serial resource
    # is keyed by its kind's identity and its instance (what Resource equality compares; kinds are enum
    # singletons): hashing a Resource runs Python code, hashing this tuple does not.
    worst: dict[tuple[int, int, int], float] = {}
    get = worst.get
    # Whether nothing would be dropped below even if every resource is contended: every op that draws lasts
    # and draws something on each resource it lists.
    clean = True
    # (demands, serial resource) pairs already taken in, by identity: ops of one size on one resource share
    # their demand tuple (sosim/engine/rules.py), and taking a pair in again changes no maximum and no order.
    seen: set[tuple[int, int]] = set()
    for op_id, ks in all_uses.items():
        if op_id >= n:
            raise ValueError(f"Contention: op {op_id} is not in the plan")
        op = ops[op_id]
        if not ks or not op.duration_s > 0:
            clean = False
        queue = op.resource
        pair = (id(ks), id(queue))
        if pair in seen:
            continue
        seen.add(pair)
        kind, instance = id(queue.kind), queue.instance
        for k, demand in ks:
            if not demand > 0:
                clean = False
            key = (k, kind, instance)
            # max(worst.get(key, 0.0), demand) without the call: the same value (demands are >= 0).
            w = get(key, 0.0)
            worst[key] = demand if demand > w else w
    # Summed per shared resource by sum() over the queues in first-seen order, as one dict per resource would.
    per_resource: dict[int, list[float]] = {}
    for (k, _kind, _instance), demand in worst.items():
        per_resource.setdefault(k, []).append(demand)
    capacity = contention.capacity
    contended = {k for k, demands in per_resource.items() if sum(demands) > capacity[k] * (1 + REL_EPS)}
    if not contended:
        return None
    if clean and len(contended) == len(per_resource):
        return contention  # every resource drawn on can be oversubscribed: nothing to drop
    uses: dict[int, UsesOf] = {}
    for op_id, ks in all_uses.items():
        kept = tuple((k, d) for k, d in ks if k in contended and d > 0)
        if kept and ops[op_id].duration_s > 0:
            uses[op_id] = kept
    if not uses:
        return None
    out: Mapping[int, UsesOf] = uses if repeated is None else RepeatedUses(uses, repeated.period, repeated.copies)
    # A subset of ``contention``'s demands, which its __post_init__ has checked: copied with the kept ones in
    # place of its own, without checking them again (a search builds this once per simulation).
    subset = copy.copy(contention)
    object.__setattr__(subset, "uses", out)
    return subset


# Stretch below this is float noise of repeated rate changes, not time lost to contention.
STRETCH_NOISE_S = 1e-12


def stretch_by_name(by_index: dict[int, float], active: Contention) -> dict[str, float]:
    """Time lost to each shared resource, by its name, over every rank the ops stand for (the one rule
    both engines report with)."""
    out: dict[str, float] = {}
    names = active.names
    for k, s in by_index.items():
        if s > STRETCH_NOISE_S:
            targets = active.report_as.get(k, (k,))
            part = s * active.stands_for / len(targets)
            for t in targets:
                out[names[t]] = out.get(names[t], 0.0) + part
    return out


# How far below its capacity every shared resource must stay for :func:`never_throttled` to vouch that
# progressive filling leaves every rate at 1 whatever the order of the jobs (it absorbs the rounding of sums).
FULL_SPEED_MARGIN = 1e-9


def never_throttled_fast(start: np.ndarray, finish: np.ndarray, demand: Mapping[int, tuple[np.ndarray, np.ndarray]],
                         worker: np.ndarray, capacity: Sequence[float]) -> bool:
    """:func:`never_throttled`'s conditions on arrays (one entry per job), with one causal order only: a
    serial resource's (``worker``'s) next job starting when its previous one ends does not overlap it (the
    worker's job ends before it starts the next). ``demand[k]``: the jobs drawing on shared resource ``k``
    and what they draw. False where it cannot vouch (:func:`never_throttled` may still)."""
    # Wake-ups land on finishes: t + (f - t) == f for every start or finish t inside a job's [start, finish].
    times = np.sort(np.concatenate([start, finish]))
    lo = np.searchsorted(times, start, "left")
    hi = np.searchsorted(times, finish, "right")
    counts = hi - lo
    job = np.repeat(np.arange(len(start)), counts)
    at = times[np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(lo, counts)]
    f = finish[job]
    if not np.array_equal(at + (f - at), f):
        return False
    # No finish within the wake-up tolerance after another (distinct) finish.
    ends = np.unique(finish)
    if np.any(ends[1:] <= ends[:-1] + REL_EPS * np.maximum(1.0, np.abs(ends[:-1]))):
        return False
    # Every resource below its capacity at every instant, intervals closed, a worker's hand-off counted once.
    for k, (jobs, d) in demand.items():
        w, s, e = worker[jobs], start[jobs], finish[jobs]
        order = np.lexsort((s, w))
        w, s, e, d = w[order], s[order], e[order], d[order]
        handoff = np.zeros(len(s), dtype=bool)
        handoff[1:] = (w[1:] == w[:-1]) & (s[1:] == e[:-1])
        step = np.zeros(len(s))
        step[1:] = d[1:] - d[:-1]
        up = np.where(handoff, np.maximum(step, 0.0), d)  # at a start
        down = -d  # at a finish
        down[:-1] = np.where(handoff[1:], np.minimum(step[1:], 0.0), down[:-1])
        phase = np.concatenate([np.zeros(len(s)), np.ones(len(s))])
        t = np.concatenate([s, e])
        delta = np.concatenate([up, down])
        if np.cumsum(delta[np.lexsort((phase, t))]).max() > capacity[k] * (1.0 - FULL_SPEED_MARGIN):
            return False
    return True


def never_throttled(jobs: Sequence[tuple[int, float, float, UsesOf]], capacity: Sequence[float],
                    follows: Callable[[int], tuple[int, ...]]) -> bool:
    """Whether :class:`FluidState` would run these jobs exactly as a plain timeline does: each job ``(op id,
    start, finish, uses)`` ending at its ``finish`` (its start plus its full-speed duration), no stretch.
    ``follows(op id)``: the op ids whose completion that job's start waits for (its dependencies and its
    resource's previous op): the fluid model hears of their end before it hears of this start.

    Sufficient conditions, checked in one sweep over the jobs' starts and finishes (intervals closed, so that
    a job ending when another starts counts as overlapping it, whichever the fluid model hears of first,
    unless the start follows that end):

    * every shared resource stays below ``(1 - FULL_SPEED_MARGIN)`` of its capacity, so every filling, in any
      order of the jobs, gives every job rate 1 and no finish is ever recomputed;
    * a wake-up scheduled at any reallocation time ``t`` (a start or a finish) lands on the running jobs'
      earliest finish ``f`` exactly: ``t + (f - t) == f`` for every job running at ``t``;
    * no job finishes within the wake-up tolerance after another running job's finish (it would end early,
      with it).

    Then each job ends at its finish and every other op where a plain list schedule puts it, whatever the
    order of events at equal times (the fast engine's shortcut; tests/test_engines.py holds it to SimPy)."""
    n = len(jobs)
    starts = [job[1] for job in jobs]
    finishes = [job[2] for job in jobs]
    # Starts before finishes at equal times (closed intervals): a merge of the two orders.
    by_start = sorted(range(n), key=starts.__getitem__)
    by_finish = sorted(range(n), key=finishes.__getitem__)
    limit = [c * (1.0 - FULL_SPEED_MARGIN) for c in capacity]
    load = [0.0] * len(capacity)
    running: dict[int, tuple[float, UsesOf]] = {}  # by op id: finish, uses
    a = 0
    for j in by_finish:
        end_t = finishes[j]
        while a < n and starts[by_start[a]] <= end_t:
            op_id, t, finish, uses = jobs[by_start[a]]
            a += 1
            for k, d in uses:
                load[k] += d
                if load[k] > limit[k] and load[k] - _ended_before(running, follows(op_id), t, k) > limit[k]:
                    return False
            running[op_id] = (finish, uses)
            for f, _u in running.values():
                if t + (f - t) != f:
                    return False
        op_id, _s, t, uses = jobs[j]
        tol = t + REL_EPS * max(1.0, abs(t))
        for f, _u in running.values():
            if f != t and (f <= tol or t + (f - t) != f):
                return False
        del running[op_id]
        for k, d in uses:
            load[k] -= d
    return True


def _ended_before(running: dict[int, tuple[float, UsesOf]], follows: tuple[int, ...], t: float, k: int) -> float:
    """What the running jobs that end at ``t`` and that a start at ``t`` follows draw on ``k``: the fluid model
    has let them go before that start."""
    out = 0.0
    for i in set(follows):  # once each (an op may be both a dependency and the resource's previous op)
        job = running.get(i)
        if job is not None and job[0] == t:
            out += sum(d for kk, d in job[1] if kk == k)
    return out


class Job:
    """An op drawing on shared resources: its rate, projected finish and limiting resource."""

    __slots__ = ("finish", "limit", "rate", "since", "uses")

    def __init__(self, finish: float, uses: tuple[tuple[int, float], ...], now: float) -> None:
        self.uses = uses
        self.rate = 1.0
        self.finish = finish  # absolute time at which it completes if its rate stays as it is
        self.limit = -1  # resource that holds its rate below 1 (-1: none)
        self.since = now  # when the current rate took effect (for the stretch attribution)


class FluidState:
    """Progressive filling over the jobs currently drawing on shared resources, without a clock.

    The caller tells it when a job starts (:meth:`add`) and when its wake-up is due (:meth:`due`); each
    returns the delay of the next wake-up (after the rates were recomputed), which the caller schedules on its
    own event clock (:class:`Fluid` on SimPy's, the fast engine on its queue). A wake-up scheduled before the
    latest reallocation is stale: the caller compares its :attr:`generation`. Jobs are keyed by anything the
    caller likes (an op id, a worker): only their start order matters.
    """

    def __init__(self, contention: Contention) -> None:
        self.capacity = contention.capacity
        self.jobs: dict[int, Job] = {}
        self.generation = 0  # a wake-up scheduled before the last reallocation is stale
        self.stretch: dict[int, float] = {}
        # Rates and limits of every set of running jobs met in this run, by their demands in start order: the
        # same sets recur (every layer, every iteration, every rank's copy), and the filling is a pure function.
        self._filled: dict[tuple[tuple[tuple[int, float], ...], ...], tuple[list[float], list[int]]] = {}

    def add(self, key: int, duration_s: float, uses: tuple[tuple[int, float], ...], now: float) -> float | None:
        """Job ``key`` starts at ``now``; the delay of the next wake-up (None: no job left)."""
        self.jobs[key] = Job(now + duration_s, uses, now)
        return self._reallocate(now)

    def due(self, now: float) -> tuple[list[int], float | None]:
        """A current wake-up at ``now``: the jobs that finish now (in start order, removed), and the delay of
        the next wake-up."""
        tol = REL_EPS * max(1.0, abs(now))
        jobs = self.jobs
        finished = [key for key, job in jobs.items() if job.finish <= now + tol]
        for key in finished:
            job = jobs.pop(key)
            self._close_interval(job, now)
        return finished, self._reallocate(now)

    def _close_interval(self, job: Job, now: float) -> None:
        if job.rate < 1.0 and job.limit >= 0:
            self.stretch[job.limit] = self.stretch.get(job.limit, 0.0) + (1.0 - job.rate) * (now - job.since)
        job.since = now

    def _reallocate(self, now: float) -> float | None:
        self.generation += 1
        jobs = self.jobs
        if not jobs:
            return None
        values = jobs.values()
        key = tuple([job.uses for job in values])
        filled = self._filled.get(key)
        if filled is None:
            filled = self._filled[key] = progressive_filling(key, self.capacity)
        rates, limits = filled
        first = math.inf
        for job, rate, limit in zip(values, rates, limits):
            if rate != job.rate:
                self._close_interval(job, now)
                remaining = (job.finish - now) * job.rate  # full-speed seconds of work left
                job.finish = now + remaining / rate
                job.rate = rate
            job.limit = limit
            if job.finish < first:
                first = job.finish
        return max(0.0, first - now)


class Fluid:
    """:class:`FluidState` driven by an event clock with SimPy's interface (the SimPy engine's)."""

    def __init__(self, env: Clock, contention: Contention) -> None:
        self.env = env
        self.state = FluidState(contention)
        self._events: dict[int, ClockEvent] = {}

    @property
    def stretch(self) -> dict[int, float]:
        return self.state.stretch

    def run(self, op_id: int, duration_s: float, uses: tuple[tuple[int, float], ...]) -> ClockEvent:
        event = self._events[op_id] = self.env.event()
        self._schedule(self.state.add(op_id, duration_s, uses, self.env.now))
        return event

    def _schedule(self, delay: float | None) -> None:
        if delay is None:
            return
        wake = self.env.timeout(delay)
        generation = self.state.generation
        callbacks = wake.callbacks
        assert callbacks is not None  # a fresh timeout has not been processed yet
        callbacks.append(lambda _ev: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self.state.generation:
            return  # rates changed since this wake-up was scheduled
        finished, delay = self.state.due(self.env.now)
        for op_id in finished:
            self._events.pop(op_id).succeed()
        self._schedule(delay)


def progressive_filling(
    uses: Sequence[tuple[tuple[int, float], ...]], capacity: Sequence[float]
) -> tuple[list[float], list[int]]:
    """Rates (fraction of full speed) and limiting resource of each job (by its position in ``uses``, its
    demands): max-min fair in each op's own unit. A pure function of ``uses`` (:class:`Fluid` remembers it).

    Each op's throughput is measured in the unit of its first listed resource (bytes/s for a copy or a
    memory-bound CPU kernel, threads for a kernel that only needs cores). All unfrozen ops' throughputs
    rise together; an op that reaches its full speed is frozen at rate 1; the first resource to fill
    freezes its remaining users; repeat. On a saturated resource every op still rising gets the same
    throughput (a fair share in bytes/s, not in fraction of speed): an op that asks for more than its share
    is held to it and does not take a slower neighbour's bytes.
    """
    n = len(uses)
    unit = [ks[0][1] for ks in uses]
    # Per shared resource: its users (position, demand per unit of the user's throughput) and what is left.
    users: dict[int, list[tuple[int, float]]] = {}
    left: dict[int, float] = {}
    for p, ks in enumerate(uses):
        per = unit[p]
        for k, demand in ks:
            users.setdefault(k, []).append((p, demand / per))
            left[k] = capacity[k]
    rates = [1.0] * n
    limits = [-1] * n
    unfrozen = [True] * n
    remaining = n

    def freeze(p: int, rate: float, limit: int) -> None:
        rates[p] = rate
        limits[p] = limit
        unfrozen[p] = False
        for k, demand in uses[p]:
            left[k] -= rate * demand

    while remaining:
        # Throughput at which each resource fills if every unfrozen op runs at that throughput.
        fill, fill_k = math.inf, -1
        for k, us in users.items():
            slope = sum([s for p, s in us if unfrozen[p]])
            if slope > 0:
                level = max(left[k], 0.0) / slope
                if level < fill:
                    fill, fill_k = level, k
        full = min([unit[p] for p in range(n) if unfrozen[p]])
        if full <= fill:
            for p in range(n):
                if unfrozen[p] and unit[p] <= full:
                    freeze(p, 1.0, -1)
                    remaining -= 1
            continue
        for p, _ in users[fill_k]:
            if unfrozen[p]:
                freeze(p, max(fill / unit[p], 1e-12), fill_k)
                remaining -= 1
    return rates, limits
