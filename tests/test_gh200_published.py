"""GH200 built from published measurements (issue 16): the published table, the Grace host transfer, the
stage-3 hook bucket and the transferred-cost bands."""

from __future__ import annotations

import pytest

from sosim import load_profile, load_scenario, simulate
from sosim.answers.bands import TRANSFERRED_SPREADS, has_transferred_costs, simulate_band
from sosim.costs import analytic as c
from sosim.costs import grace_host
from sosim.costs.published import table_origin
from sosim.costs.table import load_tables
from sosim.inputs.units import GB
from sosim.run.result import BREAKDOWN_KEYS
from sosim.run.simulate import make_cost_model

ALPS = "scenarios/alps_gh200x4_superoffload_6.7b.yaml"
GPT8B = "scenarios/gh200_superoffload_deepspeed_8b.yaml"


def test_first_touch_follows_page_size() -> None:
    x86 = load_profile("h200-pcie-gen5-x86").cpu
    assert grace_host.first_touch_GBps_per_core(x86) == pytest.approx(c.FIRST_TOUCH_GBps_PER_CORE, rel=1e-12)
    # 64 KiB: the same fixed fault cost, 16x the zeroing: 65536 B / (1.517 us - 0.4995 us + 7.992 us).
    grace = x86.model_copy(update={"page_kib": 64.0})
    fault_s = 4096 / 2.7e9 - 4096 / 8.2e9
    assert grace_host.first_touch_GBps_per_core(grace) == pytest.approx(65536 / (fault_s + 65536 / 8.2e9) / 1e9)
    assert grace_host.first_touch_GBps_per_core(grace) > 2.5 * c.FIRST_TOUCH_GBps_PER_CORE


def test_host_thread_costs_divide_by_speed() -> None:
    gh = load_scenario(GPT8B)
    costs = make_cost_model(gh)
    # Grace's host thread is assumed as fast as the x86 VM's (no published comparison): the VM's figure.
    assert gh.hardware.cpu.host_thread_speed == 1.0
    # GPT layer: 12 parameter tensors in 6 parameter modules (4 Linear + 2 LayerNorm); the hooks' host time follows
    # the modules (issue 21's GPT-2 / Llama hook timing), x86 VM 1.0 ms each per pass.
    assert costs.stage3_hook_s(16384, backward=False) == pytest.approx(6 * c.STAGE3_HOOK_S_PER_MODULE)
    faster = load_scenario(GPT8B, ["hardware.cpu.host_thread_speed=2.0"])
    assert make_cost_model(faster).stage3_hook_s(16384, False) == pytest.approx(3e-3)


def test_step_fixed_has_no_host_pass_over_the_gradients() -> None:
    costs = make_cost_model(load_scenario(GPT8B))
    small, large = costs.ds_step_fixed_s(1e8, 4, "superoffload"), costs.ds_step_fixed_s(1e10, 4, "superoffload")
    assert small == pytest.approx(large, rel=1e-12)
    assert small < 0.05  # bookkeeping only; a 1e10-element pass at 330 GB/s would be 0.12 s


def test_published_table_is_used_and_named() -> None:
    hw = load_profile("gh200")
    table = load_tables(hw.calibration_paths)
    assert "published-gh200/SOURCES.md" in table_origin(table)
    assert table_origin(load_tables(load_profile("h200-pcie-gen5-x86").calibration_paths)) == ""
    costs = make_cost_model(load_scenario(GPT8B))
    size = 512 * 2**20
    assert costs.copy_s(size, "h2d", True) == pytest.approx(size / (377 * GB), rel=1e-4)
    assert costs.copy_s(size, "d2h", True) == pytest.approx(size / (297 * GB), rel=1e-4)
    # DeepSpeed 0.19's scalar CPUAdam on aarch64 (PR 8365): 4B params in 0.755 s on all cores.
    assert costs.cpu_adam_s(4e9, "cpu_adam", 72, 4e9) == pytest.approx(0.755, rel=1e-6)


def test_provenance_says_published_and_transferred() -> None:
    prov = simulate(load_scenario(GPT8B)).provenance
    assert "published" in prov["calibration_origin"]
    assert "copy_h2d_pinned" in prov["costs_published"] and prov["costs_measured"].startswith("none")
    assert "host_thread_speed 1" in prov["costs_transferred"]  # carried unchanged: still a transfer
    assert "64 KiB pages" in prov["costs_transferred"]
    x86 = simulate(load_scenario("scenarios/h200_x86_llama2.0b_zero2_measured.yaml")).provenance
    assert "costs_transferred" not in x86 and "calibration_origin" not in x86


def test_stage3_hook_time_has_its_own_bucket() -> None:
    # Hooks made slow (the x86 VM's speed) on a GPU-resident ZeRO-3 step: the GPU waits on the host thread.
    r = simulate(load_scenario(ALPS, ["schedule={system: zero3}"]))
    m = r.metrics
    assert "exposed_stage3_hooks_s" in BREAKDOWN_KEYS
    assert m["exposed_stage3_hooks_s"] > 0.5 * m["step_time_s"]
    assert m["exposed_cpu_cast_s"] < 0.01 * m["step_time_s"]
    assert sum(m[k] for k in BREAKDOWN_KEYS) == pytest.approx(m["step_time_s"], rel=1e-9)


