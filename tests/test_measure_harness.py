"""The device harness's torch-free parts added for issues 21-23: GPT-2 / MoE sizes, ZeRO-3 hook timers (fakes
standing in for DeepSpeedZeRoOffload, its coordinator and torch's hook handles), per-job DeepSpeed versions, the
instep section's bookkeeping and the quick plan."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sosim.calibrate.ds_timers import MethodTimers
from sosim.calibrate.instep_bench import ds_config_for, split_parts, step_values, write_instep_csv
from sosim.calibrate.platform_detect import detect, plan_for
from sosim.calibrate.z3_hooks import HOOK_NAMES, HookTimers, model_counts

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_m_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Clock:
    """Advances by 1 s on each read: a wrapped call with no inner timed calls costs exactly 1 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class FakeHandle:
    """torch.utils.hooks.RemovableHandle's two attributes that z3_hooks uses."""

    def __init__(self, hooks: dict[int, Any], key: int) -> None:
        self.id = key
        self.hooks_dict_ref = lambda: hooks


class FakeCoordinator:
    def __init__(self) -> None:
        self.fetched: list[str] = []

    def fetch_sub_module(self, module: str, forward: bool) -> None:
        self.fetched.append(module)

    def release_sub_module(self, module: str, forward: bool = False) -> None:
        pass


class FakeOffload:
    """DeepSpeedZeRoOffload's shape: closures registered in hook dicts that call self.<method> at call time."""

    def __init__(self) -> None:
        self.coordinator = FakeCoordinator()
        self.pre_hooks: dict[int, Any] = {}
        self.post_hooks: dict[int, Any] = {}

        def _pre_forward_module_hook(module: str, *args: Any) -> None:
            self.pre_sub_module_forward_function(module)

        def wrapped_fn(module: str, inputs: Any, output: Any) -> None:  # @instrument_w_nvtx's name
            self.post_sub_module_forward_function(module)

        self.pre_hooks[0] = _pre_forward_module_hook
        self.post_hooks[1] = wrapped_fn
        self.forward_hooks = [FakeHandle(self.pre_hooks, 0), FakeHandle(self.post_hooks, 1)]
        self.backward_hooks: list[FakeHandle] = []

    def get_param_coordinator(self) -> FakeCoordinator:
        return self.coordinator

    def pre_sub_module_forward_function(self, module: str) -> None:
        self.coordinator.fetch_sub_module(module, forward=True)

    def post_sub_module_forward_function(self, module: str) -> None:
        self.coordinator.release_sub_module(module, forward=True)

    def pre_sub_module_backward_function(self, module: str) -> None:
        self.coordinator.fetch_sub_module(module, forward=False)

    def post_sub_module_backward_function(self, module: str) -> None:
        self.coordinator.release_sub_module(module, forward=False)


class FakeEngine:
    def __init__(self) -> None:
        self.optimizer = type("Opt", (), {})()
        self.optimizer.parameter_offload = FakeOffload()


def test_hook_timers_wrap_closures_methods_and_coordinator_nested() -> None:
    engine = FakeEngine()
    hooks = HookTimers(MethodTimers(clock=Clock()))
    assert hooks.attach(engine) and hooks.hook_handles == 2
    offload = engine.optimizer.parameter_offload
    offload.pre_hooks[0]("layer0")  # as torch calls a forward pre-hook
    offload.pre_hooks[0]("layer1")
    offload.post_hooks[1]("layer0", (), None)
    taken = hooks.take()
    # Each call: the innermost wrapper reads the clock twice (1 s), each enclosing one spans 2 more reads.
    assert taken["fetch"] == (2.0, 2)
    assert taken["pre_fwd"] == (6.0, 2)  # 3 s each: its own two reads around fetch's two
    assert taken["hook_fwd_pre"] == (10.0, 2)
    assert taken["hook_fwd_post"][1] == 1 and taken["release"] == (1.0, 1)
    assert offload.coordinator.fetched == ["layer0", "layer1"]  # the real work still ran
    assert hooks.take()["fetch"] == (0.0, 0)  # take() resets
    assert set(HOOK_NAMES) >= set(taken)


def test_hook_timers_absent_for_stage_2() -> None:
    engine = type("E", (), {"optimizer": object()})()
    assert not HookTimers(MethodTimers()).attach(engine)


