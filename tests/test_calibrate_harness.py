"""The harness's pure helpers (no GPU): rows and CSV schema, DeepSpeed method timers, the isolated-child and
lockstep-rank runners, job parsing, the disk plan, SuperOffload's core split; torch-only parts skip without
torch."""

from __future__ import annotations

import csv
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sosim.calibrate import ds_bench, host_bench, isolate, multi_gpu
from sosim.calibrate.ds_timers import MethodTimers, fixed_part_s
from sosim.calibrate.records import COLUMNS, Context, Table, read_rows

ROOT = Path(__file__).resolve().parents[1]


def _table() -> Table:
    return Table(Context(device="dev", host_cpu="cpu", torch_version="t", date="2026-11-30"))


def test_new_columns_are_appended_and_filled() -> None:
    table = _table()
    table.add("nccl", "all_reduce", "bf16", [0.002, 0.001, 0.003], bytes=1024, gpus=2)
    row = table.rows[0]
    assert COLUMNS[-3:] == ("gpus", "subgroups", "layers")
    assert row["gpus"] == "2" and row["bytes"] == "1024" and row["subgroups"] == ""
    assert row["median_s"] == "0.002" and row["n_samples"] == "3"


def test_read_rows_accepts_a_file_written_before_the_new_columns(tmp_path: Path) -> None:
    old_columns = COLUMNS[: COLUMNS.index("date") + 1]
    path = tmp_path / "measurements.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(old_columns))
        writer.writeheader()
        writer.writerow({name: "" for name in old_columns} | {"op": "copy", "median_s": "0.5"})
    rows = read_rows(path)
    assert rows[0]["op"] == "copy" and rows[0]["gpus"] == "" and list(rows[0]) == list(COLUMNS)


def test_read_rows_refuses_other_columns(tmp_path: Path) -> None:
    path = tmp_path / "measurements.csv"
    path.write_text("op,variant,something\nx,y,z\n")
    with pytest.raises(ValueError, match="columns differ"):
        read_rows(path)


