"""zero_infinity_nvme (sosim/schedules/zero_infinity_nvme.py, ZeRO-Infinity's NVMe tier): its DeepSpeed form
and its tuning space.

DeepSpeed: stage 3 with ``offload_optimizer: {device: nvme}`` (runtime/swap_tensor), ``offload_param`` nvme,
cpu or none; ``pipeline_read`` / ``pipeline_write`` and the ``aio`` section (block_size, queue_depth,
intra_op_parallelism; ``thread_count`` is the older spelling) tune the swaps. The NVMe path is the user's:
the emitter writes a placeholder and says so.

Grids (search ranges, not measured optima): the aio knobs a factor 4 either side of DeepSpeed's defaults
(block 1 MiB, queue depth 8, parallelism 1); the pipelining switches both ways; the parameter tier over the
three devices (a structural choice: it moves what lives where).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sosim.schedules.blocks import offload_ds
from sosim.schedules.blocks.tuning import OVERLAP, PREFETCH, SUB_GROUP, Knob, fmt_onoff
from sosim.schedules.system_api import DELETE, OPT, PARAM, DeepSpeedForm, DsReader, Emitted, ZeroView
from sosim.schedules.zero3_offload_ds import emit_stage3

if TYPE_CHECKING:
    from sosim.inputs.config import Scenario

AIO_KEYS = (("block_size", "aio_block_size"), ("queue_depth", "aio_queue_depth"),
            ("intra_op_parallelism", "aio_intra_op_parallelism"), ("thread_count", "aio_intra_op_parallelism"))
NVME_PATH_NOTE = ("nvme_path", "/local_nvme is a placeholder; point it at the node's NVMe volume")


def claims(v: ZeroView) -> str | None:
    if v.opt_dev == "nvme" and v.stage == 3:
        return (f"stage 3 + offload_optimizer nvme (+ offload_param {v.param_dev}): ZeRO-Infinity's NVMe tier "
                "(runtime/swap_tensor)" + offload_ds.IMPLEMENTATION_WHY)
    return None


def _read_swap(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    sched["offload_param"] = v.param_dev
    for key in ("pipeline_read", "pipeline_write"):
        if key in v.opt and not m.is_auto((*OPT, key)):
            sched[key] = bool(m.boolean((*OPT, key)))
            m.mapped((*OPT, key), f"schedule.{key}", sched[key])
    aio = m.get(("aio",))
    if isinstance(aio, dict):
        for key, knob in AIO_KEYS:
            if key in aio and isinstance(aio[key], int) and not isinstance(aio[key], bool):
                sched[knob] = aio[key]
                m.mapped(("aio", key), f"schedule.{knob}", aio[key])


def read(m: DsReader, v: ZeroView, sched: dict[str, Any]) -> None:
    _read_swap(m, v, sched)
    params_streamed = v.param_dev != "none"
    ok = (offload_ds.read_offload_start(m, v, sched, with_params=False, bucket_note=offload_ds.STAGE3_BUCKET_NOTE)
          and offload_ds.read_sub_group(m, v, sched)
          and (offload_ds.read_prefetch(m, v, sched) if params_streamed else
               offload_ds.ignore_prefetch(m, v, "zero_infinity_nvme without offload_param"))
          and offload_ds.read_plain_cpu_adam(m, v, sched))
    if ok:
        offload_ds.ignore_nvme_only(m, v, "not modelled (paths and buffer sizes: memory only)")


def emit(sc: Scenario, base: Mapping[str, Any], out: Emitted) -> None:
    k = sc.schedule.model_dump()
    params = k["offload_param"] != "none"
    if not params:
        out[PARAM] = DELETE
    emit_stage3(sc, base, out)
    out[(*OPT, "device")] = "nvme"
    out[(*OPT, "nvme_path")] = "/local_nvme"
    out[(*OPT, "pipeline_read")] = k["pipeline_read"]
    out[(*OPT, "pipeline_write")] = k["pipeline_write"]
    if params:
        offload_ds.emit_params_from_host(sc, out, k["offload_param"], k["prefetch_layers"])
    out[("aio", "block_size")] = k["aio_block_size"]
    out[("aio", "queue_depth")] = k["aio_queue_depth"]
    out[("aio", "intra_op_parallelism")] = k["aio_intra_op_parallelism"]
    out.note(*NVME_PATH_NOTE)
    offload_ds.emit_cpu_adam_notes(sc, out)
    offload_ds.emit_optimizer(sc, base, out)


DEEPSPEED = DeepSpeedForm(claims=claims, read=read, emit=emit)

PARAM_TIER = Knob("schedule.offload_param", "params", "parameter tier (offload_param device)", ("nvme", "cpu", "none"),
                  structural=True, memory=True)
PIPELINE_READ = Knob("schedule.pipeline_read", "pipe_rd", "offload_optimizer.pipeline_read", (False, True),
                     fmt=fmt_onoff)
PIPELINE_WRITE = Knob("schedule.pipeline_write", "pipe_wr", "offload_optimizer.pipeline_write", (False, True),
                      fmt=fmt_onoff)
AIO_BLOCK = Knob("schedule.aio_block_size", "aio_block", "aio.block_size (bytes)", (1 << 18, 1 << 20, 1 << 22),
                 integer=True)
AIO_DEPTH = Knob("schedule.aio_queue_depth", "aio_depth", "aio.queue_depth", (2, 8, 32), integer=True)
AIO_THREADS = Knob("schedule.aio_intra_op_parallelism", "aio_threads", "aio.intra_op_parallelism", (1, 2, 4),
                   integer=True)
TUNE_SPACE: tuple[Knob, ...] = (PARAM_TIER, SUB_GROUP, PREFETCH, OVERLAP, PIPELINE_READ, PIPELINE_WRITE, AIO_BLOCK,
                                AIO_DEPTH, AIO_THREADS)
