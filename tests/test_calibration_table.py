"""CalibrationTable: exact values interpolated by hand from a tiny synthetic CSV, fallbacks, bad files."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sosim.costs.calibration_table import CalibrationError, CalibrationTable

HEADER = (
    "op,variant,dtype,m,n,k,batch,seq,heads,kv_heads,head_dim,hidden,ffn,bytes,elements,threads,"
    "median_s,p10_s,p90_s,n_samples,device,host_cpu,torch_version,date"
)
MIB = 2**20
W1 = 1 * 16 * 1024**2 * 128  # attention work batch*heads*seq^2*head_dim at seq 1024


def row(op: str, variant: str, median_s: float, header: str = HEADER, **cells: float) -> str:
    """One CSV line of ``header``'s columns: the given cells, the rest empty."""
    names = header.split(",")
    values = {name: "" for name in names}
    values.update(op=op, variant=variant, dtype="bf16", median_s=repr(median_s), n_samples="5", device="test")
    values.update({key: repr(value) if isinstance(value, float) else str(value) for key, value in cells.items()})
    return ",".join(values[name] for name in names)


ROWS = [
    # GEMM: 100 TFLOP/s at m=1024, 300 TFLOP/s at m=4096 (same 1024x1024 weight).
    row("gemm", "fwd", 2 * 1024**3 / 100e12, m=1024, n=1024, k=1024),
    row("gemm", "fwd", 2 * 4096 * 1024**2 / 300e12, m=4096, n=1024, k=1024),
    # Attention forward: seq 1024 in 1e-4 s; seq 4096 (16x the work) in 8e-4 s (twice the rate).
    row("attention", "fwd", 1e-4, batch=1, seq=1024, heads=16, kv_heads=16, head_dim=128),
    row("attention", "fwd", 8e-4, batch=1, seq=4096, heads=16, kv_heads=16, head_dim=128),
    # Layer forward+backward at hidden 2048, seq 2048: batch 1 and 4.
    row("layer", "fwd_bwd", 0.001, batch=1, seq=2048, heads=16, kv_heads=4, head_dim=128, hidden=2048, ffn=5632),
    row("layer", "fwd_bwd", 0.0031, batch=4, seq=2048, heads=16, kv_heads=4, head_dim=128, hidden=2048, ffn=5632),
    # Pinned H2D: 20, 40, 50 GB/s at 1, 4, 16 MiB.
    row("copy", "h2d_pinned", MIB / 20e9, bytes=MIB),
    row("copy", "h2d_pinned", 4 * MIB / 40e9, bytes=4 * MIB),
    row("copy", "h2d_pinned", 16 * MIB / 50e9, bytes=16 * MIB),
    # DeepSpeed CPU Adam: 1 ns/param at 1e6 and 3 ns/param at 1e8 on 1 thread; 4x faster on 4 threads.
    row("cpu_adam", "deepspeed", 1e-3, elements=10**6, threads=1),
    row("cpu_adam", "deepspeed", 0.3, elements=10**8, threads=1),
    row("cpu_adam", "deepspeed", 2.5e-4, elements=10**6, threads=4),
    row("cpu_adam", "deepspeed", 0.075, elements=10**8, threads=4),
    # Casts: CPU at 2 threads 0.5 ns/element; GPU 10 ps/element at 1e6, 1 ps/element at 1e8.
    row("cast", "cpu_fp32_to_bf16", 5e-4, elements=10**6, threads=2, bytes=6 * 10**6),
    row("cast", "cpu_fp32_to_bf16", 0.05, elements=10**8, threads=2, bytes=6 * 10**8),
    row("cast", "gpu_bf16_to_fp32", 1e-5, elements=10**6, bytes=6 * 10**6),
    row("cast", "gpu_bf16_to_fp32", 1e-4, elements=10**8, bytes=6 * 10**8),
]


def write(tmp_path: Path, lines: list[str], header: str = HEADER, name: str = "measurements.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


@pytest.fixture
def table(tmp_path: Path) -> CalibrationTable:
    return CalibrationTable.from_csv(write(tmp_path, ROWS))


def test_hash_and_path_identify_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, ROWS)
    loaded = CalibrationTable.from_csv(path)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.path == path
    assert pickle.loads(pickle.dumps(loaded)).gemm_time_s(1024, 1024, 1024) == loaded.gemm_time_s(1024, 1024, 1024)


