"""Building blocks shared by every schedule: the model as a list of units, forward/backward passes,
gradient buckets, and the per-GPU token count.

A *unit* is what the schedules move and compute as one piece: the embedding, each decoder layer, and the
output head (final norm + logits). Schedules differ in what happens *around* the passes (where gradients
go, where the optimizer runs, what the next forward waits for); the passes themselves live here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sosim import model as tm
from sosim.config import Scenario
from sosim.costs import CostModel
from sosim.plan import COMPUTE, GPU, Plan


@dataclass(frozen=True)
class Unit:
    index: int  # 0 = embedding, 1..L = layers, L+1 = head
    name: str
    params: int  # parameters held by this rank (after any partitioning)
    fwd_s: float
    bwd_s: float


def tokens_per_gpu(sc: Scenario) -> int:
    """Tokens of one micro-batch on one GPU; Ulysses sequence parallelism splits the sequence."""
    return sc.training.micro_batch * sc.training.seq_len // sc.cluster.sequence_parallel


def global_tokens_per_step(sc: Scenario) -> int:
    t = sc.training
    return t.micro_batch * t.seq_len * t.grad_accum * sc.cluster.dp


def build_units(sc: Scenario, costs: CostModel) -> list[Unit]:
    m = sc.model
    emb = m.vocab * m.hidden
    head = tm.embedding_params(m) - emb
    units = [Unit(0, "embed", emb, 0.0, 0.0)]
    layer_p = tm.layer_params(m)
    fwd, bwd = costs.layer_fwd_s(), costs.layer_bwd_s()
    units += [Unit(i, f"layer{i - 1}", layer_p, fwd, bwd) for i in range(1, m.layers + 1)]
    units.append(Unit(m.layers + 1, "head", head, costs.head_fwd_s(), costs.head_bwd_s()))
    return units


def forward_pass(
    plan: Plan,
    units: Sequence[Unit],
    iteration: int,
    gates: dict[int, Sequence[int]] | None = None,
    *,
    prefix: str = "fwd",
) -> list[int]:
    """Forward ops of every unit on the GPU stream, in order. ``gates[u]``: extra deps of unit u's op."""
    gates = gates or {}
    ids = []
    for u in units:
        ids.append(
            plan.add(GPU, f"{prefix}:{u.name}", u.fwd_s, tuple(gates.get(u.index, ())),
                     layer=u.index, iteration=iteration, category=COMPUTE)
        )
    return ids


def backward_pass(
    plan: Plan,
    units: Sequence[Unit],
    iteration: int,
    gates: dict[int, Sequence[int]] | None = None,
) -> dict[int, int]:
    """Backward ops in reverse unit order; returns unit index -> op id (the op producing its grads)."""
    gates = gates or {}
    out: dict[int, int] = {}
    for u in reversed(units):
        out[u.index] = plan.add(GPU, f"bwd:{u.name}", u.bwd_s, tuple(gates.get(u.index, ())),
                                layer=u.index, iteration=iteration, category=COMPUTE)
    return out


@dataclass(frozen=True)
class Bucket:
    """Consecutive units (in backward order) whose gradients travel and are updated together."""

    index: int
    units: tuple[int, ...]  # unit indices, in the order backward produces them
    params: int

    @property
    def last_unit(self) -> int:
        """The unit whose backward completes the bucket."""
        return self.units[-1]


def make_buckets(units: Sequence[Unit], bucket_params: float) -> list[Bucket]:
    """Group units in backward order into buckets of about ``bucket_params`` parameters.

    A unit is never split (its gradients are produced by one backward op); a bucket closes once it
    reaches the target size, so a unit larger than the target forms its own bucket.
    """
    buckets: list[Bucket] = []
    current: list[int] = []
    size = 0
    for u in reversed(units):
        if u.params == 0:
            continue
        current.append(u.index)
        size += u.params
        if size >= bucket_params:
            buckets.append(Bucket(len(buckets), tuple(current), size))
            current, size = [], 0
    if current:
        buckets.append(Bucket(len(buckets), tuple(current), size))
    return buckets


def cores_for_adam(sc: Scenario, fraction: float) -> float:
    return max(1.0, sc.hardware.cpu.cores * fraction)