def test_model_counts_modules_and_tensors() -> None:
    class Module:
        def __init__(self, own: int, children: list[Module]) -> None:
            self.own, self.children = own, children

        def modules(self) -> list[Module]:
            return [self, *(m for c in self.children for m in c.modules())]

        def parameters(self, recurse: bool = True) -> list[int]:
            mine = list(range(self.own))
            return mine + [p for c in self.children for p in c.parameters()] if recurse else mine

    # A GPT-2 block: container, 2 LayerNorms (2 tensors each), attn container with c_attn and c_proj (2 each),
    # mlp container with c_fc and c_proj (2 each): 9 modules, 6 holding parameters, 12 tensors.
    block = Module(0, [Module(2, []), Module(0, [Module(2, []), Module(2, [])]), Module(2, []),
                       Module(0, [Module(2, []), Module(2, [])])])
    assert model_counts(block) == {"hooked_modules": 9, "param_modules": 6, "param_tensors": 12, "z3_leaf_modules": 0}


def test_family_sizes() -> None:
    step = _script("ds_train_step")
    assert step.size_family("G12h2048a16f8192") == "gpt2"
    assert step.parse_size("G12h2048a16f8192") == (12, 2048, 16, 16, 8192)
    assert step.size_family("M8h2048a32kv4d128e64k8f768") == "moe"
    assert step.parse_moe("M8h2048a32kv4d128e64k8f768") == (8, 2048, 32, 4, 128, 64, 8, 768)
    assert step.parse_moe("M2h256a4kv2e4k2f128")[4] == 64  # head_dim defaults to hidden / heads
    assert step.size_family("1.1b") == "llama" and step.size_family("L12h2048a16kv16f5632") == "llama"
    with pytest.raises(ValueError, match="top_k"):
        step.parse_moe("M2h256a4kv2e4k8f128")
    with pytest.raises(ValueError, match="multiple of heads"):
        step.parse_size("G2h1000a3f4000")


def test_new_columns_only_at_the_end() -> None:
    step = _script("ds_train_step")
    columns = list(step.CSV_COLUMNS)
    last_timer = columns.index(f"t_{step.TIMER_NAMES[-1]}_s")
    assert columns.index("lease") < columns.index("t_opt_step_s") < last_timer < columns.index("family")
    assert columns[-1] == "z3_leaf_modules" and len(columns) == len(set(columns))


def test_hook_step_values_sum_phases() -> None:
    step = _script("ds_train_step")
    out = step.hook_step_values({
        "fwd": {"hook_fwd_pre": (0.5, 10), "fetch": (0.4, 10)},
        "bwd": {"hook_fwd_pre": (0.25, 10), "pre_bwd": (0.75, 10), "fetch": (0.5, 10)},
        "opt": {},
    })
    assert out["h_hook_fwd_pre"] == 0.75 and out["c_hook_fwd_pre"] == 20
    assert out["hook_total_fwd"] == 0.5 and out["hook_total_bwd"] == 1.0  # fetch nests: not added
    assert out["hook_total"] == 1.5 and out["h_fetch"] == pytest.approx(0.9)


def test_zero3gpu_config_has_no_offload_and_no_ds_optimizer() -> None:
    step = _script("ds_train_step")
    config = step.ds_config("zero3gpu", 4, 0.0, 10**8, 1.0, 0.8)
    assert "optimizer" not in config and config["zero_optimization"]["stage"] == 3
    assert "offload_optimizer" not in config["zero_optimization"]


def test_job_options_hooks_moe_and_deepspeed_version(tmp_path: Path) -> None:
    run_all = _script("ds_run_all")
    argv = run_all.job_argv("M8h2048a32kv4d128e64k8f768:2048:4:zero3:hooks=1:moe=own:ds=0.18.8", tmp_path)
    assert "--hook-timers" in argv and argv[argv.index("--moe-impl") + 1] == "own"
    assert argv[argv.index("--expect-ds") + 1] == "0.18.8"
    env = run_all.job_env("1.1b:2048:4:zero2:ds=0.18.8", Path("/tmp"), {"PYTHONPATH": "/tmp/site"})
    assert env["PYTHONPATH"] == "/tmp/site-ds0.18.8:/tmp/site"
    assert env["TORCH_EXTENSIONS_DIR"] == "/tmp/torch_ext-ds0.18.8"
    assert run_all.job_env("1.1b:2048:4:zero2", Path("/tmp"), {"PYTHONPATH": "/tmp/site"}) == {
        "PYTHONPATH": "/tmp/site"
    }
    with pytest.raises(ValueError, match="unknown option"):
        run_all.parse_job("1.1b:2048:4:zero2:version=0.18.8")


