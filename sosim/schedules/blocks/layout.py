"""What the blocks move and compute, as data: units, parameter tensors, gradient flushes, optimizer groups.

* A **unit** is what the GPU computes as one op: the embedding, each decoder layer, the output head.
* A **tensor** is one parameter tensor of a unit (a weight, a bias, a norm scale), in the order the model
  registers them (``model.parameters()``: embedding, layer 0, ..., final norm, output projection).
* A **flush** is a set of consecutive tensors, in backward order, whose gradients leave the GPU together:
  DeepSpeed's reduce bucket (``reduce_bucket_size`` elements, flushed when the next tensor would overflow
  it: ``runtime/zero/stage3.py`` ``reduce_independent_p_g_buckets_and_remove_grads``; stage 1/2 the same
  in ``stage_1_and_2.py``), or the paper's transfer bucket (closed as soon as it is full).
* A **group** is what the optimizer updates as one piece: DeepSpeed's sub-group (``sub_group_size``
  elements in registration order, ``_create_fp16_sub_groups``) or the paper's bucket. A group is *done*
  on the host once the flush carrying its last gradient (in backward order: its first tensor) has left.

Because gradients of a unit are produced by one backward op, every flush is issued at the end of a unit's
backward: the unit whose tensor closed it ("fill") or whose tensor did not fit ("overflow").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

from sosim.hardware import model as tm
from sosim.inputs.units import BF16_BYTES, MB

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import ModelSpec, Scenario

FlushRule = Literal["fill", "overflow"]


@dataclass(frozen=True)
class Unit:
    index: int  # 0 = embedding, 1..L = layers, L+1 = head
    name: str
    params: int  # parameters of the unit (whole model; a rank holds params / dp of them under ZeRO-3)
    fwd_s: float
    bwd_s: float
    # Ulysses sequence parallelism: all-to-all time the layer waits for in each pass, and its bytes.
    a2a_s: float = 0.0
    a2a_bytes: float = 0.0
    # Hardware FLOPs of the forward and of the backward (recompute included) on this GPU.
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    # A transformer layer (not the embedding or the head): what checkpoints and streamed weights apply to.
    is_layer: bool = False

    # The names of its forward and backward compute ops (units are memoised: worked out once, not per pass).
    @functools.cached_property
    def pass_names(self) -> tuple[str, str]:
        return f"fwd:{self.name}", f"bwd:{self.name}"


# Tensors, flushes and groups are named tuples (immutable, and hashed in C): a search builds the same layout
# for many settings, and the layout functions below are memoised on them. Their ``index`` field shadows
# tuple.index (a method nothing here calls on them), hence the type: ignore.
class Tensor(NamedTuple):
    index: int  # type: ignore[assignment]  # registration (forward) order
    unit: int
    elements: int


class Flush(NamedTuple):
    index: int  # type: ignore[assignment]  # backward order: flush 0 leaves first
    unit: int  # the flush is issued at the end of this unit's backward op
    tensors: tuple[int, ...]
    elements: int


class Group(NamedTuple):
    index: int  # type: ignore[assignment]  # registration order: group 0 holds the embedding
    tensors: tuple[int, ...]
    elements: int
    on_gpu: bool = False  # optimizer state kept in HBM and updated on the GPU

    @property
    def params(self) -> int:
        return self.elements


@dataclass(frozen=True)
class Layout:
    units: list[Unit]
    tensors: list[Tensor]
    flushes: list[Flush]
    groups: list[Group]
    # group index -> the flush after which all its gradients have left the GPU
    done_after: dict[int, int] = field(default_factory=dict)
    # unit index -> groups holding its tensors (the next forward of the unit waits for their update)
    unit_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Precomputed lookups (the blocks ask them once per flush and iteration).
    flushes_at: dict[int, tuple[Flush, ...]] = field(default_factory=dict)  # unit -> flushes issued after it
    done_by: dict[int, tuple[Group, ...]] = field(default_factory=dict)  # flush -> groups it completes
    # flush -> elements whose optimizer runs on the GPU (their gradients need not reach the host)
    gpu_elements: dict[int, int] = field(default_factory=dict)
    p_total: int = 0

    def groups_done_by(self, flush: int) -> tuple[Group, ...]:
        return self.done_by.get(flush, ())

    @property
    def cpu_groups(self) -> list[Group]:
        return [g for g in self.groups if not g.on_gpu]




# --- units --------------------------------------------------------------------------------------------------
def ulysses_all_to_all_bytes(sc: Scenario) -> float:
    """Bytes one rank sends in one Ulysses all-to-all pass of one layer: (P-1)/P of 4 * (N/P) * h bf16."""
    sp = sc.cluster.sequence_parallel
    if sp <= 1:
        return 0.0
    return 4.0 * tm.tokens_per_gpu(sc) * sc.model.hidden * BF16_BYTES * (sp - 1) / sp


def ulysses_all_to_all_s(sc: Scenario, costs: Costs) -> float:
    """DeepSpeed-Ulysses: per layer and pass, all-to-all of q, k, v before attention and of the output after.

    Each rank exchanges 4 * (N/P) * h elements (bf16) per pass, N = sequence tokens of the micro-batch;
    (P-1)/P of them leave the GPU. Modelled as one collective at the fabric's all-to-all rate.
    """
    sp = sc.cluster.sequence_parallel
    if sp <= 1:
        return 0.0
    n_bytes = 4.0 * tm.tokens_per_gpu(sc) * sc.model.hidden * BF16_BYTES
    return costs.collective_s("all_to_all", n_bytes, sp)  # each rank's buffer; (P-1)/P of it leaves the GPU


def build_units(sc: Scenario, costs: Costs) -> list[Unit]:
    m = sc.model
    emb, head, layer_p, layer_fwd_flops, layer_bwd_flops, head_flops = _unit_counts(
        m, tm.tokens_per_gpu(sc), sc.training.seq_len, sc.training.activation_checkpointing)
    fwd, bwd = costs.layer_fwd_s(), costs.layer_bwd_s()
    a2a, a2a_bytes = ulysses_all_to_all_s(sc, costs), ulysses_all_to_all_bytes(sc)
    return list(_units(m.layers, emb, head, layer_p, layer_fwd_flops, layer_bwd_flops, head_flops, fwd, bwd, a2a,
                       a2a_bytes, costs.head_fwd_s(), costs.head_bwd_s()))


@functools.lru_cache(maxsize=256)
def _units(layers: int, emb: int, head: int, layer_p: int, layer_fwd_flops: float, layer_bwd_flops: float,
           head_flops: float, fwd: float, bwd: float, a2a: float, a2a_bytes: float, head_fwd: float,
           head_bwd: float) -> tuple[Unit, ...]:
    # Cached on the numbers that make them (units are immutable): a search builds the same units for every
    # setting that keeps the model and the per-layer costs.
    units = [Unit(0, "embed", emb, 0.0, 0.0)]
    units += [Unit(i, f"layer{i - 1}", layer_p, fwd, bwd, a2a, a2a_bytes, layer_fwd_flops, layer_bwd_flops,
                   is_layer=True) for i in range(1, layers + 1)]
    units.append(Unit(layers + 1, "head", head, head_fwd, head_bwd, fwd_flops=head_flops, bwd_flops=2.0 * head_flops))
    return tuple(units)


@functools.lru_cache(maxsize=256)
def _unit_counts(m: ModelSpec, tokens: int, seq_len: int, checkpointing: bool) -> tuple[
        int, int, int, float, float, float]:
    """Parameters and FLOPs of the units (embedding, head, a layer): model arithmetic, cached per shape."""
    emb = m.vocab * m.hidden
    head = tm.embedding_params(m) - emb
    # FLOPs as model.py counts them (causal attention: the kernels skip the masked half); backward = 2x
    # forward, + a forward if recomputed.
    layer_fwd_flops = tm.layer_flops_fwd(m, tokens, seq_len)
    layer_bwd_flops = layer_fwd_flops * (3.0 if checkpointing else 2.0)
    return emb, head, tm.layer_params(m), layer_fwd_flops, layer_bwd_flops, tm.head_flops_fwd(m, tokens)


def param_units(m: ModelSpec) -> list[Unit]:
    """Units with their parameter counts only (no durations): what memory footprints need."""
    return list(_param_units(m))


@functools.lru_cache(maxsize=64)
def _param_units(m: ModelSpec) -> tuple[Unit, ...]:
    # Cached: a search checks the memory of many settings of one model (units are immutable).
    emb = m.vocab * m.hidden
    layer_p = tm.layer_params(m)
    return (Unit(0, "embed", emb, 0.0, 0.0),
            *(Unit(i, f"layer{i - 1}", layer_p, 0.0, 0.0) for i in range(1, m.layers + 1)),
            Unit(m.layers + 1, "head", tm.embedding_params(m) - emb, 0.0, 0.0))


# --- parameter tensors ------------------------------------------------------------------------------------
def build_tensors(m: ModelSpec, units: Sequence[Unit]) -> list[Tensor]:
    """Every parameter tensor of the model, in registration order (``units``: the model's, embedding first)."""
    head = units[-1]
    return list(_tensors(m, tuple(u.index for u in units[1:-1]), head.index, head.params))


@functools.lru_cache(maxsize=64)
def _tensors(m: ModelSpec, layer_units: tuple[int, ...], head_unit: int, head_params: int) -> tuple[Tensor, ...]:
    # Cached: a search simulates one model under many settings, and the tensors depend on the model only.
    layer = tm.layer_tensor_sizes(m)
    sizes: list[tuple[int, int]] = [(0, m.vocab * m.hidden)]
    for unit in layer_units:
        sizes += [(unit, n) for n in layer]
    final_norm = 2 * m.hidden if m.ffn_kind == "gelu" else m.hidden
    sizes.append((head_unit, final_norm))
    if head_params > final_norm:
        sizes.append((head_unit, head_params - final_norm))
    return tuple(Tensor(i, unit, n) for i, (unit, n) in enumerate(sizes))


# --- flushes and groups ---------------------------------------------------------------------------------------
def bucket_elements_from_mb(bucket_mb: float) -> float:
    """Buckets are quoted in MB of bf16 gradients: DeepSpeed's reduce_bucket_size (elements) x 2 B."""
    return bucket_mb * MB / BF16_BYTES


def make_flushes(tensors: Sequence[Tensor], cap_elements: float, rule: FlushRule) -> list[Flush]:
    """Cut the tensors, in backward order, into flushes of about ``cap_elements`` gradient elements.

    ``overflow`` (DeepSpeed): a flush leaves when the next tensor would not fit, i.e. at the end of the
    backward op producing that next tensor; the last one leaves at the end of backward (the epilogue).
    ``fill`` (the paper's buckets): a bucket leaves as soon as it holds ``cap_elements``.
    """
    return list(_flushes(tuple(tensors), cap_elements, rule))


@functools.lru_cache(maxsize=256)
def _flushes(tensors: tuple[Tensor, ...], cap_elements: float, rule: FlushRule) -> tuple[Flush, ...]:
    flushes: list[Flush] = []
    current: list[int] = []
    size = 0

    def close(at_unit: int) -> None:
        nonlocal current, size
        flushes.append(Flush(len(flushes), at_unit, tuple(current), size))
        current, size = [], 0

    for t in reversed(tensors):
        if rule == "overflow" and current and size + t.elements > cap_elements:
            close(t.unit)
        current.append(t.index)
        size += t.elements
        if rule == "fill" and size >= cap_elements:
            close(t.unit)
    if current:
        close(tensors[0].unit)
    return tuple(flushes)


def subgroups(tensors: Sequence[Tensor], size_elements: float) -> list[Group]:
    """DeepSpeed's optimizer sub-groups: tensors in registration order, closed once >= ``size_elements``."""
    return list(_subgroups(tuple(tensors), size_elements))


@functools.lru_cache(maxsize=256)
def _subgroups(tensors: tuple[Tensor, ...], size_elements: float) -> tuple[Group, ...]:
    groups: list[Group] = []
    current: list[int] = []
    size = 0
    for t in tensors:
        current.append(t.index)
        size += t.elements
        if size >= size_elements or t is tensors[-1]:
            groups.append(Group(len(groups), tuple(current), size))
            current, size = [], 0
    return tuple(groups)


def one_group(tensors: Sequence[Tensor], on_gpu: bool = False) -> list[Group]:
    """Every tensor in one optimizer group (an optimizer that updates the whole partition at once)."""
    return [_one_group(tuple(tensors), on_gpu)]


@functools.lru_cache(maxsize=64)
def _one_group(tensors: tuple[Tensor, ...], on_gpu: bool) -> Group:
    return Group(0, tuple(t.index for t in tensors), sum(t.elements for t in tensors), on_gpu)


def groups_from_flushes(flushes: Sequence[Flush]) -> list[Group]:
    """The paper's schedule updates each transfer bucket as one group (registration order)."""
    return list(_groups_from_flushes(tuple(flushes)))


@functools.lru_cache(maxsize=64)
def _groups_from_flushes(flushes: tuple[Flush, ...]) -> tuple[Group, ...]:
    ordered = sorted(flushes, key=lambda f: min(f.tensors))
    return tuple(Group(i, tuple(sorted(f.tensors)), f.elements) for i, f in enumerate(ordered))


def gpu_groups_by_ratio(groups: list[Group], ratio: float) -> list[Group]:
    """DeepSpeed ``offload_optimizer.ratio``: sub-group i stays on the GPU when i < int((1 - ratio) * n)
    (``runtime/zero/stage3.py`` ``_create_fp32_partitions``): the first groups, by count, not by size."""
    n_gpu = int((1.0 - ratio) * len(groups))
    return [Group(g.index, g.tensors, g.elements, g.index < n_gpu) for g in groups]


def gpu_groups_by_fraction(groups: list[Group], fraction: float) -> list[Group]:
    """The paper's bucketization: the first groups (produced last by backward, needed first by the next
    forward) whose parameters fit in ``fraction`` of the model keep their optimizer state in HBM."""
    return list(_gpu_groups_by_fraction(tuple(groups), fraction))


@functools.lru_cache(maxsize=64)
def _gpu_groups_by_fraction(groups: tuple[Group, ...], fraction: float) -> tuple[Group, ...]:
    budget = fraction * sum(g.elements for g in groups)
    out = []
    for g in groups:
        on_gpu = g.elements <= budget
        budget = budget - g.elements if on_gpu else -1.0  # a prefix only: stop at the first that does not fit
        out.append(Group(g.index, g.tensors, g.elements, on_gpu))
    return tuple(out)


def make_layout(units: list[Unit], tensors: list[Tensor], flushes: list[Flush], groups: list[Group]) -> Layout:
    lookups = _lookups(tuple(tensors), tuple(flushes), tuple(groups))
    return Layout(units, tensors, flushes, groups, *lookups, p_total=sum(u.params for u in units))


_Lookups = tuple[dict[int, int], dict[int, tuple[int, ...]], dict[int, tuple[Flush, ...]], dict[int, tuple[Group, ...]],
                 dict[int, int]]


@functools.lru_cache(maxsize=256)
def _lookups(tensors: tuple[Tensor, ...], flushes: tuple[Flush, ...], groups: tuple[Group, ...]) -> _Lookups:
    """The layout's lookups (shared between the layouts of one search: nothing writes to them)."""
    flush_of = {t: f.index for f in flushes for t in f.tensors}
    group_of = {t: g for g in groups for t in g.tensors}
    done_after = {g.index: max(flush_of[t] for t in g.tensors) for g in groups}
    unit_groups: dict[int, set[int]] = {}
    for t in tensors:
        unit_groups.setdefault(t.unit, set()).add(group_of[t.index].index)
    flushes_at: dict[int, list[Flush]] = {}
    for f in flushes:
        flushes_at.setdefault(f.unit, []).append(f)
    done_by: dict[int, list[Group]] = {}
    for g in groups:
        done_by.setdefault(done_after[g.index], []).append(g)
    if any(g.on_gpu for g in groups):
        gpu_elements = {f.index: sum(tensors[t].elements for t in f.tensors if group_of[t].on_gpu) for f in flushes}
    else:
        gpu_elements = dict.fromkeys((f.index for f in flushes), 0)
    return (done_after, {u: tuple(sorted(gs)) for u, gs in unit_groups.items()},
            {u: tuple(fs) for u, fs in flushes_at.items()}, {f: tuple(gs) for f, gs in done_by.items()}, gpu_elements)
