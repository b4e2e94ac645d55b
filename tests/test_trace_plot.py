"""Chrome trace structure and the matplotlib figures (files written, CLI flags)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sosim import load_scenario, simulate
from sosim.cli import main
from sosim.formats.plot import plot_compare, plot_result, time_unit
from sosim.formats.trace import RESOURCE_LABELS, activation_curve_bytes, chrome_trace, write_trace
from sosim.inputs.units import GIB
from sosim.run.result import Result

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def result() -> Result:
    root = Path(__file__).resolve().parent.parent
    return simulate(load_scenario(root / "scenarios/gh200_zero_offload_4b.yaml", ["model.layers=4"]))


def _events(trace: dict, ph: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_trace_is_valid_json_with_one_named_track_per_resource(result: Result, tmp_path: Path) -> None:
    path = write_trace(result, tmp_path / "sub" / "t.json")
    trace = json.loads(path.read_text())
    names = {e["tid"]: e["args"]["name"] for e in _events(trace, "M") if e["name"] == "thread_name"}
    resources = set(result.spans["resource"])
    assert len(names) == len(resources)
    assert set(names.values()) == {RESOURCE_LABELS[r] for r in resources}
    assert names[1] == "GPU compute"  # GPU compute is the top track


def test_one_complete_event_per_op_in_microseconds(result: Result) -> None:
    trace = chrome_trace(result)
    xs = _events(trace, "X")
    assert len(xs) == len(result.plan.ops)
    tid_of = {e["args"]["name"]: e["tid"] for e in _events(trace, "M") if e["name"] == "thread_name"}
    spans = result.spans
    for e, row in zip(xs, spans.itertuples()):
        assert e["name"] == row.op
        assert e["tid"] == tid_of[RESOURCE_LABELS[row.resource]]
        assert e["ts"] == pytest.approx(row.start_s * 1e6)
        assert e["dur"] == pytest.approx((row.end_s - row.start_s) * 1e6)
        op = result.plan.ops[row.Index]
        assert e["args"] == {"layer": row.layer, "iteration": row.iteration, "category": row.category,
                             "phase": row.phase, "bytes": op.n_bytes, "flops": op.flops, "group": op.group}
    # The last op ends where the simulation ends, in microseconds.
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(spans["end_s"].max() * 1e6)


def test_iteration_markers_and_memory_counters(result: Result) -> None:
    trace = chrome_trace(result)
    instants = _events(trace, "i")
    starts = sorted(e["ts"] for e in instants if e["name"].startswith("iteration "))
    assert starts == pytest.approx(sorted(result.start_s[result.plan.iteration_starts] * 1e6))
    counters = _events(trace, "C")
    gpu = [e for e in counters if e["name"].startswith("GPU memory")]
    cpu = [e for e in counters if e["name"].startswith("CPU memory")]
    assert gpu and cpu
    peak_gib = max(e["args"]["static"] + e["args"]["activations"] for e in gpu)
    assert peak_gib == pytest.approx(result.memory.gpu_peak_bytes / GIB)
    assert sum(cpu[0]["args"].values()) == pytest.approx(result.memory.cpu_peak_bytes / GIB)


def test_activation_curve_rises_in_forward_and_returns_to_zero(result: Result) -> None:
    times, levels = activation_curve_bytes(result)
    assert np.all(np.diff(times) >= 0)
    assert max(levels) == pytest.approx(result.memory.gpu_bytes["activations"])
    assert levels[-1] == pytest.approx(0.0)


def test_plot_result_and_compare_write_png(result: Result, tmp_path: Path) -> None:
    one = plot_result(result, tmp_path / "one.png")
    two = plot_compare([result, result], tmp_path / "two.png", ["a", "b"])
    for path in (one, two):
        assert path.read_bytes()[:8] == PNG_MAGIC
        assert path.stat().st_size > 10_000


def test_cli_run_writes_trace_and_plot(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "p.png"
    args = ["run", str(root / "scenarios/gh200_zero_offload_4b.yaml"), "--set", "model.layers=2",
            "--trace", str(trace), "--plot", str(png), "--format", "json"]
    assert main(args) == 0
    json.loads(capsys.readouterr().out)
    assert json.loads(trace.read_text())["otherData"]["scenario"] == "gh200_zero_offload_4b"
    assert png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(("span_s", "unit"), [(854.0, "s"), (1.4, "ms"), (0.002, "µs")])
def test_timeline_unit_follows_step_length(span_s: float, unit: str) -> None:
    scale, name = time_unit(span_s)
    assert name == unit
    assert 1 <= span_s * scale < 1e6
