"""Scenario <-> DeepSpeed config: the measured runs, round trips, DeepSpeed's schema and (if installed) parser."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sosim import load_scenario, simulate
from sosim.formats.dsconfig import RunInputs, ds_config_from_scenario, load_ds_mapping, map_ds_config
from sosim.formats.dsconfig.emit import emitted_zero_keys
from sosim.formats.hf_model import HfModel
from sosim.formats.jsonio import parse_json
from sosim.inputs.config import Scenario
from sosim.run.loader import load_profile, scenario_from_data
from sosim.schedules import registry, superoffload
from sosim.schedules.blocks.ds_schema import DS_KEYS, TOP_IGNORED, TOP_MAPPED
from sosim.schedules.system_api import Unsaid

ROOT = Path(__file__).resolve().parent.parent
DS = ROOT / "scenarios" / "deepspeed"
HW = "h200-pcie-gen5-x86"
MEASURED = sorted((DS / "measured").glob("*.ds_config.json"))
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))
# The hand-written knobs that predicted each measured DeepSpeed run (formerly validation rows in
# validation/references.yaml; the measured runs are now read from data by sosim/answers/validate_measured.py),
# by run name.
_SO = ["schedule.system=superoffload", "schedule.sub_group_elements=1e8", "schedule.cpu_adam_core_fraction=0.8"]
_HAND_SET = {"zero2-clip0": [], "zero2-clip1": ["training.gradient_clipping=1.0"],
             "zero3-clip0": ["schedule.system=zero3_offload", "schedule.sub_group_elements=1e8"],
             "superoffload-clip0": [*_SO, "schedule.gpu_optimizer_fraction=0.0"],
             "superoffload-clip1": [*_SO, "schedule.gpu_optimizer_fraction=0.0", "training.gradient_clipping=1.0"],
             "superoffload-clip0-ratio0.9": [*_SO, "schedule.gpu_optimizer_fraction=0.1"]}


def _weight_flow(sc: Scenario) -> bool:
    assert isinstance(sc.schedule, superoffload.SuperOffloadKnobs)
    return superoffload.placement(sc, sc.schedule)[0]


def _run_parts(path: Path) -> tuple[str, int, int, str]:
    m = re.match(r"(\d\.\db)-s(\d+)-mb(\d+)-(.+)\.ds_config\.json", path.name)
    assert m, path.name
    return m[1], int(m[2]), int(m[3]), m[4]


def _from_ds(path: Path, seq: int) -> Scenario:
    size = _run_parts(path)[0]
    mapping = load_ds_mapping(path, DS / "models" / f"measured-llama-{size}.json", RunInputs(hardware=HW, seq_len=seq))
    return load_scenario(mapping.scenario)


def _hand_written(path: Path) -> Scenario:
    size, seq, mb, run = _run_parts(path)
    return load_scenario(ROOT / f"scenarios/h200_x86_llama{size}_zero2_measured.yaml",
                         [*_HAND_SET[run], f"training.seq_len={seq}", f"training.micro_batch={mb}"])


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.name)
def test_measured_runs_give_the_hand_written_scenarios(path: Path) -> None:
    ours, theirs = _from_ds(path, _run_parts(path)[1]), _hand_written(path)
    a, b = ours.model_dump(exclude={"name", "description"}), theirs.model_dump(exclude={"name", "description"})
    if a["schedule"]["system"] == "superoffload":
        # DeepSpeed without offload_param keeps the weights in HBM: 'stationary', also the deepspeed default.
        assert a["schedule"]["weight_placement"] == b["schedule"]["weight_placement"] == "stationary"
        assert isinstance(theirs.schedule, superoffload.SuperOffloadKnobs)
        assert not superoffload.placement(theirs, theirs.schedule)[0]
    assert a == b
    assert simulate(ours).metrics["step_time_s"] == simulate(theirs).metrics["step_time_s"]


@pytest.mark.parametrize("path", [*MEASURED, DS / "superoffload_gh200.json"], ids=lambda p: p.name)
def test_emit_with_the_user_file_as_base_gives_the_file_back(path: Path) -> None:
    sc = _from_ds(path, 2048) if path in MEASURED else load_scenario(load_ds_mapping(
        path, DS / "models" / "llama-3-8b.json", RunInputs(hardware="gh200")).scenario)
    base = json.loads(path.read_text())
    assert ds_config_from_scenario(sc, base).config == base


def test_emit_keeps_hf_auto_values_where_the_trainer_default_gives_the_same() -> None:
    path = DS / "hf_trainer_zero3_offload_auto.json"
    base = json.loads(path.read_text())
    mapping = load_ds_mapping(path, DS / "models" / "measured-llama-1.1b.json",
                              RunInputs(hardware=HW, micro_batch=2, precision="bf16"))
    out = ds_config_from_scenario(load_scenario(mapping.scenario), base).config
    # Batch and precision cannot stay "auto": the Trainer's defaults (8 per device, fp32) are not the scenario.
    assert out["train_micro_batch_size_per_gpu"] == 2 and out["bf16"] == {"enabled": True}
    rest = {k: v for k, v in out.items() if k not in ("train_micro_batch_size_per_gpu", "bf16")}
    assert rest == {k: v for k, v in base.items() if k not in ("train_micro_batch_size_per_gpu", "bf16")}
    # A changed knob replaces the "auto" it no longer equals.
    changed = load_scenario(mapping.scenario, ["schedule.bucket_mb=100", "training.gradient_clipping=0.5"])
    out = ds_config_from_scenario(changed, base).config
    assert out["zero_optimization"]["reduce_bucket_size"] == 50_000_000 and out["gradient_clipping"] == 0.5


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.name)
def test_ds_to_scenario_to_ds_keeps_every_mapped_key(path: Path) -> None:
    size = _run_parts(path)[0]
    mapping = load_ds_mapping(path, DS / "models" / f"measured-llama-{size}.json", RunInputs(hardware=HW))
    emitted = ds_config_from_scenario(load_scenario(mapping.scenario)).config  # no base: from the scenario alone
    original = json.loads(path.read_text())
    for note in mapping.notes:
        if note.status != "mapped" or note.key.startswith("--"):
            continue
        node_a: Any = original
        node_b: Any = emitted
        for part in note.key.split("."):
            node_a, node_b = node_a[part], node_b[part]
        assert node_b == node_a, note.key
    again = map_ds_config(parse_json(json.dumps(emitted), "emitted.json"), HfModel(model=mapping.scenario["model"]),
                          RunInputs(hardware=HW)).scenario
    for section in ("training", "schedule", "cluster"):
        assert again[section] == mapping.scenario[section]


def _expressible_knobs(sc: Scenario, unsaid: list[Unsaid]) -> dict[str, Any]:
    said = {u.key for u in unsaid}
    knobs = sc.schedule.model_dump()
    return {k: v for k, v in knobs.items() if f"schedule.{k}" not in said}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_scenario_is_written_with_names_deepspeed_knows(path: Path) -> None:
    sc = load_scenario(path)
    if registry.SYSTEMS[sc.schedule.system].deepspeed is None:
        pytest.skip(f"{sc.schedule.system} is no DeepSpeed system (its own format: tests/test_framework_inputs.py)")
    result = ds_config_from_scenario(sc)
    cfg = result.config
    known_zero = {f"zero_optimization.{k}" for k in DS_KEYS["zero_optimization"]}
    for section in ("offload_optimizer", "offload_param"):
        known_zero |= {f"zero_optimization.{section}.{k}" for k in DS_KEYS[f"zero_optimization.{section}"]}
    assert emitted_zero_keys(cfg) <= known_zero
    assert set(cfg) <= set(TOP_MAPPED) | set(TOP_IGNORED)
    # Read back with what a DeepSpeed config cannot say taken from the scenario: the same training, cluster and
    # every knob the emitter did not list as inexpressible.
    back = map_ds_config(parse_json(json.dumps(cfg), "emitted.json"), HfModel(model=sc.model.model_dump()),
                         RunInputs(hardware=sc.hardware.name, gpus=sc.cluster.gpus, seq_len=sc.training.seq_len,
                                   activation_checkpointing=sc.training.activation_checkpointing)).scenario
    again = load_scenario({**back, "hardware": sc.hardware.model_dump()})
    model_code = {"clip_rate", "iterations", "loss_chunk_tokens", "stack", "real_tokens_per_sample"}
    t0 = sc.training.model_dump(exclude=model_code)
    assert again.training.model_dump(exclude=model_code) == t0
    assert (again.cluster.gpus, again.cluster.dp, again.cluster.sequence_parallel) == (
        sc.cluster.gpus, sc.cluster.dp, sc.cluster.sequence_parallel)
    assert again.schedule.system == sc.schedule.system
    if getattr(sc.schedule, "implementation", "deepspeed") == "deepspeed":
        mine, theirs = _expressible_knobs(sc, result.unsaid), again.schedule.model_dump()
        if mine.get("weight_placement") == "auto":
            mine["weight_placement"] = "flow" if _weight_flow(sc) else "stationary"
        assert {k: theirs[k] for k in mine} == mine


_GH200 = load_profile("gh200")
_LLAMA = {"name": "llama-1.1b", "layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn": 5632,
          "ffn_kind": "swiglu", "vocab": 32000}


@st.composite
def _deepspeed_scenarios(draw: st.DrawFn) -> Scenario:
    system = draw(st.sampled_from(["gpu_only", "zero_offload", "zero3_offload", "zero_infinity", "superoffload"]))
    sched: dict[str, Any] = {"system": system}
    if system != "gpu_only":
        sched |= {"implementation": "deepspeed", "pin_memory": draw(st.booleans()),
                  "overlap_comm": draw(st.booleans()), "bucket_mb": draw(st.sampled_from([50.0, 400.0, 1000.0]))}
    if system in ("zero_offload", "zero3_offload", "zero_infinity"):
        sched["cpu_adam"] = draw(st.sampled_from(["cpu_adam", "torch"]))
    if system in ("zero3_offload", "zero_infinity", "superoffload"):
        sched["sub_group_elements"] = draw(st.sampled_from([1e8, 6e8, 1e9]))
    if system == "zero_infinity":
        sched["prefetch_layers"] = draw(st.integers(0, 3))
    if system == "superoffload":
        sched |= {"gpu_optimizer_fraction": draw(st.sampled_from([0.0, 0.1, 0.25, 0.5])),
                  "cpu_adam_core_fraction": draw(st.sampled_from([0.5, 0.8, 0.9, 1.0])),
                  "weight_placement": draw(st.sampled_from(["stationary", "flow"]))}
    gpus = draw(st.sampled_from([1, 2, 4]))
    data = {"name": "h", "hardware": _GH200, "model": _LLAMA, "schedule": sched, "cluster": {"gpus": gpus},
            "training": {"seq_len": 1024, "micro_batch": draw(st.integers(1, 8)), "grad_accum": draw(st.integers(1, 4)),
                         "precision": draw(st.sampled_from(["bf16", "fp16"])),
                         "gradient_clipping": draw(st.sampled_from([0.0, 1.0])),
                         "activation_checkpointing": draw(st.booleans())}}
    return scenario_from_data(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_deepspeed_scenarios())
def test_deepspeed_scenarios_survive_the_round_trip(sc: Scenario) -> None:
    result = ds_config_from_scenario(sc)
    assert not [n for n in result.not_expressible if n.startswith("schedule.")]
    back = map_ds_config(parse_json(json.dumps(result.config), "emitted.json"), HfModel(model=sc.model.model_dump()),
                         RunInputs(hardware="gh200", gpus=sc.cluster.gpus, seq_len=sc.training.seq_len,
                                   activation_checkpointing=sc.training.activation_checkpointing)).scenario
    again = scenario_from_data({**back, "hardware": _GH200})
    assert again.model_dump(exclude={"name", "description"}) == sc.model_dump(exclude={"name", "description"})


# ---- DeepSpeed's own parser, where DeepSpeed is installed (the GPU machine; not CI) ----------------------
def _deepspeed_config_class() -> Any:
    ds_config = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed is not installed")
    return ds_config


def _emitted_configs() -> list[tuple[str, dict[str, Any], int]]:
    out = []
    for path in SHIPPED:
        sc = load_scenario(path)
        out.append((path.name, ds_config_from_scenario(sc).config, sc.cluster.dp))
    for path in MEASURED:
        sc = _from_ds(path, 2048)
        out.append((path.name, ds_config_from_scenario(sc, json.loads(path.read_text())).config, 1))
    return out


@pytest.mark.device
def test_deepspeed_parses_every_emitted_config(monkeypatch: pytest.MonkeyPatch) -> None:
    ds_config = _deepspeed_config_class()
    checked = 0
    for name, cfg, dp in _emitted_configs():
        # DeepSpeedConfig asks torch.distributed for the world size; outside a launcher it assumes 1.
        world = dp * cfg.get("sequence_parallel_size", 1)
        monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
        monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, w=world, **k: w)
        parsed = ds_config.DeepSpeedConfig(json.loads(json.dumps(cfg)))
        zero = cfg.get("zero_optimization", {})
        assert parsed.zero_optimization_stage == zero.get("stage", 0), name
        assert parsed.train_micro_batch_size_per_gpu == cfg["train_micro_batch_size_per_gpu"], name
        assert parsed.gradient_accumulation_steps == cfg["gradient_accumulation_steps"], name
        assert parsed.gradient_clipping == cfg["gradient_clipping"], name
        off = zero.get("offload_optimizer")
        if off:
            z = parsed.zero_config
            assert z.offload_optimizer.device == off["device"], name  # "cpu", or "nvme" for ZeRO-Infinity
            assert z.offload_optimizer.pin_memory == off["pin_memory"], name
            assert z.offload_optimizer.super_offload == off.get("super_offload", False), name
            assert z.offload_optimizer.ratio == off.get("ratio", 1.0), name
            # A config emitted over the user's own file keeps the user's keys: an absent key is DeepSpeed's default
            # (runtime/zero/config.py: overlap_comm true at stage 3 only, reduce_bucket_size 5e8).
            assert z.overlap_comm == zero.get("overlap_comm", zero.get("stage") == 3), name
            assert z.reduce_bucket_size == zero.get("reduce_bucket_size", 500_000_000), name
        off_param = zero.get("offload_param")
        if off_param:
            assert parsed.zero_config.offload_param.device == off_param["device"], name
        checked += 1
    assert checked == len(SHIPPED) + len(MEASURED)


@pytest.mark.device
def test_schema_data_matches_the_installed_deepspeed() -> None:
    _deepspeed_config_class()
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    def names(model: Any) -> set[str]:
        return {n for n, f in model.model_fields.items()} | {f.alias for f in model.model_fields.values() if f.alias}

    from sosim.schedules.blocks.ds_schema import DS_KEYS_ONE_VERSION

    zero = names(DeepSpeedZeroConfig)
    assert DS_KEYS["zero_optimization"] <= zero
    assert zero - DS_KEYS["zero_optimization"] <= DS_KEYS_ONE_VERSION["zero_optimization"]
    assert names(DeepSpeedZeroOffloadOptimizerConfig) == DS_KEYS["zero_optimization.offload_optimizer"]
    assert names(DeepSpeedZeroOffloadParamConfig) == DS_KEYS["zero_optimization.offload_param"]


# ---- DeepSpeed's pydantic schema from a source tree (no torch needed) -------------------------------------
# SOSIM_DEEPSPEED_SRC names an unpacked DeepSpeed wheel or checkout (the folder holding deepspeed/). Its
# ZeRO config models are loaded with torch and DeepSpeed's logger stubbed: they need neither to validate.
def _zero_config_module() -> Any:
    import importlib.util
    import logging
    import os
    import sys
    import types

    src = os.environ.get("SOSIM_DEEPSPEED_SRC")
    if not src or not (Path(src) / "deepspeed/runtime/zero/config.py").is_file():
        pytest.skip("set SOSIM_DEEPSPEED_SRC to a DeepSpeed source tree")
    root = Path(src)
    saved = {k: v for k, v in sys.modules.items() if k == "torch" or k.startswith("deepspeed")}
    stubs: dict[str, types.ModuleType] = {}
    torch = types.ModuleType("torch")
    torch.dtype = type("dtype", (), {})  # type: ignore[attr-defined]
    stubs["torch"] = torch
    for pkg in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.zero", "deepspeed.runtime.zenflow"):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(root / pkg.replace(".", "/"))]
        stubs[pkg] = mod
    utils = types.ModuleType("deepspeed.utils")
    utils.logger = logging.getLogger("deepspeed-stub")  # type: ignore[attr-defined]
    stubs["deepspeed.utils"] = utils
    sys.modules.update(stubs)
    try:
        module = None
        for name in ("deepspeed.runtime.config_utils", "deepspeed.runtime.zero.offload_config",
                     "deepspeed.runtime.zenflow.zenflow_config", "deepspeed.runtime.zero.leaf_module_config",
                     "deepspeed.runtime.zero.config"):
            spec = importlib.util.spec_from_file_location(name, root / (name.replace(".", "/") + ".py"))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        return module
    finally:
        for k in [k for k in sys.modules if k == "torch" or k.startswith("deepspeed")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.device
def test_deepspeed_zero_models_accept_every_emitted_config() -> None:
    zc = _zero_config_module()
    for name, cfg, _ in _emitted_configs():
        zero = zc.get_zero_config(cfg)  # DeepSpeedZeroConfig: extra keys forbidden, types and validators checked
        mine = cfg.get("zero_optimization", {})
        assert int(zero.stage) == mine.get("stage", 0), name
        if "offload_optimizer" in mine:
            off = mine["offload_optimizer"]
            assert zero.offload_optimizer.super_offload == off.get("super_offload", False), name
            assert zero.offload_optimizer.ratio == off.get("ratio", 1.0), name
            assert zero.overlap_comm == mine["overlap_comm"], name


@pytest.mark.device
def test_schema_data_matches_the_deepspeed_source() -> None:
    zc = _zero_config_module()

    def names(model: Any) -> set[str]:
        return set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}

    from sosim.schedules.blocks.ds_schema import DS_KEYS_ONE_VERSION

    zero = names(zc.DeepSpeedZeroConfig)
    assert DS_KEYS["zero_optimization"] <= zero
    assert zero - DS_KEYS["zero_optimization"] <= DS_KEYS_ONE_VERSION["zero_optimization"]
    assert names(zc.DeepSpeedZeroOffloadOptimizerConfig) == DS_KEYS["zero_optimization.offload_optimizer"]
    assert names(zc.DeepSpeedZeroOffloadParamConfig) == DS_KEYS["zero_optimization.offload_param"]