def test_deepspeed_superoffload_beats_zero_offload_on_gh200_for_the_breakdowns_reasons() -> None:
    # GPT 8B, seq 2048, micro-batch 8: SuperOffload's worker Adam overlaps backward, ZeRO-Offload's does not.
    so = simulate(load_scenario(GPT8B)).metrics
    zo = simulate(load_scenario(GPT8B, ["schedule={system: zero_offload, implementation: deepspeed}"])).metrics
    assert so["tokens_per_s"] > zo["tokens_per_s"]
    assert so["exposed_cpu_optimizer_s"] < 0.7 * zo["exposed_cpu_optimizer_s"]
    # With Grace's host thread taken as fast as the x86 VM's, a GPT layer's forward hooks (12 tensors x 1 ms)
    # outrun its ~9 ms of GPU forward: a few percent of the step waits on them, backward (3x the GPU work) none.
    assert 0.0 < so["exposed_stage3_hooks_s"] < 0.1 * so["step_time_s"]


def test_transferred_costs_widen_the_band() -> None:
    gh = load_scenario(GPT8B)
    assert has_transferred_costs(gh)
    assert not has_transferred_costs(load_scenario("scenarios/h200_x86_llama2.0b_zero2_measured.yaml"))
    band = simulate_band(gh, n=8, seed=1)
    assert set(band.transferred_used) <= set(TRANSFERRED_SPREADS)
    assert "stage3_hook" in band.transferred_used
    assert band.describe()["transferred_spreads_used"]["stage3_hook"] == TRANSFERRED_SPREADS["stage3_hook"].rel


def test_a_core_bound_cpu_adam_scales_with_every_core() -> None:
    # DeepSpeed 0.19's scalar CPUAdam moves 28 B/param at 148 GB/s on 72 Grace cores, under half of STREAM:
    # core bound, so 36 cores take twice as long; GraceAdam (368 GB/s) is memory bound past 32 cores.
    costs = make_cost_model(load_scenario(GPT8B))
    full = costs.cpu_adam_s(4e9, "cpu_adam", 72, 4e9)
    assert costs.cpu_adam_s(4e9, "cpu_adam", 36, 4e9) == pytest.approx(2 * full, rel=1e-9)
    grace = costs.cpu_adam_s(4e9, "grace_adam", 72, 4e9)
    assert costs.cpu_adam_s(4e9, "grace_adam", 36, 4e9) == pytest.approx(grace, rel=1e-9)


def test_every_published_row_says_published_or_transferred() -> None:
    # A published table must never pass a value off as measured by sosim: each row's `device` names its kind.
    import csv
    from pathlib import Path

    path = Path(load_profile("gh200").calibration_paths[0])
    rows = list(csv.DictReader(path.open()))
    assert rows and all(r["device"].startswith(("published:", "transferred:")) for r in rows)
    assert (path.parent / "SOURCES.md").read_text().startswith("# published")


def test_alps_scenario_is_the_model_the_study_ran() -> None:
    # The LSAIE study's logs print 8,053,329,920 parameters for its "6.7B" (src/train.py: 32 x 4096, GQA 8,
    # SwiGLU 14336, vocab 131072, untied) and train.py has no activation checkpointing.
    from sosim.hardware.model import total_params

    sc = load_scenario(ALPS)
    assert total_params(sc.model) == 8_053_329_920
    assert not sc.training.activation_checkpointing and sc.training.micro_batch == 1


def test_without_stv_the_next_forward_waits_for_the_whole_step() -> None:
    # The paper's SuperOffload without STV is ZeRO-3's synchronous step(): every CPU sub-group's Adam (and its
    # refresh) is on the critical path. With STV it overlaps backward.
    from sosim.hardware.model import total_params

    base = ["schedule.cpu_adam=grace_adam", "schedule.cast=gpu", "schedule.bucket_mb=1000",
            "schedule.gpu_optimizer_fraction=0", "schedule.weight_placement=stationary"]
    paper8b = "scenarios/gh200_superoffload_8b.yaml"
    sc = load_scenario(paper8b, base)
    params = total_params(sc.model)
    adam_s = make_cost_model(sc).cpu_adam_s(params, "grace_adam", 72, params)
    off = simulate(load_scenario(paper8b, [*base, "schedule.speculation=false"])).metrics
    on = simulate(load_scenario(paper8b, [*base, "schedule.speculation=true"])).metrics
    assert off["exposed_cpu_optimizer_s"] >= 0.95 * adam_s
    assert on["exposed_cpu_optimizer_s"] < 0.2 * adam_s
    assert off["step_time_s"] > on["step_time_s"] + 0.8 * adam_s


def test_grace_host_note_names_an_unchanged_transfer() -> None:
    x86 = load_profile("h200-pcie-gen5-x86").cpu
    assert grace_host.transferred_note(x86) == ""
    grace = x86.model_copy(update={"page_kib": 64.0})  # host_thread_speed stays 1.0: carried unchanged
    assert "host_thread_speed 1" in grace_host.transferred_note(grace)
