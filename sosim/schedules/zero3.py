"""ZeRO stage 3 without offload, and ZeRO++ on top of it (DeepSpeed ``stage: 3`` with
``zero_quantized_weights``, ``zero_hpz_partition_size``, ``zero_quantized_gradients``; DeepSpeed 0.19,
``runtime/zero/stage3.py``, ``partition_parameters.py``, ``runtime/comm/coalesced_collectives.py``).

Parameters, gradients and optimizer state are partitioned over the ZeRO group and stay in HBM. Per layer
and pass the weights are all-gathered; gradients are reduce-scattered per reduce bucket; Adam runs on the
GPU over each rank's partition after backward. The ZeRO++ switches change the collectives only:

* **qwZ** (``zero_quantized_weights``): each rank quantizes its bf16 weight partition to int8 (one fp32 scale
  per group of ``QWZ_GROUP`` elements) and the all-gather moves int8 (half the bytes); the gathered layer is
  dequantized before use.
* **hpZ** (``zero_hpz_partition_size`` = h > 1): after the forward all-gather each rank keeps a secondary
  bf16 partition of 1/h of the layer (HBM cost 2 B/param / h), so the backward all-gather runs over the h
  ranks of its node only.
* **qgZ** (``zero_quantized_gradients``): the gradient reduce-scatter becomes int4 all-to-alls in two hops,
  inside the node then across nodes on the node-reduced 1/g (``all_to_all_quant_reduce``), with quantize,
  reduce and dequantize kernels; DeepSpeed uses it only with more than one node
  (``__avg_scatter_grads``: ``num_nodes > 1``), otherwise the plain reduce-scatter runs.

Across nodes a step's weight and gradient traffic per rank goes from 3 x the model's bf16 bytes / g (two
all-gathers and a reduce-scatter) to 0.5 (int8 forward gather) + 0 (backward gather inside the node) +
0.25 (int4 gradients) of it: 4x less, as the ZeRO++ paper states.

Quantization kernels: no throughput is published for DeepSpeed's fused CUDA kernels (csrc/quantization).
Both modes are the cost object's (``gpu_quantize_s``, constants and sources in sosim/costs/analytic.py).
``quantize_kernels: fused`` (default) times them as memory bound: each kernel's HBM traffic (int8: read 2 B +
write 1 B per element; int4: read 2 + write 0.5) at the rate the cost model gives a GPU dtype cast (a 6 B per
element kernel). ``quantize_kernels: torch`` uses measurements on an H200 of a torch implementation of the
same block quantization (calibration/nvidia-h200-2026-11-30/measurements.csv, op ``quantize``, 1e8 elements;
several unfused kernels, 10-25x slower than the memory bound), scaled to other GPUs by HBM bandwidth: an
upper bound on the kernels' cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, Field

from sosim.engine.plan import GPU_CAST, NET, Category, Phase, Plan
from sosim.hardware import model as tm
from sosim.hardware.machine import Machine, zero_group
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.config import PosFloat, ScheduleKnobs
from sosim.inputs.units import BF16_BYTES, FP32_BYTES
from sosim.schedules.blocks import cpu, stage3
from sosim.schedules.blocks.driver import Ctx, DoneCallback, Recipe, plan_for
from sosim.schedules.blocks.layout import Flush, Group, Unit
from sosim.schedules.blocks.steps import gpu_adam

if TYPE_CHECKING:
    from sosim.costs.analytic import QuantKernel
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario

# Elements per quantization group (one fp32 scale each): DeepSpeed's default for qwZ.
QWZ_GROUP = 2048
INT8_BYTES, INT4_BYTES = 1.0, 0.5
# DeepSpeed's sub_group_size default (the GPU optimizer steps sub-group by sub-group too).
SUB_GROUP_ELEMENTS = 1e9


class Zero3Knobs(ScheduleKnobs):
    """ZeRO-3 with everything in HBM; ZeRO++'s three switches (DeepSpeed's defaults: off, 1, off)."""

    system: Literal["zero3"]
    implementation: Literal["deepspeed"] = Field("deepspeed", description=
        "deepspeed only: ZeRO-3 without offload has no paper schedule")
    # Gradient reduce bucket in MB of bf16 gradients (DeepSpeed reduce_bucket_size x 2 B).
    bucket_mb: PosFloat = Field(1000.0, description=
        "The reduce-scatter bucket, MB of bf16 gradients (DeepSpeed reduce_bucket_size x 2 B)")
    zero_quantized_weights: bool = Field(False, description=
        "ZeRO++ qwZ: int8 weight all-gathers (one fp32 scale per 2,048 elements)")
    zero_hpz_partition_size: int = Field(1, ge=1, description=
        "ZeRO++ hpZ: a secondary bf16 weight partition over this many ranks of a node (2 B/param / h of HBM); the "
        "backward all-gather stays inside them")
    zero_quantized_gradients: bool = Field(False, description=
        "ZeRO++ qgZ: int4 gradient all-to-alls in two hops; DeepSpeed uses it only across nodes")
    # How the quantization kernels are timed (see the module docstring).
    quantize_kernels: Literal["fused", "torch"] = Field("fused", description=
        "How ZeRO++'s quantization kernels are timed: fused (memory-bound estimate) or torch (the measured torch "
        "implementation, an upper bound)")
    DEFAULTS: ClassVar[dict[str, BaseModel]] = {}


def _knobs(sc: Scenario) -> Zero3Knobs:
    assert isinstance(sc.schedule, Zero3Knobs)
    return sc.schedule


def _quant_s(ctx: Ctx, elements: float, kernel: QuantKernel) -> float:
    s = ctx.sc.schedule
    fused = not (isinstance(s, Zero3Knobs) and s.quantize_kernels == "torch")
    return ctx.costs.gpu_quantize_s(elements, kernel, fused)


@dataclass(frozen=True)
class Gathered:
    """Weights partitioned in HBM, all-gathered per unit and pass; qwZ and hpZ change the gather."""

    machine: Machine
    qwz: bool
    hpz: int

    def _gather(self, ctx: Ctx, u: Unit, phase: Phase, ranks: int, per_node: int, quantized: bool) -> list[int]:
        tag = "fwd" if phase is Phase.FORWARD else "bwd"
        deps: list[int | None] = []
        n_bytes = float(u.params * BF16_BYTES)
        if quantized:
            shard = u.params / ranks
            deps = [ctx.add(GPU_CAST, f"qwz_quantize_{tag}:{u.name}", _quant_s(ctx, shard, "int8"), [],
                            phase=phase, category=Category.CAST, layer=u.index)]
            n_bytes = u.params * (INT8_BYTES + FP32_BYTES / QWZ_GROUP)
        dur = ctx.costs.collective_s("all_gather", n_bytes, ranks, per_node)
        op = ctx.add(NET, f"allgather_{tag}:{u.name}", dur, deps, phase=phase, category=Category.COMM,
                     layer=u.index, n_bytes=(ranks - 1) / ranks * n_bytes)
        if quantized:
            op = ctx.add(GPU_CAST, f"qwz_dequantize_{tag}:{u.name}", _quant_s(ctx, u.params, "int8_dequant"),
                         [op], phase=phase, category=Category.CAST, layer=u.index)
        return [op]

    def before_use(self, ctx: Ctx, u: Unit, phase: Phase) -> list[int]:
        ranks = ctx.dp
        if ranks <= 1 or not u.params:
            return []
        per_node = min(ranks, self.machine.gpus_per_node)
        if phase is Phase.BACKWARD and self.hpz > 1:
            # hpZ: the secondary partition inside the node; bf16 (DeepSpeed keeps ds_secondary_tensor unquantized).
            return self._gather(ctx, u, phase, self.hpz, self.hpz, quantized=False)
        return self._gather(ctx, u, phase, ranks, per_node, quantized=self.qwz)


@dataclass
class Reduced:
    """Gradients reduce-scattered per reduce bucket on the NCCL stream at the last micro-batch; with qgZ and
    more than one node, int4 all-to-alls inside then across nodes with their quantization kernels."""

    machine: Machine
    qgz: bool
    last: dict[int, int] = field(default_factory=dict)

    def start(self, ctx: Ctx) -> None:
        del ctx
        self.last = {}

    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None:
        if not ctx.boundary:
            return
        for f in ctx.layout.flushes_at.get(u.index, ()):
            end = self._flush(ctx, f, op)
            for g in ctx.layout.groups_done_by(f.index):
                done(ctx, g, end)

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del ctx, done

    def _flush(self, ctx: Ctx, f: Flush, op: int) -> int:
        ranks = ctx.dp
        if ranks <= 1:
            return op
        g = min(ranks, self.machine.gpus_per_node)
        nodes = ranks // g
        s = f.elements
        G = Phase.GRADIENT
        if not (self.qgz and nodes > 1):
            n = s * BF16_BYTES
            dur = ctx.costs.collective_s("reduce_scatter", n, ranks, g)
            return ctx.add(NET, f"reduce_scatter:f{f.index}", dur, [op], phase=G, category=Category.COMM,
                           layer=f.unit, group=f.index, n_bytes=(ranks - 1) / ranks * n)
        last = ctx.add(GPU_CAST, f"qgz_quantize:f{f.index}", _quant_s(ctx, s, "int4"), [op], phase=G,
                       category=Category.CAST, layer=f.unit, group=f.index)
        intra = s * INT4_BYTES
        last = ctx.add(NET, f"qgz_all_to_all_intra:f{f.index}",
                       ctx.costs.collective_s("all_to_all", intra, g, g), [last], phase=G,
                       category=Category.COMM, layer=f.unit, group=f.index, n_bytes=(g - 1) / g * intra)
        # Dequantize the g received int4 slices, reduce, re-quantize the node's 1/g (quantized_reduction).
        reduce_s = _quant_s(ctx, s, "int4_dequant") + _quant_s(ctx, s / g, "int4")
        last = ctx.add(GPU_CAST, f"qgz_reduce:f{f.index}", reduce_s, [last], phase=G,
                       category=Category.CAST, layer=f.unit, group=f.index)
        inter = s / g * INT4_BYTES
        last = ctx.add(NET, f"qgz_all_to_all_inter:f{f.index}",
                       ctx.costs.collective_s("all_to_all", inter, nodes, 1), [last], phase=G,
                       category=Category.COMM, layer=f.unit, group=f.index, n_bytes=(nodes - 1) / nodes * inter)
        return ctx.add(GPU_CAST, f"qgz_dequantize:f{f.index}", _quant_s(ctx, s / g, "int4_dequant"), [last],
                       phase=G, category=Category.CAST, layer=f.unit, group=f.index)


@dataclass
class GpuStep:
    """Adam on the GPU, group by group, once the group's gradients are reduced."""

    _arrived: dict[int, int] = field(default_factory=dict)

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx
        self._arrived[group.index] = arrival

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        del arrivals
        ready = {g.index: [gpu_adam(ctx, g, [backward_end, self._arrived.get(g.index)])]  # type: ignore[list-item]
                 for g in ctx.layout.groups}
        self._arrived = {}
        return ready


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = _knobs(sc)
    base = stage3.footprint(sc, weight_flow=False, offload_checkpoints=False, gpu_fraction=1.0, cpu_state_bytes=0.0,
                            gpu_buffer_bytes=stage3.deepspeed_gpu_buffers(sc, s.bucket_mb))
    gpu = dict(base.gpu_bytes)
    if s.zero_hpz_partition_size > 1:
        gpu["hpz_secondary_partition"] = BF16_BYTES * tm.total_params(sc.model) / s.zero_hpz_partition_size
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes={})


def recipe(sc: Scenario, costs: Costs, machine: Machine) -> Recipe:
    s = _knobs(sc)
    hpz = min(s.zero_hpz_partition_size, zero_group(sc))
    return Recipe(
        layout=stage3.deepspeed_layout(sc, costs, SUB_GROUP_ELEMENTS, s.bucket_mb, ratio=0.0),
        cpu=cpu.one_process(machine.threads_per_rank, "cpu_adam"),
        weights=Gathered(machine, s.zero_quantized_weights, hpz),
        hooks=stage3.deepspeed_hooks(sc, costs),
        grads=Reduced(machine, s.zero_quantized_gradients),
        step=GpuStep(),
    )


def choices(sc: Scenario, machine: Machine) -> dict[str, str]:
    s = _knobs(sc)
    on = [n for n, v in (("qwZ", s.zero_quantized_weights), ("hpZ", s.zero_hpz_partition_size > 1),
                         ("qgZ", s.zero_quantized_gradients)) if v]
    note = "" if not s.zero_quantized_gradients or machine.nodes > 1 else " (qgZ inactive on one node, as in DeepSpeed)"
    return {"zeropp": (", ".join(on) or "off") + note}


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    return plan_for(sc, costs, recipe(sc, costs, machine))
