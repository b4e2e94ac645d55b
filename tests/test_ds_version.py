"""DeepSpeed's version as an input (issue 21): the modelled releases, what each does differently on the paths
sosim replays (sosim/schedules/blocks/ds_version.py), and that every output names the release."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sosim import load_scenario, simulate
from sosim.hardware.machine import Machine
from sosim.inputs.ds_versions import NEWEST, check
from sosim.inputs.errors import ConfigError
from sosim.schedules.blocks import ds_version
from sosim.schedules.blocks.ds_version import behaviour_of

ROOT = Path(__file__).resolve().parent.parent
GPT8B = "scenarios/gh200_superoffload_deepspeed_8b.yaml"
BLOG = "scenarios/gh200_superoffload_deepspeed_qwen3_14b_blog.yaml"
X86_SO = "scenarios/x86_h100_superoffload_deepspeed_4b.yaml"
SMALL = ["model.layers=8", "model.hidden=2048", "model.heads=16"]


def _ops(sc_path: str, overrides: list[str]) -> list[str]:
    return [o.name for o in simulate(load_scenario(sc_path, overrides)).plan.ops]


def test_modelled_releases_and_the_errors_that_name_them() -> None:
    assert check("v0.18.8") == "0.18.8" and check(NEWEST) == "0.19.8"
    with pytest.raises(ValueError, match=r"0\.18\.6 is not modelled: PR 7780"):
        check("0.18.6")
    with pytest.raises(ValueError, match=r"0\.19\.7 is not modelled: their sources were not read"):
        check("0.19.7")
    with pytest.raises(ValueError, match=r"outside the modelled versions; modelled DeepSpeed versions: 0\.18\.0-"):
        check("0.20.0")
    with pytest.raises(ValueError, match="not a DeepSpeed release"):
        check("0.18")


def test_a_scenario_with_an_unmodelled_release_is_a_located_error(tmp_path: Path) -> None:
    text = (ROOT / GPT8B).read_text().replace("implementation: deepspeed}", "implementation: deepspeed, "
                                              "deepspeed_version: '0.17.6'}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_scenario(bad)
    msg = "\n".join(err.value.problems)
    assert f"{bad}:" in msg and "schedule.deepspeed_version" in msg and "0.18.9-0.19.5, 0.19.8" in msg


def test_each_difference_starts_at_its_release() -> None:
    old, mid, clip, z3, new = (behaviour_of(v) for v in ((0, 18, 8), (0, 18, 9), (0, 19, 3), (0, 19, 5), (0, 19, 8)))
    assert old.superoffload_release_path and not mid.superoffload_release_path  # PR 7906, v0.18.9
    assert (mid.default_gradient_clipping, clip.default_gradient_clipping) == (0.0, 1.0)  # PR 8068, v0.19.3
    assert clip.zero3_blocking_grad_copy and not z3.zero3_blocking_grad_copy  # PR 8207, v0.19.5
    assert (clip.default_pin_memory, z3.default_pin_memory) == (False, True)
    assert z3.zero2_unscale_always and not new.zero2_unscale_always
    assert not z3.cpu_adam_sve and new.cpu_adam_sve  # PR 8365


def test_release_era_superoffload_flushes_sub_groups_and_never_refreshes_cpu_ones() -> None:
    old = _ops(GPT8B, [*SMALL, "schedule.sub_group_elements=1e8", "schedule.deepspeed_version=0.18.8"])
    new = _ops(GPT8B, [*SMALL, "schedule.sub_group_elements=1e8", "schedule.deepspeed_version=0.19.8"])
    # 0.18: one flush per sub-group, each copied twice to the host (main process and worker), no host waits.
    n_groups = sum(n.startswith("worker_adam:") for n in old) // 3  # three simulated iterations
    assert sum(n.startswith("grad_d2h_fp32:") for n in old) == sum(n.startswith("worker_grad_d2h_fp32:") for n in old)
    assert sum(n.startswith("grad_d2h_fp32:") for n in old) // 3 == n_groups
    assert not any(n.startswith(("grad_sync:", "param_refresh_copy_", "grad_h2d_bf16")) for n in old)
    # 0.19.8: the bf16 round trip, a host wait per flush, a blocking CPU-cast refresh per CPU sub-group.
    assert any(n.startswith("grad_sync:") for n in new) and any(n.startswith("param_refresh_copy_") for n in new)
    assert any(n.startswith("grad_h2d_bf16") for n in new)


def test_release_era_superoffload_speculates_with_clipping() -> None:
    clip = ["training.gradient_clipping=1.0", *SMALL]
    assert "speculation_active" in simulate(load_scenario(GPT8B, clip)).provenance
    assert simulate(load_scenario(GPT8B, [*clip, "schedule.deepspeed_version=0.18.0"])).provenance[
        "speculation_active"] == "True"
    assert simulate(load_scenario(GPT8B, clip)).provenance["speculation_active"] == "False"


def test_zero3_offload_copies_block_the_host_before_pr_8207() -> None:
    z3o = ["schedule={system: zero3_offload, implementation: deepspeed}", *SMALL]
    old = _ops(X86_SO, [*z3o, "schedule.deepspeed_version=0.19.4"])
    new = _ops(X86_SO, [*z3o, "schedule.deepspeed_version=0.19.5"])
    assert any(n.startswith("grad_sync:") for n in old) and not any(n.startswith("grad_sync:") for n in new)


def test_zero2_unscale_pass_runs_always_before_0_19_8() -> None:
    z2 = ["schedule={system: zero_offload, implementation: deepspeed}", "training.gradient_clipping=0", *SMALL]
    assert "unscale_clip" in _ops(X86_SO, [*z2, "schedule.deepspeed_version=0.19.5"])
    assert "unscale_clip" not in _ops(X86_SO, [*z2, "schedule.deepspeed_version=0.19.8"])


def test_cpu_adam_build_follows_the_release_on_grace_only() -> None:
    gh, x86 = load_scenario(GPT8B), load_scenario(X86_SO)
    assert ds_version.adam_impl(gh, "cpu_adam") == "cpu_adam_sve"  # 0.19.8 builds the SVE kernel on Grace
    old = load_scenario(GPT8B, ["schedule.deepspeed_version=0.19.5"])
    assert ds_version.adam_impl(old, "cpu_adam") == "cpu_adam"
    assert ds_version.adam_impl(x86, "cpu_adam") == "cpu_adam"  # AVX on x86 in every release
    assert ds_version.adam_impl(gh, "grace_adam") == "grace_adam"
    # PR 8365's columns: SVE 1.55x faster than scalar at 4B.
    curves = gh.hardware.cpu.adam_s_by_gparams
    assert curves["cpu_adam"][-1][1] / curves["cpu_adam_sve"][-1][1] == pytest.approx(0.755 / 0.487)


def test_every_output_names_the_release() -> None:
    r = simulate(load_scenario(BLOG))
    assert r.provenance["deepspeed_version"] == "0.18.0"
    assert "SuperOffload as released (PR 7559)" in r.provenance["deepspeed_version_paths"]
    ideal = simulate(load_scenario("scenarios/gh200_superoffload_8b.yaml"))
    assert ideal.provenance["deepspeed_version"].startswith("0.19.8 (not used")


def test_every_published_row_states_its_release_and_why() -> None:
    rows = yaml.safe_load((ROOT / "validation/references.yaml").read_text())["rows"]
    for row in rows:
        assert check(row["deepspeed_version"]) == row["deepspeed_version"], row["id"]
        assert len(row["deepspeed_version_why"]) > 40, row["id"]
    by_id = {r["id"]: r for r in rows}
    assert by_id["ds_so_blog_tflops"]["deepspeed_version"] == "0.18.0"
    assert by_id["alps_6.7b_superoffload_tokens"]["deepspeed_version"] == "0.18.3"
    # One Ulysses row (issue 21 merged the two readings of one published number).
    assert sum(r["id"].startswith("ulysses_13b_1m") for r in rows) == 1


def test_gb200_pairs_share_each_grace_c2c() -> None:
    sc = load_scenario(GPT8B, ["hardware=gb200", "cluster.gpus=4"])
    m = Machine.from_scenario(sc)
    assert m.rank_uplink == (0, 0, 1, 1) and m.rank_socket == (0, 0, 1, 1)
    up = sc.hardware.node.uplinks[0] if sc.hardware.node else None
    assert up is not None and up.h2d_GBps == 2 * 176  # Megatron-LM issue 6491: 176 GB/s per GPU, all copying
    # Each rank's host copy draws on its own link and on its Grace's shared C2C: two GPUs at their one-GPU rate
    # (2 x 211) would exceed what the pair reaches together (352).
    route = m.route(0, "host", "hbm")
    assert {r.kind for r in route} >= {"link", "uplink"}
    caps = {r.id: r.capacity for r in m.shared_resources()}
    uplink_h2d = [v for k, v in caps.items() if k.kind == "uplink" and k.part == "h2d"]
    assert len(uplink_h2d) == 2 and all(v < 2 * sc.hardware.link.h2d_GBps * 1e9 for v in uplink_h2d)


def test_release_era_flush_holds_a_whole_sub_group_in_hbm() -> None:
    from sosim.schedules.superoffload_release import release_gpu_buffers

    sc = load_scenario(BLOG)
    # The blog's sub-group (4e8) is smaller than Qwen3's embedding (151936 x 5120), which fills one sub-group:
    # its bf16 gradients, their cat copy (bf16) and the fp32 cast, 2 + 2 + 4 B per element (one rank).
    emb = 151936 * 5120
    assert release_gpu_buffers(sc, 800.0, 4e8) == pytest.approx(emb * 8.0)
    # Four ranks: the full gradients of a 4e8-element partition sub-group are 4 x 4e8 before the reduce-scatter.
    alps = load_scenario("scenarios/alps_gh200x4_superoffload_6.7b.yaml")
    assert release_gpu_buffers(alps, 800.0, 4e8) == pytest.approx(1.6e9 * 2 + 4e8 * 6)
