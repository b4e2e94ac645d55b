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
from sosim.machine import Machine
from sosim.plan import COMM, COMPUTE, GPU, NET, Phase, Plan, ResourceKind
from sosim.units import BF16_BYTES


@dataclass(frozen=True)
class Unit:
    index: int  # 0 = embedding, 1..L = layers, L+1 = head
    name: str
    params: int  # parameters held by this rank (after any partitioning)
    fwd_s: float
    bwd_s: float
    # Ulysses sequence parallelism: all-to-all time the layer waits for in each pass (0 without it).
    a2a_s: float = 0.0
    a2a_bytes: float = 0.0
    # Hardware FLOPs of the forward and of the backward (recompute included) on this GPU.
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0


def duplex(costs: CostModel) -> dict[ResourceKind, float]:
    """The cost model's per-direction duplex factors keyed by resource kind (what the plan carries)."""
    return {ResourceKind(k): f for k, f in costs.duplex_factors.items()}


def gpu_pass_op(
    plan: Plan, u: Unit, kind: str, duration_s: float, deps: Sequence[int], iteration: int
) -> int:
    """One unit's forward or backward on the GPU stream, preceded by its Ulysses all-to-all if any.

    The all-to-all of Q/K/V (and of the attention output) sits on the critical path: attention cannot
    start before every rank holds its heads for the whole sequence, so the compute op depends on it; and it
    exchanges this layer's activations, which the previous op on the GPU stream produces, so it cannot run
    ahead of it (it is inside the layer: projection, all-to-all, attention, all-to-all, output projection).
    """
    phase = Phase.FORWARD if kind == "fwd" else Phase.BACKWARD
    deps = tuple(deps)
    if u.a2a_s > 0:
        producer = next((op.id for op in reversed(plan.ops) if op.resource == GPU), None)
        if producer is not None:
            deps = (*deps, producer)
        deps = (plan.add(NET, f"all_to_all_{kind}:{u.name}", u.a2a_s, deps, layer=u.index, iteration=iteration,
                         category=COMM, phase=phase, n_bytes=u.a2a_bytes),)
    flops = u.fwd_flops if phase is Phase.FORWARD else u.bwd_flops
    return plan.add(GPU, f"{kind}:{u.name}", duration_s, deps, layer=u.index, iteration=iteration,
                    category=COMPUTE, phase=phase, flops=flops)


def tokens_per_gpu(sc: Scenario) -> int:
    """Tokens of one micro-batch on one GPU; Ulysses sequence parallelism splits the sequence."""
    return sc.training.micro_batch * sc.training.seq_len // sc.cluster.sequence_parallel


def zero_group(sc: Scenario) -> int:
    """Ranks a ZeRO partition is spread over: data x sequence parallel. With Ulysses every sequence rank
    computes gradients of all parameters on its slice of the sequence, so DeepSpeed reduces and partitions
    over the combined sequence-data-parallel group (deepspeed/sequence/layer.py, groups'
    _get_sequence_data_parallel_group)."""
    return sc.cluster.dp * sc.cluster.sequence_parallel


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
    a2a = ulysses_all_to_all_s(sc, costs)
    a2a_bytes = ulysses_all_to_all_bytes(sc)
    tokens = tokens_per_gpu(sc)
    # FLOPs as model.py counts them (causal attention: the kernels skip the masked half); backward = 2x
    # forward, + a forward if recomputed.
    attention_fwd_flops = tm.attention_flops_fwd(m, tokens, sc.training.seq_len) * tm.CAUSAL_ATTENTION_FRACTION
    layer_fwd_flops = tm.layer_gemm_flops_fwd(m, tokens) + attention_fwd_flops
    layer_bwd_flops = layer_fwd_flops * (3.0 if sc.training.activation_checkpointing else 2.0)
    units += [Unit(i, f"layer{i - 1}", layer_p, fwd, bwd, a2a, a2a_bytes, layer_fwd_flops, layer_bwd_flops)
              for i in range(1, m.layers + 1)]
    head_flops = tm.head_flops_fwd(m, tokens)
    units.append(Unit(m.layers + 1, "head", head, costs.head_fwd_s(), costs.head_bwd_s(),
                      fwd_flops=head_flops, bwd_flops=2.0 * head_flops))
    return units


def ulysses_all_to_all_bytes(sc: Scenario) -> float:
    """Bytes one rank sends in one Ulysses all-to-all pass of one layer: (P-1)/P of 4 * (N/P) * h bf16."""
    sp = sc.cluster.sequence_parallel
    if sp <= 1:
        return 0.0
    return 4.0 * tokens_per_gpu(sc) * sc.model.hidden * BF16_BYTES * (sp - 1) / sp


def ulysses_all_to_all_s(sc: Scenario, costs: CostModel) -> float:
    """DeepSpeed-Ulysses: per layer and pass, all-to-all of q, k, v before attention and of the output after.

    Each rank holds 4 * (N/P) * h elements (bf16) per pass, N = sequence tokens of the micro-batch, and sends
    (P-1)/P of them (DeepSpeed-Ulysses blog: per-link volume 4Nh/P): one all-to-all over that buffer, on the
    machine's topology (its cross-node share goes through the NICs, sosim/collectives.py).
    """
    sp = sc.cluster.sequence_parallel
    if sp <= 1:
        return 0.0
    n_bytes = 4.0 * tokens_per_gpu(sc) * sc.model.hidden * 2.0
    return costs.collective_s("all_to_all", n_bytes, sp)


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
    return [gpu_pass_op(plan, u, prefix, u.fwd_s, gates.get(u.index, ()), iteration) for u in units]


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
        out[u.index] = gpu_pass_op(plan, u, "bwd", u.bwd_s, gates.get(u.index, ()), iteration)
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
    """The rank's CPU threads given to the optimizer (its share of the node's cores: sosim/machine.py)."""
    return max(1.0, cpu_threads(sc) * fraction)


def cpu_threads(sc: Scenario) -> float:
    return float(Machine.from_scenario(sc).threads_per_rank)