class _FakeOptimizer:
    """Mimics the call structure of DeepSpeed's stage-3 step(): step -> sub-group methods."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def _advance(self, seconds: float) -> None:
        self.clock[0] += seconds

    def step(self) -> None:
        self._advance(0.01)
        for _ in range(3):
            self._optimizer_step()
            self._reassign_or_swap_out_partitioned_parameters()
        self._wait_for_async_operations()

    def _optimizer_step(self) -> None:
        self._advance(0.1)

    def _reassign_or_swap_out_partitioned_parameters(self) -> None:
        self._advance(0.05)

    def _wait_for_async_operations(self) -> None:
        self._advance(0.2)


def test_method_timers_sum_per_step_and_fixed_part() -> None:
    clock = [0.0]
    optimizer = _FakeOptimizer(clock)
    timers = MethodTimers(clock=lambda: clock[0])
    wrapped = timers.wrap(optimizer)
    assert set(wrapped) == {
        "step",
        "_optimizer_step",
        "_reassign_or_swap_out_partitioned_parameters",
        "_wait_for_async_operations",
    }
    optimizer.step()
    taken = timers.take()
    assert taken["opt_step"][0] == pytest.approx(0.01 + 3 * 0.15 + 0.2)
    assert taken["optimizer"] == (pytest.approx(0.3), 3)
    assert taken["refresh"] == (pytest.approx(0.15), 3)
    # fixed = step - wait - optimizer - refresh = the 0.01 s of bookkeeping
    assert fixed_part_s(taken) == pytest.approx(0.01)
    assert timers.take()["opt_step"] == (0.0, 0)  # reset by take()


def test_method_timers_count_a_recursive_call_once() -> None:
    clock = [0.0]

    class Recursive:
        def step(self, depth: int = 2) -> None:
            clock[0] += 1.0
            if depth:
                self.step(depth - 1)

    obj = Recursive()
    timers = MethodTimers(clock=lambda: clock[0])
    timers.wrap(obj, ("step",))
    obj.step()
    assert timers.take()["opt_step"] == (pytest.approx(3.0), 1)


def test_superoffload_split_matches_deepspeed_rule() -> None:
    # SuperOffloadCPUOptimizer._set_cpu_affinity: split = int((1 - 0.8) * n)
    main, worker = ds_bench.superoffload_split(list(range(16)))
    assert main == [0, 1, 2] and worker == list(range(3, 16))
    main, worker = ds_bench.superoffload_split(list(range(32)))
    assert len(main) == 6 and len(worker) == 26


def test_thread_affinities_reads_this_process() -> None:
    threads = ds_bench.thread_affinities()
    if not Path("/proc/self/task").exists():
        pytest.skip("no /proc")
    assert threads and all(t["cpus_allowed_list"] for t in threads)


def emit_squares(emit: isolate.Emit, count: int, fail: bool) -> None:
    for index in range(count):
        emit(("op", "v", "fp32", [float(index * index)], {"elements": index}))
    if fail:
        raise RuntimeError("planted failure")


def sleep_forever(emit: isolate.Emit, marker: str = "") -> None:
    emit(("op", "v", "fp32", [1.0], {}))
    if marker:
        # emit is the queue's put: close and join its feeder thread, so the row is in the pipe before the
        # marker tells the test's clock that the child is now hung.
        results = emit.__self__  # type: ignore[attr-defined]
        results.close()
        results.join_thread()
        Path(marker).write_text("row emitted")
    time.sleep(600)


def test_run_isolated_streams_rows_and_reports_failures() -> None:
    rows, problem = isolate.run_isolated(emit_squares, {"count": 3, "fail": False}, timeout_s=60)
    assert problem == "" and [r[3] for r in rows] == [[0.0], [1.0], [4.0]]
    rows, problem = isolate.run_isolated(emit_squares, {"count": 2, "fail": True}, timeout_s=60)
    assert len(rows) == 2 and "planted failure" in problem


def test_run_isolated_kills_a_hung_child_and_keeps_its_rows(tmp_path: Path) -> None:
    # A deterministic clock: time stands still until the child has emitted its row and hung, then jumps past
    # the deadline. A slow spawn on a loaded machine can no longer time the child out before its row (the
    # flake this test had with a 3 s wall-clock timeout).
    marker = tmp_path / "hung"

    def clock() -> float:
        return 1e9 if marker.exists() else 0.0

    rows, problem = isolate.run_isolated(sleep_forever, {"marker": str(marker)}, timeout_s=3, clock=clock)
    assert "timed out" in problem and len(rows) == 1


def lockstep_rank(rank: int, ranks: int, barrier: Any, emit: Any, say: Any, fail_rank: int) -> None:
    if rank == fail_rank:
        raise RuntimeError("rank failure")
    times = multi_gpu._lockstep(barrier, rank == 0, lambda: time.sleep(0.01), 3, lambda: None)
    if rank == 0:
        emit(("op", "v", "fp32", times, {"gpus": ranks}))
    say(f"rank {rank} done")


def test_run_ranks_lockstep_and_failure() -> None:
    rows, problem = multi_gpu.run_ranks(lockstep_rank, 2, {"fail_rank": -1}, timeout_s=60, log=sys.stderr)
    assert problem == "" and len(rows) == 1
    times = rows[0][3]
    assert len(times) == 3 and all(t >= 0.009 for t in times)
    rows, problem = multi_gpu.run_ranks(lockstep_rank, 2, {"fail_rank": 1}, timeout_s=60, log=sys.stderr)
    assert "rank failure" in problem


def test_nccl_sizes_and_bus_factor() -> None:
    sizes = multi_gpu.nccl_sizes_bytes(quick=False)
    assert sizes[0] == 1024 and sizes[-1] == 1 << 30 and len(sizes) == 11
    assert multi_gpu.bus_factor("all_reduce", 2) == 1.0
    assert multi_gpu.bus_factor("all_gather", 2) == 0.5
    assert multi_gpu.bus_factor("all_reduce", 8) == pytest.approx(1.75)


def test_disk_split_blocks_covers_every_block_once() -> None:
    plan = host_bench.split_blocks(10, 4)
    assert sorted(i for part in plan for i in part) == list(range(10))
    assert plan[0] == [0, 4, 8]


def test_disk_pass_reads_and_writes_a_real_file(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\0" * (4 << 20))
    try:
        per_block_s = host_bench._direct_pass(path, 1 << 20, 2, 4 << 20, write=True)
        per_block_s += host_bench._direct_pass(path, 1 << 20, 2, 4 << 20, write=False)
    except OSError as error:  # a filesystem without O_DIRECT (tmpfs)
        pytest.skip(f"O_DIRECT not supported here: {error}")
    assert per_block_s > 0


def _load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_all_job_parsing() -> None:
    run_all = _load_script("ds_run_all")
    argv = run_all.job_argv("0.5b:2048:4:superoffload:ratio=0.5:ckpt=0:phased=2", Path("/o"))
    assert argv[1].endswith("ds_train_step.py")
    assert argv[argv.index("--ratio") + 1] == "0.5" and "--no-ckpt" in argv
    assert argv[argv.index("--phased-steps") + 1] == "2"
    argv = run_all.job_argv("1.1b:2048:4:zero3:gpus=2", Path("/o"))
    assert argv[1:4] == ["-m", "deepspeed.launcher.runner", "--num_gpus"] and argv[4] == "2"
    assert run_all.job_timeout_s("1.1b:2048:4:zero3:timeout=90", 150.0) == 90.0
    with pytest.raises(ValueError, match="unknown option"):
        run_all.parse_job("1.1b:2048:4:zero3:bogus=1")


def test_train_step_run_ids_and_parser() -> None:
    train = _load_script("ds_train_step")
    args = train.build_parser().parse_args(
        ["--config", "superoffload", "--size", "0.5b", "--ratio", "0.9", "--no-ckpt", "--out", "/o", "--local_rank=1"]
    )
    assert train.run_id_for(args, 2) == "0.5b-s2048-mb4-superoffload-clip0-ratio0.9-nockpt-gpus2"
    assert args.steps >= 10
    config = train.ds_config("superoffload", 4, 1.0, int(1e8), 0.5, 0.8)
    offload = config["zero_optimization"]["offload_optimizer"]
    assert offload == {
        "device": "cpu",
        "pin_memory": True,
        "super_offload": True,
        "ratio": 0.5,
        "cpuadam_cores_perc": 0.8,
    }
    assert config["gradient_clipping"] == 1.0


@pytest.mark.device
def test_quantize_round_trip_error() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(4 * host_bench.QUANT_GROUP).to(torch.bfloat16)
    for bits, bound in ((8, 0.02), (4, 0.3)):
        q, scale = host_bench.quantize_int(torch, x, bits)
        assert q.numel() == x.numel() // (2 if bits == 4 else 1)
        back = host_bench.dequantize_int(torch, q, scale, bits)
        error = float((back.float() - x.float()).norm() / x.float().norm())
        assert error < bound


@pytest.mark.device
def test_int4_packing_is_exact_on_representable_values() -> None:
    torch = pytest.importorskip("torch")
    # Values that are exact multiples of the group's scale come back exactly (sign extension of nibbles).
    levels = torch.tensor([-7.0, -1.0, 0.0, 3.0, 7.0, -7.0, 5.0, -3.0]).repeat(host_bench.QUANT_GROUP // 8)
    q, scale = host_bench.quantize_int(torch, levels.to(torch.bfloat16), 4)
    back = host_bench.dequantize_int(torch, q, scale, 4).float()
    assert torch.equal(back, levels)


@pytest.mark.device
def test_train_step_floor_smoke_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    train = _load_script("ds_train_step")
    code = train.main(
        [
            "--config",
            "floor",
            "--size",
            "1.1b",
            "--tiny",
            "--device",
            "cpu",
            "--seq",
            "32",
            "--micro-batch",
            "1",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--phased-steps",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "deepspeed_steps.csv").open()))
    assert [r["timing"] for r in rows] == ["unsynced", "phased"]
    assert float(rows[1]["fwd_median_s"]) > 0 and rows[0]["n_steps"] == "2"
    assert (tmp_path / "runs" / "tiny-s32-mb1-floor.rank0.affinity.json").exists()


def test_committed_2026_11_30_tables_load_with_the_reader() -> None:
    """The new measurements.csv files (with the appended columns) load in the simulator's reader, and the
    DeepSpeed runs all carry >= 10 timed steps and the timer columns."""
    from sosim.costs.calibration_table import CalibrationTable

    for folder in ("nvidia-h200-2026-11-30", "nvidia-h200x2-2026-11-30"):
        path = ROOT / "calibration" / folder / "measurements.csv"
        table = CalibrationTable.from_csv(path)
        assert table.sha256
        rows = list(csv.DictReader(path.open()))
        assert list(rows[0])[-3:] == ["gpus", "subgroups", "layers"]
        steps = list(csv.DictReader((ROOT / "calibration" / folder / "deepspeed_steps.csv").open()))
        unsynced = [r for r in steps if r["timing"] == "unsynced"]
        assert unsynced and all(int(r["n_steps"]) >= 10 for r in unsynced)
        assert all(r["t_opt_step_s"] for r in unsynced)
    h200 = ROOT / "calibration" / "nvidia-h200-2026-11-30" / "measurements.csv"
    ops = {(r["op"], r["variant"]) for r in csv.DictReader(h200.open())}
    for wanted in [
        ("ds_refresh", "zero3"),
        ("ds_refresh", "superoffload"),
        ("layer", "z3_fwd_bwd"),
        ("layer", "hf_fwd"),
        ("ds_step_fixed", "zero3"),
        ("ds_step_fixed", "superoffload"),
        ("so_worker", "alone"),
        ("so_worker", "with_copies"),
        ("disk", "read_direct"),
    ]:
        assert wanted in ops, wanted


def test_the_step_script_reads_affinities_with_the_harness_reader() -> None:
    # scripts/ds_train_step.py loads sosim/calibrate/affinity.py on its own (no package imports on the GPU
    # machine); it must read what the harness's reader reads.
    path = Path(__file__).resolve().parents[1] / "scripts" / "ds_train_step.py"
    spec = importlib.util.spec_from_file_location("ds_train_step_for_test", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    try:
        spec.loader.exec_module(script)
        standalone = script.load_calibrate_module("affinity").thread_affinities
        mine = [t["tid"] for t in ds_bench.thread_affinities()]
        theirs = [t["tid"] for t in standalone()]
        assert mine and set(mine) & set(theirs)
        assert {t["cpus_allowed_list"] for t in standalone()} == {t["cpus_allowed_list"] for t in
                                                                 ds_bench.thread_affinities()}
    finally:
        sys.modules.pop(spec.name, None)
