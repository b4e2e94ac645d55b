"""GPU-only data parallel training (PyTorch DDP / ZeRO-0): everything stays in HBM.

Per iteration: forward, backward with bucketed gradient all-reduce (DDP's 25 MB buckets, each launched
once its last gradient is ready) on the NCCL stream at the last micro-batch, then Adam on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from sosim.engine.plan import NET, Category, Phase, Plan
from sosim.hardware import model as tm
from sosim.hardware.machine import Machine
from sosim.hardware.memory import MemoryUsage
from sosim.inputs.config import PosFloat, ScheduleKnobs
from sosim.inputs.units import BF16_BYTES
from sosim.schedules.blocks import cpu, layout
from sosim.schedules.blocks.driver import Ctx, DoneCallback, Recipe, plan_for
from sosim.schedules.blocks.layout import Group, Unit
from sosim.schedules.blocks.weights import Replicated

if TYPE_CHECKING:
    from sosim.costs.model import Costs
    from sosim.inputs.config import Scenario

# PyTorch DDP's default bucket_cap_mb.
DDP_BUCKET_MB = 25.0


class GpuOnlyKnobs(ScheduleKnobs):
    """Plain data parallel training with everything in HBM."""

    system: Literal["gpu_only"]
    # Bytes of model state per parameter: bf16 params+grads (4) + fp32 master, m, v (12) = 16.
    state_bytes_per_param: PosFloat = Field(16.0, description=
        "Bytes of model state per parameter in HBM: bf16 params + grads (4) + fp32 master, m, v (12) = 16; the ZeRO "
        "stage's model state per GPU for DeepSpeed configs of stage 0-2")


@dataclass
class AllReduce:
    """DDP: each bucket is all-reduced as soon as its gradients are ready, at the last micro-batch."""

    ops: list[int] = field(default_factory=list)

    def start(self, ctx: Ctx) -> None:
        self.ops = []
        del ctx

    def after_backward(self, ctx: Ctx, u: Unit, op: int, done: DoneCallback) -> None:
        del done
        if not ctx.boundary or ctx.dp <= 1:
            return
        for f in ctx.layout.flushes_at.get(u.index, ()):
            n = f.elements * BF16_BYTES
            self.ops.append(ctx.add(NET, f"allreduce:f{f.index}", ctx.costs.collective_s("all_reduce", n, ctx.dp),
                                    [op], phase=Phase.GRADIENT, category=Category.COMM, layer=u.index,
                                    group=f.index, n_bytes=2.0 * (ctx.dp - 1) / ctx.dp * n))

    def finish(self, ctx: Ctx, done: DoneCallback) -> None:
        del ctx, done


@dataclass
class GpuAdamStep:
    """Adam over every parameter on the GPU once all reductions are done."""

    reduce: AllReduce

    def on_done(self, ctx: Ctx, group: Group, arrival: int) -> None:
        del ctx, group, arrival

    def run(self, ctx: Ctx, arrivals: dict[int, int], backward_end: int) -> dict[int, list[int]]:
        del arrivals
        op = ctx.gpu_op("adam:gpu", ctx.costs.gpu_adam_s(ctx.layout.p_total), [backward_end, *self.reduce.ops],
                        phase=Phase.OPTIMIZER, category=Category.OPTIMIZER)
        return {0: [op]}


def memory_usage(sc: Scenario) -> MemoryUsage:
    s = sc.schedule
    assert isinstance(s, GpuOnlyKnobs)
    p = tm.total_params(sc.model)
    gpu = {
        "model_state": s.state_bytes_per_param * p,
        "activations": tm.activation_bytes_peak(sc.model, sc.training, sequence_parallel=sc.cluster.sequence_parallel),
    }
    return MemoryUsage(gpu_bytes=gpu, cpu_bytes={})


def recipe(sc: Scenario, costs: Costs, machine: Machine) -> Recipe:
    units = layout.build_units(sc, costs)
    tensors = layout.build_tensors(sc.model, units)
    flushes = layout.make_flushes(tensors, layout.bucket_elements_from_mb(DDP_BUCKET_MB), "fill")
    whole = layout.one_group(tensors, on_gpu=True)
    reduce = AllReduce()
    return Recipe(layout=layout.make_layout(units, tensors, flushes, whole),
                  cpu=cpu.one_process(machine.threads_per_rank, "cpu_adam"), weights=Replicated(),
                  grads=reduce, step=GpuAdamStep(reduce))


def build_plan(sc: Scenario, costs: Costs, machine: Machine) -> Plan:
    return plan_for(sc, costs, recipe(sc, costs, machine))
