"""A new system is one module plus one registry line: the toy system (tests/toy_system.py) round-trips through
the DeepSpeed emitter and reader and the tuner searches its knobs, with nothing else changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sosim import load_scenario
from sosim.answers.tune import TuneOptions, tune
from sosim.answers.tune.space import search_space
from sosim.formats.dsconfig import RunInputs, ds_config_from_scenario, map_ds_config
from sosim.formats.hf_model import HfModel
from sosim.formats.jsonio import parse_json
from sosim.inputs.errors import ConfigError
from sosim.schedules import registry
from tests import toy_system
from tests.helpers import tiny_scenario

NVME_PARAMS = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
               "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                     "offload_param": {"device": "nvme", "nvme_path": "/x", "buffer_count": 8}}}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one registry line (for this test only).
    monkeypatch.setitem(registry._REGISTERED, "toy", registry.system_of(toy_system, toy_system.ToyKnobs))


def _toy_scenario(**knobs: Any) -> Any:
    data = tiny_scenario({"system": "zero3_offload"}, micro_batch=2)
    data["schedule"] = {"system": "toy", "implementation": "deepspeed", **knobs}
    return load_scenario(data)


def _read(config: dict[str, Any], sc: Any) -> dict[str, Any]:
    inputs = RunInputs(hardware=sc.hardware.name, gpus=sc.cluster.gpus, seq_len=sc.training.seq_len,
                       activation_checkpointing=sc.training.activation_checkpointing)
    return map_ds_config(parse_json(json.dumps(config), "toy.json"), HfModel(model=sc.model.model_dump()),
                         inputs).scenario


def test_without_the_registry_line_the_toy_config_is_not_modelled() -> None:
    sc = load_scenario(tiny_scenario({"system": "zero3_offload"}, micro_batch=2))
    with pytest.raises(ConfigError) as err:
        _read(NVME_PARAMS, sc)
    assert "NVMe offload is modelled for ZeRO stage 3" in err.value.problems[0]


def test_the_toy_round_trips_through_deepspeed_configs(toy: None) -> None:
    sc = _toy_scenario(param_buffer_count=8, sub_group_elements=2e8)
    config = ds_config_from_scenario(sc).config
    assert config["zero_optimization"]["offload_param"] == {"device": "nvme", "nvme_path": "/local_nvme",
                                                            "buffer_count": 8}
    back = load_scenario({**_read(config, sc), "hardware": sc.hardware.model_dump()})
    assert back.schedule == sc.schedule
    assert back.training == sc.training
    # A user's config in the toy's shape reads as the toy.
    mapped = _read(NVME_PARAMS, sc)
    assert mapped["schedule"]["system"] == "toy" and mapped["schedule"]["param_buffer_count"] == 8


def test_the_tuner_searches_the_toys_knobs(toy: None) -> None:
    assert [k.key for k in search_space("toy")] == ["schedule.sub_group_elements", "schedule.param_buffer_count"]
    result = tune(_toy_scenario(), TuneOptions(systems=("toy",), budget=30, jobs=1, progress=False))
    assert result.best is not None and result.best.system == "toy"
    tried = {e.settings.get("schedule.param_buffer_count") for e in result.evaluations}
    assert {4, 5, 8} <= tried


# ----------------------------------------------------------------- the shipped systems carry theirs, too

SYSTEM_FREE = ["sosim/formats/dsconfig/read.py", "sosim/formats/dsconfig/read_training.py",
               "sosim/formats/dsconfig/mapper.py", "sosim/formats/dsconfig/emit.py", "sosim/formats/dsconfig/cli.py",
               "sosim/schedules/blocks/ds_schema.py", "sosim/answers/tune/space.py"]


def test_dsconfig_and_the_tune_space_name_no_system() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for rel in SYSTEM_FREE:
        text = (root / rel).read_text()
        named = [s for s in registry.SYSTEMS if f'"{s}"' in text or f"'{s}'" in text]
        assert not named, (rel, named)


def test_zeropp_and_the_nvme_tier_carry_their_deepspeed_keys_and_knobs() -> None:
    zero3, nvme = registry.SYSTEMS["zero3"], registry.SYSTEMS["zero_infinity_nvme"]
    assert {k.key for k in zero3.tune_space} == {"schedule.zero_quantized_weights", "schedule.zero_quantized_gradients",
                                                 "schedule.zero_hpz_partition_size"}
    assert {"schedule.offload_param", "schedule.aio_queue_depth", "schedule.pipeline_read"} <= {
        k.key for k in nvme.tune_space}
    sc = load_scenario("dgx2x24_zeropp_18b")
    config = ds_config_from_scenario(sc).config["zero_optimization"]
    assert (config["zero_quantized_weights"], config["zero_hpz_partition_size"]) == (True, 16)
    back = load_scenario({**_read(ds_config_from_scenario(sc).config, sc), "hardware": sc.hardware.model_dump()})
    assert back.schedule == sc.schedule


def test_the_tuner_moves_the_nvme_tiers_knobs() -> None:
    # A small cut of the shipped NVMe scenario (one GPU, four layers) keeps the search quick.
    sc = load_scenario("hgx_zero_infinity_nvme_13b", ["model.layers=4", "cluster.gpus=1", "training.micro_batch=1"])
    result = tune(sc, TuneOptions(systems=("zero_infinity_nvme",), budget=60, jobs=1, progress=False))
    assert result.best is not None and result.best.system == "zero_infinity_nvme"
    tried: dict[str, set[Any]] = {}
    for e in result.evaluations:
        for k, v in e.settings.items():
            tried.setdefault(k, set()).add(v)
    assert tried["schedule.offload_param"] == {"nvme", "cpu", "none"}  # structural: crossed in the first stage
    assert len(tried["schedule.aio_queue_depth"]) > 1 and tried["schedule.pipeline_read"] == {False, True}


def test_at_most_one_shipped_system_claims_any_zero_configuration() -> None:
    import itertools

    from sosim.schedules.system_api import ZeroView

    claimed = 0
    for stage, opt, param, sup in itertools.product(range(4), ("none", "cpu", "nvme"), ("none", "cpu", "nvme"),
                                                    (False, True)):
        view = ZeroView(zero={"stage": stage}, stage=stage, opt_dev=opt, opt={}, param_dev=param, param={},
                        is_super=sup, dp=2, model={})
        names = [n for n, s in registry.SYSTEMS.items() if s.deepspeed is not None and s.deepspeed.claims(view)]
        assert len(names) <= 1, (stage, opt, param, sup, names)
        claimed += len(names)
        # What DeepSpeed itself refuses or sosim does not model is claimed by none.
        if (opt == "cpu" and stage == 0) or (opt == "nvme" and stage < 3):
            assert not names
    # Of the 72: gpu_only 12 (stages 0-2 x param none/cpu x super), zero3 2, zero_offload 8 (stages 1-2 x param
    # none/cpu x super), zero3_offload 1, zero_infinity 1, superoffload 2 (param none/cpu), NVMe 6 (param x super).
    assert claimed == 32


def test_docs_show_the_toy_module_as_it_is() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "systems.md").read_text()
    shown = "\n".join(line[1:] for line in doc.split("+++ b/tests/toy_system.py", 1)[1].split("```", 1)[0]
                      .splitlines() if line.startswith("+"))
    assert shown.strip() == (root / "tests" / "toy_system.py").read_text().strip()
