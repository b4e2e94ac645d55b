"""Cost hooks of DeepSpeed's stage-3 paths: table readers on tiny synthetic CSVs, analytic fallbacks by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sosim.costs import analytic as c
from sosim.costs.analytic import AnalyticCostModel
from sosim.costs.calibration_table import CalibrationTable
from sosim.costs.table import TableCostModel
from sosim.inputs.units import GB
from sosim.run.loader import load_profile
from tests.test_calibration_table import HEADER as BASE_HEADER
from tests.test_calibration_table import row as base_row

# The harness's new sections append these columns at the end of the schema.
HEADER = ",".join([*BASE_HEADER.split(","), *(c for c in ("subgroups", "gpus") if c not in BASE_HEADER.split(","))])
MIB = 2**20
LLAMA = {"hidden": 2048, "heads": 16, "kv_heads": 4, "head_dim": 128, "ffn": 5632}


def row(op: str, variant: str, median_s: float, **cells: float) -> str:
    return base_row(op, variant, median_s, header=HEADER, **cells)


ROWS = [
    # Refresh: 2 ns/element on 16 threads (zero3), 5 ns/element on 4 threads (superoffload's split).
    row("ds_refresh", "zero3", 2e-3, elements=10**6, threads=16),
    row("ds_refresh", "zero3", 0.2, elements=10**8, threads=16),
    row("ds_refresh", "superoffload", 5e-3, elements=10**6, threads=4),
    row("ds_refresh", "superoffload", 0.5, elements=10**8, threads=4),
    # Layer inside ZeRO-3 vs bare: forward +1.0 ms at 2048 tokens, +1.2 ms at 8192; fwd+bwd +3.0 / +3.6 ms.
    row("layer", "hf_fwd", 1.0e-3, batch=1, seq=2048, **LLAMA),
    row("layer", "z3_fwd", 2.0e-3, batch=1, seq=2048, **LLAMA),
    row("layer", "hf_fwd", 4.0e-3, batch=4, seq=2048, **LLAMA),
    row("layer", "z3_fwd", 5.2e-3, batch=4, seq=2048, **LLAMA),
    row("layer", "hf_fwd_bwd", 3.0e-3, batch=1, seq=2048, **LLAMA),
    row("layer", "z3_fwd_bwd", 6.0e-3, batch=1, seq=2048, **LLAMA),
    row("layer", "hf_fwd_bwd", 12.0e-3, batch=4, seq=2048, **LLAMA),
    row("layer", "z3_fwd_bwd", 15.6e-3, batch=4, seq=2048, **LLAMA),
    # A z3 row without a shape (incomplete) is ignored.
    row("layer", "z3_fwd", 9.9, batch=2, seq=2048),
    # step() fixed part: t = 1 ms + 0.5 ms per sub-group + 1 ns per element.
    row("ds_step_fixed", "zero3", 1e-3 + 0.5e-3 * 1 + 1e-9 * 1e8, elements=10**8, subgroups=1),
    row("ds_step_fixed", "zero3", 1e-3 + 0.5e-3 * 4 + 1e-9 * 1e8, elements=10**8, subgroups=4),
    row("ds_step_fixed", "zero3", 1e-3 + 0.5e-3 * 4 + 1e-9 * 4e8, elements=4 * 10**8, subgroups=4),
    # Worker round trip: 200 us + 1 ns/element alone; with copies 300 us + 2 ns/element.
    row("so_worker", "alone", 200e-6 + 1e-9 * 1e6, elements=10**6, threads=12),
    row("so_worker", "alone", 200e-6 + 1e-9 * 1e8, elements=10**8, threads=12),
    row("so_worker", "with_copies", 300e-6 + 2e-9 * 1e6, elements=10**6, threads=12),
    row("so_worker", "with_copies", 300e-6 + 2e-9 * 1e8, elements=10**8, threads=12),
    # SuperOffload's flush: 1 ms + 0.3 ns/element into shared memory.
    row("so_flush", "shared", 1e-3 + 0.3e-9 * 1e7, elements=10**7, threads=3),
    row("so_flush", "shared", 1e-3 + 0.3e-9 * 1e8, elements=10**8, threads=3),
    # NCCL all-reduce on 2 GPUs: 50 GB/s at 1 MiB, 100 GB/s at 64 MiB.
    row("nccl", "all_reduce", MIB / 50e9, bytes=MIB, gpus=2),
    row("nccl", "all_reduce", 64 * MIB / 100e9, bytes=64 * MIB, gpus=2),
    # Disk (time per block, amortised over the queue depth): 1 MiB blocks at depth 8 in 4 ms each; 128 KiB
    # blocks in 1 ms.
    row("disk", "read_direct", 4e-3, bytes=MIB, threads=8),
    row("disk", "read_direct", 1e-3, bytes=MIB // 8, threads=8),
    row("disk", "write_direct", 8e-3, bytes=MIB, threads=8),
]


@pytest.fixture
def table(tmp_path: Path) -> CalibrationTable:
    path = tmp_path / "measurements.csv"
    path.write_text("\n".join([HEADER, *ROWS]) + "\n")
    return CalibrationTable.from_csv(path)


def test_new_columns_are_accepted_at_the_end(table: CalibrationTable) -> None:
    assert table.columns_by_op[("nccl", "all_reduce")]["gpus"].tolist() == [2.0, 2.0]
    assert table.columns_by_op[("ds_step_fixed", "zero3")]["subgroups"].tolist() == [1.0, 4.0, 4.0]


def test_refresh_lookup(table: CalibrationTable) -> None:
    assert table.ds_refresh_time_s(10**7, 16, "zero3") == pytest.approx(2e-2, rel=1e-12)
    assert table.ds_refresh_time_s(10**7, 4, "superoffload") == pytest.approx(5e-2, rel=1e-12)
    assert table.ds_refresh_time_s(10**7, 8, "zero3") is None  # only 16 threads measured for zero3
    assert table.ds_refresh_time_s(10**5, 16, "zero3") is None  # below the smallest size
    assert table.ds_refresh_time_s(0, 16, "zero3") == 0.0


def test_hook_cost_is_the_host_time_under_zero3(table: CalibrationTable) -> None:
    shape = (2048, 16, 4, 5632)
    # The host-side time of a layer's pass under the hooks: the z3 pass time itself (launches included).
    fwd = table.stage3_hook_time_s(*shape, tokens=2048, backward=False)
    assert fwd is not None and fwd[0] == pytest.approx(2.0e-3) and fwd[1] == "exact shape"
    # Linear in tokens inside the range: halfway between 2048 and 8192 tokens.
    mid = table.stage3_hook_time_s(*shape, tokens=5120, backward=False)
    assert mid is not None and mid[0] == pytest.approx(3.6e-3)
    # Flat outside it.
    big = table.stage3_hook_time_s(*shape, tokens=65536, backward=False)
    assert big is not None and big[0] == pytest.approx(5.2e-3)
    # Backward alone = z3 fwd_bwd - z3 fwd: 6.0 - 2.0 ms at 2048 tokens, 15.6 - 5.2 at 8192.
    bwd = table.stage3_hook_time_s(*shape, tokens=2048, backward=True)
    assert bwd is not None and bwd[0] == pytest.approx(4.0e-3)
    bwd8 = table.stage3_hook_time_s(*shape, tokens=8192, backward=True)
    assert bwd8 is not None and bwd8[0] == pytest.approx(10.4e-3)
    # Another layer shape gets the nearest measured one, and says so.
    other = table.stage3_hook_time_s(4096, 32, 8, 11008, tokens=2048, backward=False)
    assert other is not None and other[0] == pytest.approx(2.0e-3) and "hidden=2048" in other[1]


def test_step_fixed_affine_fit(table: CalibrationTable) -> None:
    assert table.ds_step_fixed_time_s(10**8, 4, "zero3") == pytest.approx(0.103, rel=1e-12)  # exact row
    # Not measured: a + b * subgroups + c * elements with a = 1 ms, b = 0.5 ms, c = 1 ns.
    assert table.ds_step_fixed_time_s(2 * 10**9, 20, "zero3") == pytest.approx(1e-3 + 10e-3 + 2.0, rel=1e-9)
    assert table.ds_step_fixed_time_s(10**8, 4, "superoffload") is None


def test_worker_round_trip_affine(table: CalibrationTable) -> None:
    assert table.so_worker_time_s(10**7, "alone") == pytest.approx(200e-6 + 1e-2, rel=1e-9)
    # Beyond the largest size: the end segment's slope.
    assert table.so_worker_time_s(10**9, "with_copies") == pytest.approx(300e-6 + 2.0, rel=1e-9)
    assert table.so_worker_time_s(0, "alone") == pytest.approx(200e-6, rel=1e-6)


def test_superoffload_flush_affine(table: CalibrationTable) -> None:
    assert table.so_flush_time_s(5 * 10**7) == pytest.approx(1e-3 + 0.3e-9 * 5e7, rel=1e-9)
    assert table.so_flush_time_s(10**9) == pytest.approx(1e-3 + 0.3, rel=1e-9)  # the end segment's slope
    assert table.so_flush_time_s(10**8, "private") is None


def test_the_superoffload_plan_times_its_flush_as_measured() -> None:
    # On the calibrated H200 (so_grads rows): the fp32 copy of each flush is the measured whole flush minus the
    # bf16 round trip and the cast before it, so the four ops of a flush add up to the measured flush.
    from sosim.answers.validate_measured import read_runs, scenario_for
    from sosim.run.simulate import make_cost_model, simulate

    runs, _ = read_runs(Path(__file__).resolve().parents[1] / "calibration" / "nvidia-h200-2026-11-30b")
    run = next(r for r in runs if r.run_id == "1.1b-s2048-mb4-superoffload-clip0")
    sc = scenario_for(run, "h200-pcie-gen5-x86")
    res = simulate(sc)
    costs = make_cost_model(sc)
    ops = {op.name: op for op in res.plan.ops if op.iteration == res.plan.ops[-1].iteration}
    flushes = sorted(k.split(":")[1] for k in ops if k.startswith("grad_d2h_fp32:"))
    assert len(flushes) == 3  # 1.1B at reduce_bucket_size 5e8
    for flush in flushes:
        parts = sum(ops[f"{name}:{flush}"].duration_s
                    for name in ("grad_d2h_bf16", "grad_h2d_bf16", "grad_cast_fp32", "grad_d2h_fp32"))
        elements = ops[f"grad_d2h_bf16:{flush}"].n_bytes / 2
        measured = costs.so_flush_s(elements)
        assert measured is not None and parts == pytest.approx(measured, rel=1e-9)
        # The measured flush is slower than the plain copies would be (per-parameter pageable copies).
        assert measured > sum(ops[f"{name}:{flush}"].duration_s for name in ("grad_d2h_bf16", "grad_h2d_bf16"))


def test_collective_and_disk(table: CalibrationTable) -> None:
    assert table.collective_time_s("all_reduce", 8 * MIB, 2) == pytest.approx(8 * MIB / 75e9, rel=1e-12)
    assert table.collective_time_s("all_reduce", 8 * MIB, 4) is None  # GPU count not measured
    assert table.collective_time_s("all_gather", 8 * MIB, 2) is None  # kind not measured
    assert table.collective_time_s("all_reduce", 8 * MIB, 1) == 0.0
    # Read: 1 MiB per 4 ms; 1 GiB takes 1024 x 4 ms.
    assert table.disk_time_s(2**30, write=False) == pytest.approx(1024 * 4e-3, rel=1e-12)
    assert table.disk_time_s(2**30, write=True) == pytest.approx(1024 * 8e-3, rel=1e-12)
    # 512 KiB blocks: the rate halfway (in log size) between 128 KiB (128 KiB / 1 ms) and 1 MiB (1 MiB / 4 ms).
    log_sizes = [math.log(MIB // 8), math.log(MIB)]
    rate = float(np.interp(math.log(MIB / 2), log_sizes, [MIB // 8 / 1e-3, MIB / 4e-3]))
    assert table.disk_time_s(2**30, write=False, block_bytes=MIB / 2) == pytest.approx(2**30 / rate, rel=1e-12)
    assert table.disk_time_s(2**30, write=False, queue_depth=32) is None


# ---- the cost model: table first, analytic fallback -----------------------------------------------------------


@pytest.fixture
def analytic() -> AnalyticCostModel:
    from sosim.inputs.config import ModelSpec, TrainingSpec

    hw = load_profile("h200-pcie-gen5-x86").model_copy(update={"calibration": None})
    model = ModelSpec(layers=2, hidden=2048, heads=16, kv_heads=4, ffn=5632, ffn_kind="swiglu", vocab=32000)
    return AnalyticCostModel(hw, model, TrainingSpec(seq_len=2048, micro_batch=1), 2048)


def test_analytic_fallbacks_by_hand(analytic: AnalyticCostModel) -> None:
    hw = analytic.hw
    n = 1e8
    cast = n * 4 / (hw.cpu.cast_GBps * GB)  # all 16 cores
    first_touch = n * 2 / (c.FIRST_TOUCH_GBps_PER_CORE * GB * 16)
    pageable = 10e-6 + n * 2 / (hw.link.h2d_GBps * GB * hw.link.pageable_factor)
    assert analytic.ds_refresh_s(n, 16, pinned=False) == pytest.approx(cast + first_touch + pageable, rel=1e-12)
    pinned = 10e-6 + n * 2 / (hw.link.h2d_GBps * GB)
    assert analytic.ds_refresh_s(n, 16, pinned=True) == pytest.approx(cast + pinned, rel=1e-12)
    assert analytic.stage3_hook_s(2048, backward=True) == pytest.approx(9 * c.STAGE3_HOOK_S_PER_MODULE)
    # No host pass over the gradients (their norms are taken on the GPU): sync + per-sub-group, per-tensor and
    # per-step pieces, whatever the size.
    tensors = c.model_parameter_tensors(analytic.model)
    fixed = c.HOST_SYNC_S + 3 * c.DS_STEP_PER_SUBGROUP_S + c.DS_STEP_PER_STEP_S + tensors * c.DS_STEP_PER_TENSOR_S
    assert analytic.ds_step_fixed_s(n, 3, "zero3_offload") == pytest.approx(fixed, rel=1e-12)
    assert analytic.ds_step_fixed_s(10 * n, 3, "zero3_offload") == pytest.approx(fixed, rel=1e-12)
    assert analytic.so_worker_roundtrip_s(n) == pytest.approx(
        c.SO_WORKER_IPC_S + n * 16 / (hw.cpu.mem_GBps * GB), rel=1e-12
    )
    assert analytic.disk_s(1e9, write=False) == pytest.approx(c.NVME_LATENCY_S + 1e9 / 2.5e9)
    assert analytic.disk_s(1e9, write=True) == pytest.approx(c.NVME_LATENCY_S + 1e9 / 1.25e9)


def test_collectives_generalise_the_old_methods(analytic: AnalyticCostModel) -> None:
    from sosim.inputs.config import InterconnectSpec

    ic = InterconnectSpec(gpu_gpu_GBps=100, node_node_GBps=25, gpus_per_node=4, latency_us=5,
                          sources={"gpu_gpu_GBps": "t", "node_node_GBps": "t", "gpus_per_node": "t", "latency_us": "t"})
    a = AnalyticCostModel(analytic.hw.model_copy(update={"interconnect": ic}), analytic.model, analytic.training, 2048)
    n = 1e9
    assert a.collective_s("all_reduce", n, 4) == pytest.approx(5e-6 + 2 * 3 / 4 * n / 100e9)
    assert a.collective_s("all_gather", n, 8) == pytest.approx(5e-6 + 7 / 8 * n / 25e9)  # crosses nodes
    assert a.collective_s("all_to_all", n, 1) == 0.0
    with pytest.raises(ValueError, match="collective kind"):
        a.collective_s("broadcast", n, 4)  # type: ignore[arg-type]


def test_table_model_prefers_measurements(analytic: AnalyticCostModel, table: CalibrationTable) -> None:
    t = TableCostModel.from_analytic(analytic, table)
    assert t.ds_refresh_s(1e7, 16, pinned=False) == pytest.approx(2e-2)
    # SuperOffload's rows (keyed by the main thread's share, 4) answer whatever the pool's thread count.
    assert t.ds_refresh_s(1e7, 4, pinned=False, system="superoffload") == pytest.approx(5e-2)
    assert t.ds_refresh_s(1e7, 16, pinned=False, system="superoffload") == pytest.approx(5e-2)
    # A pinned staging path is not what the table timed: analytic.
    assert t.ds_refresh_s(1e7, 16, pinned=True) == analytic.ds_refresh_s(1e7, 16, pinned=True)
    assert t.stage3_hook_s(2048, backward=False) == pytest.approx(2.0e-3)
    assert t.stage3_hook_s(2048, backward=True) == pytest.approx(4.0e-3)
    assert t.ds_step_fixed_s(1e8, 4, "zero3_offload") == pytest.approx(0.103)
    assert t.ds_step_fixed_s(1e8, 4, "superoffload") == analytic.ds_step_fixed_s(1e8, 4, "superoffload")
    # The measured round trip minus the CPU Adam of the same elements at the worker's 12 threads (no cpu_adam
    # rows here: the analytic Adam).
    adam = analytic.cpu_adam_s(1e7, "cpu_adam", 12, 1e7)
    assert t.so_worker_roundtrip_s(1e7, with_copies=True) == pytest.approx(300e-6 + 2e-2 - adam)
    assert t.disk_s(2**30, write=False) == pytest.approx(1024 * 4e-3)
    assert t.collective_s("all_reduce", 8 * MIB, 2) == pytest.approx(8 * MIB / 75e9)