def test_gemm_exact_interpolated_flat_and_fallback(table: CalibrationTable) -> None:
    assert table.gemm_time_s(1024, 1024, 1024) == pytest.approx(2 * 1024**3 / 100e12, rel=1e-12)
    # m=2048 sits halfway in log FLOPs between the two points: 200 TFLOP/s.
    assert table.gemm_time_s(2048, 1024, 1024) == pytest.approx(2 * 2048 * 1024**2 / 200e12, rel=1e-12)
    # Beyond the largest measured FLOPs the rate stays at 300 TFLOP/s.
    assert table.gemm_time_s(8192, 1024, 1024) == pytest.approx(2 * 8192 * 1024**2 / 300e12, rel=1e-12)
    # A weight within 2x borrows the nearest shapes' rate: (2048, 2048, 1024) has the FLOPs of m=4096.
    assert table.gemm_time_s(2048, 2048, 1024) == pytest.approx(2 * 2048 * 2048 * 1024 / 300e12, rel=1e-12)
    assert table.gemm_time_s(512, 1024, 1024) is None  # thinner than anything measured
    assert table.gemm_time_s(4096, 8192, 1024) is None  # weight shape far from any measured one
    assert table.gemm_time_s(0, 1024, 1024) == 0.0


def test_attention(table: CalibrationTable) -> None:
    assert table.attention_time_s(1, 1024, 16, 128, backward=False) == pytest.approx(1e-4, rel=1e-12)
    # seq 2048 = 4x the work, halfway in log work: rate 1.5x that of seq 1024.
    assert table.attention_time_s(1, 2048, 16, 128, backward=False) == pytest.approx(4 * 1e-4 / 1.5, rel=1e-12)
    assert table.attention_time_s(1, 8192, 16, 128, backward=False) == pytest.approx(64 * W1 / (2 * W1 / 1e-4))
    assert table.attention_time_s(1, 2048, 16, 64, backward=False) is None  # other head_dim
    assert table.attention_time_s(1, 2048, 16, 128, backward=True) is None  # fwd_bwd not measured
    assert table.attention_time_s(1, 512, 16, 128, backward=False) is None  # less work than measured


def test_layer_only_near_measured_shapes(table: CalibrationTable) -> None:
    assert table.layer_time_s(2048, 2048, 4, backward=True) == pytest.approx(0.0031, rel=1e-12)
    assert table.layer_time_s(2048, 2048, 2, backward=True) == pytest.approx(0.0017, rel=1e-12)
    assert table.layer_time_s(2048, 2048, 8, backward=True) is None
    assert table.layer_time_s(4096, 2048, 1, backward=True) is None
    assert table.layer_time_s(2048, 2048, 1, backward=False) is None