def test_run_id_names_version_and_hooks() -> None:
    step = _script("ds_train_step")
    args = step.build_parser().parse_args(
        ["--config", "zero3", "--size", "G12h2048a16f8192", "--out", "x", "--expect-ds", "0.18.8", "--hook-timers"]
    )
    assert step.run_id_for(args, 1) == "G12h2048a16f8192-s2048-mb4-zero3-clip0-ds0.18.8-hooks"


def test_instep_parts_and_step_values() -> None:
    parts = split_parts([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert parts["start"] == [1.0, 2.0] and parts["middle"] == [3.0, 4.0] and parts["end"] == [5.0, 6.0]
    assert split_parts([1.0, 2.0])["middle"] == [1.0, 2.0]  # too few to split: the middle is every step

    def fixed(methods: dict[str, tuple[float, int]]) -> float:
        return methods["opt_step"][0] - methods.get("refresh", (0.0, 0))[0]

    out = step_values(
        {"bwd_methods": {"partition_grads": (0.2, 5)}, "opt_methods": {"opt_step": (1.0, 1), "refresh": (0.3, 5)},
         "fwd_hooks": {"hook_fwd_pre": (0.1, 40)}, "bwd_hooks": {"pre_bwd": (0.2, 40), "hook_fwd_pre": (0.1, 40)}},
        {"step_wall": 2.0},
        fixed,
    )
    assert out["bwd_partition_grads"] == 0.2 and out["bwd_partition_grads_calls"] == 5
    assert out["fixed"] == pytest.approx(0.7) and out["refresh_calls"] == 5
    assert out["hook_fwd_pre"] == pytest.approx(0.2) and out["hook_fwd_pre_calls"] == 80
    assert out["hook_total_fwd"] == 0.1 and out["hook_total_bwd"] == pytest.approx(0.3)


def test_instep_csv_from_rows(tmp_path: Path) -> None:
    rows = [
        {"op": "instep", "variant": "zero3_param_refresh@middle", "median_s": "0.5", "p10_s": "0.4",
         "p90_s": "0.6", "n_samples": "2", "elements": "500000000", "layers": "8", "hidden": "2048"},
        {"op": "instep", "variant": "zero3_refresh@all", "median_s": "0.3"},
        {"op": "ds_step_fixed", "variant": "zero3", "median_s": "0.1"},
    ]
    assert write_instep_csv(rows, tmp_path / "instep.csv", "0.19.8") == 2
    read = list(csv.DictReader((tmp_path / "instep.csv").open()))
    # The longest system name wins: zero3_param's refresh is not zero3's "param_refresh".
    assert (read[0]["system"], read[0]["component"], read[0]["part"]) == ("zero3_param", "refresh", "middle")
    assert read[1]["system"] == "zero3" and read[0]["deepspeed_version"] == "0.19.8"


def test_instep_configs() -> None:
    assert ds_config_for("zero3_param")["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds_config_for("superoffload")["zero_optimization"]["offload_optimizer"]["super_offload"] is True
    assert ds_config_for("zero2")["zero_optimization"]["stage"] == 2


def test_quick_plan_replaces_ds_step_fixed_by_instep() -> None:
    plat = detect(arch="x86_64", cpuinfo_text="", gpu_name="NVIDIA H200", cores=16)
    quick = plan_for(plat, quick=True, deepspeed=True).sections
    assert "instep" in quick and "ds_step_fixed" not in quick
    full = plan_for(plat, quick=False, deepspeed=True).sections
    assert "instep" in full and "ds_step_fixed" in full
    assert "instep" not in plan_for(plat, quick=True, deepspeed=False).sections


def test_campaign_job_list_parses_and_the_step_script_accepts_every_job(tmp_path: Path) -> None:
    run_all = _script("ds_run_all")
    step = _script("ds_train_step")
    lines = (ROOT / "scripts" / "campaign_jobs.txt").read_text().splitlines()
    jobs = [line.split("#", 1)[0].strip() for line in lines]
    jobs = [job for job in jobs if job]
    assert len(jobs) == len(set(jobs)) >= 30  # each once: --skip-done matches jobs by their text
    run_ids = set()
    for job in jobs:
        argv = run_all.job_argv(job, tmp_path)
        args = step.build_parser().parse_args(argv[2:])  # [python, script, ...]
        run_ids.add(step.run_id_for(args, 1))
    assert len(run_ids) == len(jobs)  # no two jobs write the same runs/<run_id>.json
    configs = {(run_all.parse_job(j)[0][3], run_all.parse_job(j)[1].get("param", "")) for j in jobs}
    assert {("zero2", ""), ("zero3", ""), ("zero3", "cpu"), ("superoffload", ""), ("zero3gpu", "")} <= configs
    versions = [j for j in jobs if "ds=0.18.8" in j]
    assert {run_all.parse_job(j)[0][3] for j in versions} == {"zero2", "zero3", "superoffload"}
    assert {run_all.parse_job(j)[0][0] for j in versions} == {"1.1b", "G12h2048a16f8192"}


def test_validate_reads_gpt2_rows_and_skips_zero3gpu(tmp_path: Path) -> None:
    from sosim.answers.validate_measured import read_runs

    step = _script("ds_train_step")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "g.ds_config.json").write_text('{"zero_optimization": {"stage": 3}}\n')
    base = {"timing": "unsynced", "status": "ok", "layers": "12", "hidden": "2048", "heads": "16", "kv_heads": "16",
            "head_dim": "128", "ffn": "8192", "vocab": "32000", "seq": "2048", "micro_batch": "4", "n_steps": "4",
            "step_median_s": "1.0", "step_p10_s": "0.9", "step_p90_s": "1.1", "family": "gpt2",
            "model": "G12h2048a16f8192", "ds_config_file": "runs/g.ds_config.json"}
    rows = [base | {"run_id": "g-zero3", "config": "zero3"}, base | {"run_id": "g-gpu", "config": "zero3gpu"}]
    step.append_rows(tmp_path / "deepspeed_steps.csv", rows)
    runs, skipped = read_runs(tmp_path)
    assert [r.run_id for r in runs] == ["g-zero3"] and [s.run_id for s in skipped] == ["g-gpu"]
    model = runs[0].model
    assert model["model_type"] == "gpt2" and model["n_inner"] == 8192 and model["tie_word_embeddings"] is False
    assert "no sosim system" in skipped[0].reason


def test_instep_report_compares_with_the_same_lease_lookup(tmp_path: Path) -> None:
    from sosim.costs.calibration_table import CalibrationTable

    report_mod = _script("instep_report")
    lease = ROOT / "calibration" / "nvidia-h200-2026-12-01"
    (tmp_path / "measurements.csv").write_text((lease / "measurements.csv").read_text())
    header = "system,component,part,median_s,p10_s,p90_s,n_steps,layers,hidden,seq,micro_batch,params,subgroups,threads"
    tail = ",6,8,2048,2048,2,500000000,5,16"
    (tmp_path / "instep.csv").write_text("\n".join([
        header, "zero3,refresh,all,0.3,0.3,0.3" + tail, "zero3,refresh,end,0.25,0.25,0.25" + tail,
        "zero3,refresh_calls,all,5,5,5" + tail, "zero3,fwd,all,0.1,0.1,0.1" + tail]) + "\n")
    steps = report_mod.read_instep(tmp_path / "instep.csv")
    assert set(steps) == {("zero3", "refresh"), ("zero3", "fwd")} and steps[("zero3", "refresh")].calls == 5
    table = CalibrationTable.from_csv(tmp_path / "measurements.csv")
    iso, how = report_mod.isolated_s(table, "zero3", "refresh", steps[("zero3", "refresh")])
    per_call = table.ds_refresh_time_s(1e8, 16, "zero3")
    assert per_call is not None and iso == pytest.approx(5 * per_call) and "x 5" in how
    assert report_mod.isolated_s(table, "zero3", "fwd", steps[("zero3", "fwd")]) == (None, "")
    text = report_mod.report(tmp_path)
    assert f"{0.3 / iso:.2f}" in text and "0.25" in text


def test_instep_rows_are_readable_by_the_calibration_table(tmp_path: Path) -> None:
    from sosim.calibrate.instep_bench import instep_rows
    from sosim.calibrate.records import Context, Table
    from sosim.costs.calibration_table import CalibrationTable

    dims = {"elements": 5e8, "subgroups": 5, "threads": 16, "layers": 8, "hidden": 2048, "seq": 2048, "batch": 2}
    samples = {"refresh": [0.3, 0.31, 0.29, 0.3, 0.32, 0.3], "wait_async": [0.0] * 6,
               "sync_cpu_optimizer": [0.0, 0.0, 0.1, 0.0, 0.0, 0.0], "fixed": [0.05] * 6, "opt": [1.0] * 6}
    counts = {"hooked_modules": 60, "z3_leaf_modules": 0}
    rows = instep_rows("zero3", samples, counts, dims)
    variants = {r[1] for r in rows}
    assert "zero3_refresh@all" in variants and "zero3_refresh@end" in variants
    assert not any(v.startswith("zero3_wait_async") for v in variants)  # never called: no row
    assert "zero3_sync_cpu_optimizer@start" not in variants and "zero3_sync_cpu_optimizer@middle" in variants
    assert "zero3_z3_leaf_modules@all" not in variants
    assert ("ds_step_fixed", "zero3") in {(r[0], r[1]) for r in rows} and "zero3_step_wall" in variants
    assert not any(r[0] == "ds_step_fixed" for r in instep_rows("zero2", samples, counts, dims))
    table = Table(Context(device="d", host_cpu="c", torch_version="t", date="2026-12-01"))
    for op, variant, dtype, times, shape in rows:
        table.add(op, variant, dtype, list(times), **shape)
    table.write_csv(tmp_path / "measurements.csv")
    loaded = CalibrationTable.from_csv(tmp_path / "measurements.csv")  # one zero median would raise here
    assert ("instep", "zero3_refresh@all") in loaded.columns_by_op


def test_quick_layer_offload_keeps_what_the_simulator_reads() -> None:
    from sosim.calibrate.offload_layer_bench import LAYER_OFFLOAD_PLAN, layer_offload_plan

    quick = {(hidden, modes) for hidden, groups in layer_offload_plan(True) for modes in groups}
    assert quick == {(2048, ("hf", "z2_offload")), (2048, ("z3_offload_param",))}
    assert layer_offload_plan(False) == LAYER_OFFLOAD_PLAN


def _instep_fixture(folder: Path) -> None:
    """A measurements.csv with isolated refresh / CPU Adam rows and an instep.csv of the same lease."""
    from sosim.calibrate.records import Context, Table

    table = Table(Context(device="NVIDIA H200", host_cpu="x86", torch_version="t", date="2026-12-01"))
    for elements, seconds in ((1e7, 0.006), (1e8, 0.05), (3e8, 0.15)):
        table.add("ds_refresh", "zero3", "fp32", [seconds] * 5, elements=elements, threads=16, bytes=2 * elements)
        table.add("ds_refresh", "superoffload", "fp32", [2 * seconds] * 5, elements=elements, threads=3)
    for elements, seconds in ((1e8, 0.1), (1e9, 1.0)):
        table.add("cpu_adam", "deepspeed", "fp32", [seconds] * 5, elements=elements, threads=16)
        table.add("cpu_adam", "deepspeed", "fp32", [4 * seconds] * 5, elements=elements, threads=4)
    table.write_csv(folder / "measurements.csv")
    lines = ["system,component,part,median_s,p10_s,p90_s,n_steps,layers,hidden,seq,micro_batch,params,subgroups,"
             "threads,deepspeed_version"]
    tail = ",6,8,2048,2048,2,500000000,{g},16,0.19.8"
    lines += ["zero3,refresh,all,0.30,0.29,0.31" + tail.format(g=5), "zero3,refresh_calls,all,5,5,5" + tail.format(g=5),
              "superoffload,refresh,all,0.50,0.5,0.5" + tail.format(g=5).replace(",16,", ",3,"),
              "superoffload,refresh_calls,all,5,5,5" + tail.format(g=5).replace(",16,", ",3,"),
              "zero2,optimizer,all,0.75,0.7,0.8" + tail.format(g=1),
              "zero2,optimizer_calls,all,1,1,1" + tail.format(g=1)]
    (folder / "instep.csv").write_text("\n".join(lines) + "\n")


def test_instep_factors_rescale_the_isolated_curves(tmp_path: Path) -> None:
    from sosim.calibrate.instep_profile import write_instep_table
    from sosim.calibrate.records import COLUMNS
    from sosim.costs.calibration_table import CalibrationTable

    _instep_fixture(tmp_path)
    path, found = write_instep_table(tmp_path, COLUMNS)
    assert path is not None
    by = {(f.op, f.variant): f for f in found}
    # zero3: 0.30 s / 5 calls of 1e8 elements = 0.06 s against 0.05 s isolated at 1e8, 16 threads.
    assert by[("ds_refresh", "zero3")].factor == pytest.approx(1.2)
    # superoffload: the row says 3 threads (the main process pinned); 0.10 s per call against 0.10 s isolated.
    assert by[("ds_refresh", "superoffload")].threads == 3 and by[("ds_refresh", "superoffload")].factor == (
        pytest.approx(1.0))
    # zero2: 0.75 s for 5e8 elements; isolated per element at 5e8, 16 threads, is 1e-9 (flat between the sizes).
    assert by[("cpu_adam", "deepspeed")].factor == pytest.approx(1.5)
    merged = CalibrationTable.merged([CalibrationTable.from_csv(tmp_path / "measurements.csv"),
                                      CalibrationTable.from_csv(path)])
    assert merged.ds_refresh_time_s(1e8, 16, "zero3") == pytest.approx(0.06)
    assert merged.ds_refresh_time_s(3e8, 16, "zero3") == pytest.approx(0.18)  # the curve's shape, rescaled
    assert merged.cpu_adam_time_s(1e9, 4, "deepspeed") == pytest.approx(6.0)  # every thread count rescaled
    assert not merged.session_log_sd  # a variant of its own: no fake lease-to-lease spread
    alone = CalibrationTable.from_csv(tmp_path / "measurements.csv")
    assert alone.ds_refresh_time_s(1e8, 16, "zero3") == pytest.approx(0.05)  # no in-step rows: isolated


def test_profile_lists_the_instep_table_and_says_so(tmp_path: Path) -> None:
    import json

    import yaml

    from sosim.calibrate.profile_writer import write_profile

    profiles = tmp_path / "profiles"
    cal = profiles / "box.calibration"
    cal.mkdir(parents=True)
    _instep_fixture(cal)
    (cal / "calibration_meta.json").write_text(json.dumps({"date": "2026-12-01", "device": "NVIDIA H200"}))
    written = write_profile("box", profiles, cal, ROOT / "hardware_profiles" / "h200-pcie-gen5-x86.yaml",
                            "h200-pcie-gen5-x86", "pcie")
    data = yaml.safe_load(written.path.read_text())
    assert data["calibration"] == ["box.calibration/measurements.csv", "box.calibration/instep_table.csv"]
    assert "ds_refresh/zero3 x1.20" in data["description"]
    assert "In-step host figures" in written.path.read_text()
    assert any("in-step figures used" in n for n in written.notes)


def test_validate_skips_unreadable_models(tmp_path: Path) -> None:
    from sosim.answers.validate_measured import read_runs

    step = _script("ds_train_step")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "c.ds_config.json").write_text('{"zero_optimization": {"stage": 3}}\n')
    base = {"timing": "unsynced", "status": "ok", "layers": "8", "hidden": "2048", "heads": "16", "kv_heads": "4",
            "head_dim": "128", "ffn": "5632", "vocab": "32000", "seq": "2048", "micro_batch": "4", "n_steps": "4",
            "step_median_s": "1.0", "config": "zero3", "ds_config_file": "runs/c.ds_config.json",
            "deepspeed_version": "0.19.8", "family": "llama"}
    rows = [base | {"run_id": "odd", "heads": "3"},  # hidden 2048 is no multiple of 3 heads: the reader refuses it
            base | {"run_id": "ok"}]
    step.append_rows(tmp_path / "deepspeed_steps.csv", rows)
    runs, skipped = read_runs(tmp_path)
    assert [r.run_id for r in runs] == ["ok"]
    assert [s.run_id for s in skipped] == ["odd"] and "model not readable by sosim" in skipped[0].reason
