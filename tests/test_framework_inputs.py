"""torchtitan TOML and Megatron-LM arguments as inputs (located errors) and outputs (read back exactly), and
``sosim tune`` writing an FSDP2 or Megatron winner in its own format (issue 24)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sosim.answers.tune.write_deepspeed import _comparable
from sosim.answers.tune.write_frameworks import framework_path, read_back
from sosim.formats.megatron_args import load_megatron, megatron_args, read_megatron
from sosim.formats.torchtitan import llama3_ffn, llama3_model, read_torchtitan, torchtitan_toml
from sosim.inputs.errors import ConfigError
from sosim.run.loader import load_scenario

JOB = """[job]
dump_folder = "./outputs"

[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 2
seq_len = 4096
enable_cpu_offload = true
max_norm = 1.0

[activation_checkpoint]
mode = "full"

[optimizer]
name = "AdamW"
implementation = "foreach"
"""


def test_llama3_flavors_have_torchtitans_ffn_sizes() -> None:
    # torchtitan models/llama3: 8B 14336, 70B 28672, 405B 53248 (the published Llama 3 shapes).
    assert llama3_ffn(4096, 1.3, 1024) == 14336
    assert llama3_ffn(8192, 1.3, 4096) == 28672
    assert llama3_ffn(16384, 1.2, 4096) == 53248
    assert llama3_model("8B")["kv_heads"] == 8


def test_torchtitan_job_reads_into_fsdp2_offload(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(JOB)
    m = read_torchtitan(str(path), "h200-pcie-gen5-x86", None, None)
    assert m.scenario["schedule"] == {"system": "fsdp2_offload", "adam_impl": "foreach", "pin_memory": True,
                                      "reshard_after_forward": True, "launcher": "torchrun"}
    assert m.scenario["training"]["micro_batch"] == 2 and m.scenario["training"]["seq_len"] == 4096
    assert m.scenario["training"]["activation_checkpointing"] is True
    assert any("dump_folder" in n for n in m.notes)  # ignored keys are listed


def test_torchtitan_errors_are_located(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "9B"\n\n[training]\nlocal_batch_size = "two"\n'
                    "enable_cpu_offload = false\n[parallelism]\ntensor_parallel_degree = 2\n")
    with pytest.raises(ConfigError) as err:
        read_torchtitan(str(path), "h200-pcie-gen5-x86", None, None)
    lines = err.value.problems
    assert f"{path}:3: [model] flavor" in lines[0]
    assert any(line.startswith(f"{path}:6: [training] local_batch_size: expected an integer") for line in lines)
    assert any(line.startswith(f"{path}:7: [training] enable_cpu_offload") for line in lines)
    assert any(line.startswith(f"{path}:9: [parallelism] tensor_parallel_degree") for line in lines)
    path.write_text("[training\nx = 1\n")
    with pytest.raises(ConfigError, match=r":1: TOML syntax"):
        read_torchtitan(str(path), "h200-pcie-gen5-x86", None, None)


ARGS = """# a NeMo-RL style run
--num-layers 4 --hidden-size 1024 --num-attention-heads 8 \\
--group-query-attention --num-query-groups 2 --swiglu --vocab-size 32001 \\
--seq-length 2048 --micro-batch-size 2 --bf16 --lr 3e-4 \\
--optimizer-cpu-offload --optimizer-offload-fraction 0.5 --use-precision-aware-optimizer
"""


def test_megatron_arguments_read_with_megatrons_defaults() -> None:
    m = read_megatron(ARGS, "args.txt", "h200-pcie-gen5-x86", None, None)
    model = m.scenario["model"]
    # --ffn-hidden-size unset with --swiglu: int(4h x 2/3 / 64) x 64; vocab padded to a multiple of 128.
    assert model["ffn"] == int(4 * 1024 * 2 / 3 / 64) * 64 == 2688
    assert model["vocab"] == 32128 and model["kv_heads"] == 2 and model["tied_embeddings"] is True
    assert m.scenario["schedule"]["offload_fraction"] == 0.5
    assert m.scenario["schedule"]["overlap_d2h_h2d"] is False
    assert m.scenario["training"]["gradient_clipping"] == 1.0  # --clip-grad default
    assert any("--lr" in n for n in m.notes)


def test_megatron_errors_are_located() -> None:
    text = "--num-layers 2 --hidden-size 1024\n--num-attention-heads 8 --vocab-size 32000 --seq-length x\n" \
           "--optimizer-cpu-offload --optimizer-offload-fraction 1.5\n"
    with pytest.raises(ConfigError) as err:
        read_megatron(text, "args.txt", "h200-pcie-gen5-x86", None, None)
    lines = err.value.problems
    assert "args.txt:2: --seq-length: expected an integer" in lines[1] or any(
        "args.txt:2: --seq-length: expected an integer" in line for line in lines)
    assert any(line.startswith("args.txt:3: --optimizer-cpu-offload: Megatron asserts") for line in lines)
    assert any(line.startswith("args.txt:3: --optimizer-offload-fraction: 1.5 out of range") for line in lines)
    assert any("--bf16" in line for line in lines)


def _scenario(schedule: dict, model: dict | None = None) -> object:
    return load_scenario({"name": "rt", "hardware": "h200-pcie-gen5-x86",
                          "model": model or llama3_model("8B"),
                          "training": {"seq_len": 4096, "micro_batch": 1, "activation_checkpointing": False,
                                       "gradient_clipping": 0.5},
                          "schedule": schedule})


@pytest.mark.parametrize("schedule", [
    {"system": "fsdp2_offload", "adam_impl": "forloop", "reshard_after_forward": False},
    {"system": "fsdp2_offload", "adam_impl": "fused"},
    {"system": "megatron_offload", "offload_fraction": 0.25, "overlap_d2h_h2d": True},
    {"system": "megatron_offload", "offload_fraction": 1.0, "pin_cpu_grads": False, "activation_offload": True},
])
def test_written_framework_config_reads_back_exactly(tmp_path: Path, schedule: dict) -> None:
    sc = _scenario(schedule)
    path = framework_path(tmp_path / "ds_config.tuned.json", sc.schedule.system)
    if sc.schedule.system == "fsdp2_offload":
        text, cannot = torchtitan_toml(sc)
        assert path.suffix == ".toml"
    else:
        text, cannot = megatron_args(sc)
        assert path.name.endswith(".megatron_args.txt")
    assert cannot == []
    path.write_text(text)
    want, back = _comparable(sc), _comparable(read_back(path, sc))
    differ = sorted(k for k in set(want) | set(back) if want.get(k) != back.get(k) and k != "model.name")
    assert differ == []


def test_megatron_args_as_a_string_or_a_file(tmp_path: Path) -> None:
    path = tmp_path / "args.txt"
    path.write_text(ARGS)
    from_file = load_megatron(str(path), "h200-pcie-gen5-x86", None, None).scenario
    from_text = load_megatron(ARGS.split("\n", 1)[1], "h200-pcie-gen5-x86", None, None).scenario
    assert {k: v for k, v in from_file.items() if k not in ("name", "description")} == \
        {k: v for k, v in from_text.items() if k not in ("name", "description")}


@pytest.mark.parametrize("system", ["fsdp2_offload", "megatron_offload"])
def test_tune_writes_the_winner_in_its_framework_format(tmp_path: Path, system: str) -> None:
    from sosim.answers.tune import TuneOptions, tune
    from sosim.answers.tune.write_frameworks import write_winner

    base = _scenario({"system": system}, model={"name": "small", "layers": 4, "hidden": 1024, "heads": 8,
                                                "kv_heads": 2, "ffn": 2816, "ffn_kind": "swiglu",
                                                "vocab": 32000})
    result = tune(base, TuneOptions(systems=(system,), jobs=1, budget=200))
    assert result.best is not None and result.best.scenario is not None
    written = write_winner(result, tmp_path / "ds_config.tuned.json")
    assert Path(written["path"]).exists()
    # Only the launcher's GPU count is outside the file: the rest reads back as the winner.
    assert [c["key"] for c in written["outside_config"]] == ["cluster.gpus"]


def test_cli_reads_a_torchtitan_job_and_refuses_a_bad_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sosim.cli import main

    good = tmp_path / "job.toml"
    good.write_text(JOB)
    out = tmp_path / "back.toml"
    assert main(["run", "--torchtitan", str(good), "--hardware", "gh200", "--no-bands",
                 "--emit-torchtitan", str(out)]) == 0
    assert 'implementation = "foreach"' in out.read_text()
    capsys.readouterr()
    bad = tmp_path / "bad.toml"
    bad.write_text("[training]\nenable_cpu_offload = false\n")
    assert main(["run", "--torchtitan", str(bad), "--hardware", "gh200"]) == 2
    assert f"{bad}:2: [training] enable_cpu_offload" in capsys.readouterr().err
    assert main(["run", "--megatron-args", "--num-layers 2", "--hardware", "gh200"]) == 2
    assert "--megatron-args:1: --hidden-size: required" in capsys.readouterr().err