def test_copy_bandwidth_interpolation(table: CalibrationTable) -> None:
    assert table.copy_time_s(MIB, "h2d", pinned=True, bidirectional=False) == pytest.approx(MIB / 20e9, rel=1e-12)
    # 2 MiB is halfway in log size between 1 and 4 MiB: 30 GB/s.
    assert table.copy_time_s(2 * MIB, "h2d", True, False) == pytest.approx(2 * MIB / 30e9, rel=1e-12)
    assert table.copy_time_s(2**30, "h2d", True, False) == pytest.approx(2**30 / 50e9, rel=1e-12)  # flat
    assert table.copy_time_s(MIB // 2, "h2d", True, False) is None  # below the smallest size
    assert table.copy_time_s(MIB, "d2h", True, False) is None  # direction not measured
    assert table.copy_time_s(MIB, "h2d", False, False) is None  # pageable not measured
    assert table.copy_time_s(MIB, "h2d", False, True) is None  # pageable bidirectional never is
    assert table.copy_time_s(0, "h2d", True, False) == 0.0
    with pytest.raises(ValueError, match="direction"):
        table.copy_time_s(MIB, "up", True, False)  # type: ignore[arg-type]


def test_cpu_adam_in_size_and_threads(table: CalibrationTable) -> None:
    assert table.cpu_adam_time_s(10**8, 1, "deepspeed") == pytest.approx(0.3, rel=1e-12)
    # 1e7 is halfway in log size: 2 ns/param.
    assert table.cpu_adam_time_s(10**7, 1, "deepspeed") == pytest.approx(0.02, rel=1e-12)
    assert table.cpu_adam_time_s(10**9, 1, "deepspeed") == pytest.approx(3.0, rel=1e-12)  # flat per element
    # 2 threads: throughput linear between 1/3e-9 (1 thread) and 1/0.75e-9 (4 threads) = 2/3e-9 params/s.
    assert table.cpu_adam_time_s(10**8, 2, "deepspeed") == pytest.approx(0.15, rel=1e-12)
    assert table.cpu_adam_time_s(10**8, 8, "deepspeed") is None  # more threads than measured
    assert table.cpu_adam_time_s(10**5, 1, "deepspeed") is None  # smaller than measured
    assert table.cpu_adam_time_s(10**8, 1, "torch") is None  # implementation not measured
    assert table.cpu_adam_time_s(0, 1, "deepspeed") == 0.0


def test_casts(table: CalibrationTable) -> None:
    assert table.cast_time_s(10**7, "cpu", "bf16", threads=2) == pytest.approx(5e-3, rel=1e-12)
    assert table.cast_time_s(10**7, "cpu", "bf16", threads=None) == pytest.approx(5e-3, rel=1e-12)
    assert table.cast_time_s(10**7, "cpu", "bf16", threads=1) is None
    assert table.cast_time_s(10**7, "cpu", "fp32", threads=2) is None
    # GPU: 10 ps and 1 ps per element at 1e6 and 1e8, so 5.5 ps halfway at 1e7.
    assert table.cast_time_s(10**7, "gpu", "fp32", threads=None) == pytest.approx(5.5e-5, rel=1e-12)


def test_duplicate_n_header_is_read_as_sample_count(tmp_path: Path) -> None:
    header = HEADER.replace("n_samples", "n")
    loaded = CalibrationTable.from_csv(write(tmp_path, ROWS, header=header))
    assert loaded.gemm_time_s(1024, 1024, 1024) == pytest.approx(2 * 1024**3 / 100e12, rel=1e-12)


def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(CalibrationError, match=r"nope\.csv: calibration file not found"):
        CalibrationTable.from_csv(missing)


def test_empty_and_header_only_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(CalibrationError, match=r"empty\.csv: calibration file is empty"):
        CalibrationTable.from_csv(empty)
    with pytest.raises(CalibrationError, match=r"header\.csv: calibration file has a header but no rows"):
        CalibrationTable.from_csv(write(tmp_path, [], name="header.csv"))


def test_missing_columns_are_named(tmp_path: Path) -> None:
    header = HEADER.replace(",median_s", "").replace(",threads", "")
    lines = [",".join(["gemm", "fwd"] + [""] * (len(header.split(",")) - 2))]
    with pytest.raises(CalibrationError, match=r"measurements\.csv: missing column\(s\) threads, median_s"):
        CalibrationTable.from_csv(write(tmp_path, lines, header=header))


def test_non_numeric_timing_names_line_and_column(tmp_path: Path) -> None:
    bad = ROWS[1].replace(repr(2 * 4096 * 1024**2 / 300e12), "fast")
    with pytest.raises(CalibrationError, match=r"measurements\.csv: line 3: column median_s: 'fast' is not a number"):
        CalibrationTable.from_csv(write(tmp_path, [ROWS[0], bad]))


def test_negative_and_zero_timings_and_sizes(tmp_path: Path) -> None:
    negative = row("gemm", "fwd", -1.0, m=1024, n=1024, k=1024)
    with pytest.raises(CalibrationError, match=r"line 2: column median_s: -1.0 must be positive"):
        CalibrationTable.from_csv(write(tmp_path, [negative]))
    zero = row("gemm", "fwd", 0.0, m=1024, n=1024, k=1024)
    with pytest.raises(CalibrationError, match=r"line 2: column median_s: 0.0 must be positive"):
        CalibrationTable.from_csv(write(tmp_path, [zero]))
    negative_size = row("gemm", "fwd", 1e-3, m=-5, n=1024, k=1024)
    with pytest.raises(CalibrationError, match=r"line 2: column m: -5 must not be negative"):
        CalibrationTable.from_csv(write(tmp_path, [negative_size]))
    empty_median = ROWS[0].replace(repr(2 * 1024**3 / 100e12), "")
    with pytest.raises(CalibrationError, match=r"line 2: column median_s is empty"):
        CalibrationTable.from_csv(write(tmp_path, [empty_median]))
    not_finite = row("copy", "h2d_pinned", 1e-3, bytes=MIB).replace(",5,test", ",nan,test")
    with pytest.raises(CalibrationError, match=r"line 2: column n_samples: 'nan' is not finite"):
        CalibrationTable.from_csv(write(tmp_path, [not_finite]))


def test_negative_query_is_a_programming_error(table: CalibrationTable) -> None:
    with pytest.raises(ValueError, match="m must not be negative"):
        table.gemm_time_s(-1, 1024, 1024)


def test_real_h200_table_loads_and_answers() -> None:
    """The committed H200 calibration must stay loadable; spot-check one number of each op against its row."""
    path = Path(__file__).resolve().parents[1] / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv"
    loaded = CalibrationTable.from_csv(path)
    assert loaded.gemm_time_s(8192, 4096, 4096) == pytest.approx(0.000402624011, rel=1e-9)
    assert loaded.copy_time_s(2**30, "h2d", pinned=True, bidirectional=False) == pytest.approx(0.0193479195)
    assert loaded.cpu_adam_time_s(10**8, 16, "deepspeed") == pytest.approx(0.02656596, rel=1e-6)
    assert loaded.layer_time_s(4096, 2048, 4, backward=True) is not None


def test_calibrate_cli_without_torch_or_gpu_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On CI (no GPU, maybe no torch) the harness exits 2 with one line on stderr and writes nothing."""
    from sosim.calibrate.cli import main

    assert main(["--quick", "--out", str(tmp_path / "cal")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("sosim calibrate: ")
    assert not (tmp_path / "cal").exists()


def test_harness_rows_use_the_columns_the_reader_expects(tmp_path: Path) -> None:
    """The harness's CSV writer (torch-free part) produces files this reader loads."""
    from sosim.calibrate.records import COLUMNS, Context, Table

    # The 2026-11-30 sections append columns (gpus, subgroups, layers) after the original ones.
    assert ",".join(COLUMNS).startswith(HEADER + ",")
    written = Table(Context(device="dev", host_cpu="cpu", torch_version="x", date="2026-11-29"))
    written.add("copy", "h2d_pinned", "bf16", [2e-3, 1e-3, 3e-3], bytes=MIB)
    written.write_csv(tmp_path / "measurements.csv")
    loaded = CalibrationTable.from_csv(tmp_path / "measurements.csv")
    assert loaded.copy_time_s(MIB, "h2d", pinned=True, bidirectional=False) == pytest.approx(2e-3)


# ---- prepared curves (issue 17): a warm table answers exactly what a cold one computes -----------------------

# Ops read without a prepared curve (exact rows, an affine fit) or not by the cost model at all.
NOT_CURVE_OPS = frozenset(("host_mem", "quantize", "z2_flush", "so_fp32_d2h", "ds_step_fixed"))
SHIPPED_TABLES = sorted((Path(__file__).resolve().parents[1] / "calibration").glob("**/measurements.csv"))


def _first(cols: dict[str, np.ndarray], name: str, i: int) -> float | None:
    value = float(cols[name][i]) if name in cols else math.nan
    return value if math.isfinite(value) else None


Lookup = Callable[[CalibrationTable], object]


def _row_queries(op: str, variant: str, cols: dict[str, np.ndarray], i: int) -> list[Lookup]:
    """Lookups at row i's point and off it (between and beyond the measured sizes, other thread counts)."""
    get = functools.partial(_first, cols, i=i)
    out: list[Lookup] = []
    m, n, k, size, elements = get("m"), get("n"), get("k"), get("bytes"), get("elements")
    threads = get("threads")
    bidir, direction = variant.startswith("bidir"), ("h2d" if "h2d" in variant else "d2h")
    where, to = variant.split("_")[0], ("bf16" if variant.endswith("bf16") else "fp32")
    for f in (1.0, 0.7, 1.5, 3.0):
        if op == "gemm" and m and n and k:
            out.append(lambda t, f=f: t.gemm_time_s(int(m * f), int(n), int(k)))
        if op == "attention" and all(get(c) for c in ("batch", "seq", "heads", "head_dim")):
            out.append(lambda t, f=f: t.attention_time_s(int(get("batch") * f) or 1, int(get("seq")),
                                                         int(get("heads")), int(get("head_dim")), variant == "fwd_bwd"))
        if op == "copy" and size:
            out.append(lambda t, f=f: t.copy_time_s(size * f, direction, "pinned" in variant, bidir))
        if op == "nccl" and size and get("gpus"):
            out.append(lambda t, f=f: t.collective_time_s(variant, size * f, int(get("gpus"))))
        if op == "disk" and size:
            out.append(lambda t, f=f: t.disk_time_s(8 * size, variant == "write_direct", size * f,
                                                    None if threads is None else int(threads)))
        if elements is None:
            continue
        for th in {threads, None if threads is None else threads + 0.5, 4.0}:
            if op == "cpu_adam" and th is not None and variant in ("torch", "deepspeed"):
                out.append(lambda t, f=f, th=th: t.cpu_adam_time_s(elements * f, th, variant))
            if op == "cpu_adam" and th is not None and variant.startswith("torch_"):  # torch AdamW by implementation
                out.append(lambda t, f=f, th=th: t.cpu_adam_variant_time_s(elements * f, th, variant))
            if op == "ds_refresh" and th is not None:
                out.append(lambda t, f=f, th=th: t.ds_refresh_time_s(elements * f, th, variant))
        if op == "cast" and "_shared" not in variant:
            out.append(lambda t, f=f: t.cast_time_s(elements * f, where, to, threads))
            out.append(lambda t, f=f: t.cast_time_s(elements * f, where, to, None))
        if op in ("so_worker", "so_flush"):
            out.append(lambda t, f=f: t._affine_in_elements(op, variant, elements * f))
    if op == "layer" and all(get(c) for c in ("hidden", "seq", "batch")):
        engine, backward = variant.removesuffix("_fwd_bwd").removesuffix("_fwd"), variant.endswith("fwd_bwd")
        engine = "" if engine in ("fwd", "fwd_bwd") else engine
        for b in (get("batch"), get("batch") + 0.5):
            out.append(lambda t, b=b: t.layer_time_s(int(get("hidden")), int(get("seq")), b, backward,
                                                     heads=None if get("heads") is None else int(get("heads")),
                                                     engine=engine))
        if variant.startswith("z3_fwd") and all(get(c) for c in ("heads", "kv_heads", "ffn")):
            for tokens in (get("seq") * get("batch"), 3 * get("seq")):
                out.append(lambda t, tk=tokens: t.stage3_hook_time_s(
                    int(get("hidden")), int(get("heads")), int(get("kv_heads")), int(get("ffn")), int(tk), True))
    return out


@pytest.mark.parametrize("path", SHIPPED_TABLES, ids=lambda p: p.parent.name + "/" + p.name)
def test_warm_lookups_equal_a_cold_table_bit_for_bit(path: Path) -> None:
    """Every op of every shipped table: repeated lookups on one table (its prepared curves filled by all the
    others) return exactly the float a fresh table (nothing prepared) computes for that lookup alone."""
    warm = CalibrationTable.from_csv(path)
    queries = [q for (op, variant), cols in sorted(warm.columns_by_op.items())
               for i in range(len(cols["median_s"])) for q in _row_queries(op, variant, dict(cols), i)]
    if not queries:  # a table of ops no cached lookup reads (a warm-up session's host_mem rows)
        assert {op for op, _ in warm.columns_by_op} <= NOT_CURVE_OPS, path
        return
    cold = [q(dataclasses.replace(warm)) for q in queries]  # a new table object: an empty cache per lookup
    first = [q(warm) for q in queries]
    again = [q(warm) for q in reversed(queries)][::-1]
    assert first == cold and again == cold
    assert sum(v is not None for v in cold) > len(cold) // 4  # the lookups mostly answer, not fall back
    assert len(warm._prepared) > 0


def test_sampled_and_quantile_tables_prepare_their_own_curves() -> None:
    """A table drawn from a warm one must not answer from the warm one's curves (their timings differ)."""
    warm = CalibrationTable.from_csv(SHIPPED_TABLES[0])
    query = (2**30, "h2d", True, False)
    base = warm.copy_time_s(*query)
    assert base is not None and len(warm._prepared) > 0
    slow = warm.at_quantile(0.9)
    assert len(slow._prepared) == 0
    slow_s = slow.copy_time_s(*query)
    assert slow_s is not None and slow_s > base
    assert slow_s == dataclasses.replace(slow).copy_time_s(*query)
    drawn, _ = warm.sampled(np.random.default_rng(7))
    assert drawn._prepared is not warm._prepared and len(drawn._prepared) == 0
    assert drawn.copy_time_s(*query) == dataclasses.replace(drawn).copy_time_s(*query)
    assert warm.copy_time_s(*query) == base
