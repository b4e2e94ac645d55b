"""FSDP2 CPU offload, Megatron's hybrid optimizer and activation offload (issue 24): hand-computed footprints
and op durations on the tiny analytic profile, the launcher's thread rule, and the knobs' checks."""

from __future__ import annotations

import pytest
from helpers import tiny_scenario

from sosim.hardware import model as tm
from sosim.hardware.machine import Machine
from sosim.inputs.errors import ConfigError
from sosim.run.loader import load_scenario
from sosim.run.simulate import make_costs, simulate
from sosim.schedules import fsdp2_offload, megatron_offload
from sosim.schedules.blocks import activation_offload


def _sc(schedule: dict, **training: object):
    return load_scenario(tiny_scenario(schedule, **training))


def _threads(sc) -> int:
    return Machine.from_scenario(sc).threads_per_rank


def _ops(sc, prefix: str) -> list:
    system = fsdp2_offload if sc.schedule.system == "fsdp2_offload" else megatron_offload
    plan = system.build_plan(sc, make_costs(sc), Machine.from_scenario(sc))
    return [op for op in plan.ops if op.name.startswith(prefix) and op.iteration == 0]


def test_fsdp2_host_holds_16_bytes_per_parameter() -> None:
    sc = _sc({"system": "fsdp2_offload"})
    p = tm.total_params(sc.model)
    host = fsdp2_offload.memory_usage(sc).cpu_bytes
    assert host == {"fp32_params": 4 * p, "fp32_grads": 4 * p, "adam_moments": 8 * p}


def test_fsdp2_gpu_keeps_two_layers_unless_not_resharded() -> None:
    def usage(reshard: bool) -> dict:
        data = tiny_scenario({"system": "fsdp2_offload", "reshard_after_forward": reshard})
        data["model"]["layers"] = 6
        return fsdp2_offload.memory_usage(load_scenario(data)).gpu_bytes

    layer = tm.layer_params(_sc({"system": "fsdp2_offload"}).model)
    assert usage(True)["layer_bf16_params"] == 2 * 2 * layer  # the unit in use and the prefetched one, bf16
    assert usage(False)["layer_bf16_params"] == 6 * 2 * layer  # every layer stays from forward to backward


def test_fsdp2_adam_op_is_the_profile_torch_rate_when_no_variant_is_measured() -> None:
    # tiny profile: torch Adam 2.0 s per 1e9 parameters on all 8 reference cores, no table.
    sc = _sc({"system": "fsdp2_offload", "adam_impl": "forloop"}, gradient_clipping=0.0)
    (adam,) = _ops(sc, "torch_adamw_forloop")
    assert adam.duration_s == pytest.approx(2.0 * tm.total_params(sc.model) / 1e9)


def test_fsdp2_copies_each_layer_in_twice_with_reshard_and_once_without() -> None:
    sc = _sc({"system": "fsdp2_offload"})
    layers = sc.model.layers
    fetches = _ops(sc, "fsdp_h2d_")
    assert len(fetches) == 2 * layers + 1  # forward and backward per layer, the root once
    layer_bytes = 4 * tm.layer_params(sc.model)  # fp32 shards: 4 B/param
    assert {op.n_bytes for op in fetches if "layer" in op.name} == {layer_bytes}
    sc_off = _sc({"system": "fsdp2_offload", "reshard_after_forward": False})
    assert len(_ops(sc_off, "fsdp_h2d_")) == layers + 1
    # one fp32 gradient copy per layer and one for the root (4 B/param of the whole model in all)
    d2h = _ops(sc, "fsdp_grad_d2h")
    assert len(d2h) == layers + 1
    assert sum(op.n_bytes for op in d2h) == pytest.approx(4 * tm.total_params(sc.model))


def test_fsdp2_pageable_memory_is_slower_than_pinned() -> None:
    pinned = simulate(_sc({"system": "fsdp2_offload"})).metrics["step_time_s"]
    pageable = simulate(_sc({"system": "fsdp2_offload", "pin_memory": False})).metrics["step_time_s"]
    assert pageable > pinned


def test_torchrun_gives_each_of_several_ranks_one_thread() -> None:
    base = {"name": "x", "hardware": "h200x2-pcie-gen5-x86",
            "model": {"layers": 2, "hidden": 512, "heads": 8, "vocab": 1024},
            "training": {"seq_len": 512, "micro_batch": 1}, "cluster": {"gpus": 2}}
    two = load_scenario({**base, "schedule": {"system": "fsdp2_offload"}})
    assert _threads(two) == 1  # torch/distributed/run.py: OMP_NUM_THREADS=1 with nproc_per_node > 1
    other = load_scenario({**base, "schedule": {"system": "fsdp2_offload", "launcher": "other"}})
    assert _threads(other) == two.hardware.cpu.cores
    stated = load_scenario({**base, "schedule": {"system": "fsdp2_offload"},
                            "cluster": {"gpus": 2, "cpu_threads_per_rank": 6}})
    assert _threads(stated) == 6
    one = load_scenario({**base, "schedule": {"system": "fsdp2_offload"}, "cluster": {"gpus": 1}})
    assert _threads(one) == one.hardware.cpu.cores
    megatron = load_scenario({**base, "schedule": {"system": "megatron_offload"}})
    assert _threads(megatron) == 1
    ds = load_scenario({**base, "schedule": {"system": "zero_offload"}})
    assert _threads(ds) == ds.hardware.cpu.cores  # DeepSpeed's launcher sets no OMP_NUM_THREADS


def test_megatron_offloads_the_first_parameters_until_the_fraction() -> None:
    # offload_params_numel < threshold is tested before each parameter: the one crossing it still goes.
    assert megatron_offload.cpu_elements([10, 10, 10, 10], 0.5) == [True, True, False, False]
    assert megatron_offload.cpu_elements([10, 10, 10, 10], 0.45) == [True, True, False, False]
    assert megatron_offload.cpu_elements([10, 10, 10, 10], 0.0) == [False] * 4
    assert megatron_offload.cpu_elements([10, 10, 10, 10], 1.0) == [True] * 4


def test_megatron_memory_moves_from_hbm_to_host_with_the_fraction() -> None:
    p = tm.total_params(_sc({"system": "megatron_offload"}).model)
    none = megatron_offload.memory_usage(_sc({"system": "megatron_offload", "offload_fraction": 0.0}))
    full = megatron_offload.memory_usage(_sc({"system": "megatron_offload", "offload_fraction": 1.0}))
    assert none.cpu_peak_bytes == 0
    assert none.gpu_bytes["gpu_optimizer_state"] == 12 * p
    assert full.cpu_peak_bytes == 16 * p and full.gpu_bytes["gpu_optimizer_state"] == 0
    assert full.gpu_peak_bytes == none.gpu_peak_bytes - 12 * p


def test_megatron_copies_per_cpu_parameter_and_overlap_helps() -> None:
    sc = _sc({"system": "megatron_offload", "offload_fraction": 1.0})
    p = tm.total_params(sc.model)
    d2h = _ops(sc, "hdo_grad_d2h")
    assert len(d2h) == len(_ops(sc, "hdo_param_h2d")) > 1
    assert sum(op.n_bytes for op in d2h) == pytest.approx(4 * p)  # fp32 gradients
    assert sum(op.n_bytes for op in _ops(sc, "hdo_param_h2d")) == pytest.approx(2 * p)  # bf16 back
    serial = simulate(sc).metrics["step_time_s"]
    overlapped = simulate(_sc({"system": "megatron_offload", "overlap_d2h_h2d": True})).metrics["step_time_s"]
    assert overlapped <= serial


def test_megatron_without_precision_aware_optimizer_is_refused_as_megatron_does() -> None:
    with pytest.raises(ConfigError, match="use-precision-aware-optimizer"):
        _sc({"system": "megatron_offload", "use_precision_aware_optimizer": False})


def test_activation_offload_needs_checkpointing_off_and_moves_every_layer() -> None:
    with pytest.raises(ConfigError, match="activation_checkpointing: false"):
        _sc({"system": "fsdp2_offload", "activation_offload": True}, activation_checkpointing=True)
    sc = _sc({"system": "fsdp2_offload", "activation_offload": True, "activation_offload_streams": True})
    tokens = sc.training.micro_batch * sc.training.seq_len
    per_layer = tm.activation_bytes_per_token_layer(sc.model) * tokens
    assert activation_offload.host_activation_bytes(sc) == sc.model.layers * per_layer
    out, back = _ops(sc, "act_d2h"), _ops(sc, "act_h2d")
    assert len(out) == len(back) == sc.model.layers
    assert {op.n_bytes for op in out + back} == {per_layer}


def test_save_on_cpu_also_moves_the_head_and_is_serial_with_compute() -> None:
    streams = _sc({"system": "fsdp2_offload", "activation_offload": True, "activation_offload_streams": True})
    serial = _sc({"system": "fsdp2_offload", "activation_offload": True})  # torch's save_on_cpu
    head = 6.0 * serial.training.micro_batch * serial.training.seq_len * serial.model.vocab  # logits + fp32 softmax
    out = _ops(serial, "act_d2h")
    assert len(out) == serial.model.layers + 1 and out[-1].n_bytes == head
    assert fsdp2_offload.memory_usage(serial).cpu_bytes["offloaded_activations"] == pytest.approx(
        activation_offload.host_activation_bytes(streams) + head)
    assert simulate(serial).metrics["step_time_s"] > simulate(streams).metrics["step_time_s"]


def test_torch_adam_uses_the_measured_variant_and_its_per_tensor_cost(tmp_path) -> None:
    from sosim.calibrate.records import COLUMNS
    from sosim.costs.calibration_table import CalibrationTable
    from sosim.costs.torch_adam import BENCH_TENSOR_NUMEL, per_tensor_s, torch_adam_s

    rows = ["op,variant,dtype,elements,threads,median_s,p10_s,p90_s,n_samples,subgroups"]
    # 1 ns per element at 4 threads, 2 ns at 2 (main curve); sweep: 0.05 s + 1 ms per tensor.
    for e in (1e7, 1e8, 1e9):
        rows.append(f"cpu_adam,torch_fused_dtensor,fp32,{e:g},4,{e * 1e-9},{e * 1e-9},{e * 1e-9},3,")
        rows.append(f"cpu_adam,torch_fused_dtensor,fp32,{e:g},2,{e * 2e-9},{e * 2e-9},{e * 2e-9},3,")
    for n in (12, 48, 191):
        t = 0.05 + 1e-3 * n
        rows.append(f"cpu_adam,torch_fused_dtensor_sweep,fp32,5e7,4,{t},{t},{t},3,{n}")
    path = tmp_path / "m.csv"
    header = rows[0].split(",")
    with path.open("w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for line in rows[1:]:
            values = dict(zip(header, line.split(","), strict=True))
            f.write(",".join(values.get(c, "") for c in COLUMNS) + "\n")
    table = CalibrationTable.from_csv(path)

    class Costs:  # what torch_adam_s reads: the table behind the cost object, and the torch Adam's scaling
        def measured_table(self) -> CalibrationTable:
            return table

        def cpu_adam_s(self, params: float, impl: str, cores: float, total: float) -> float:
            return params * 4e-9 / min(cores, 8)  # scales up to 8 cores

    assert per_tensor_s(table, "torch_fused_dtensor") == pytest.approx(1e-3)
    assert torch_adam_s(Costs(), 1e8, "fused", True, 4, 1e8) == pytest.approx(0.1)
    # 16 threads: the 4-thread row scaled as the profile's torch Adam scales from 4 to 16 (8 cores: x 4/8)
    assert torch_adam_s(Costs(), 1e8, "fused", True, 16, 1e8) == pytest.approx(0.05)
    assert torch_adam_s(Costs(), 1e8, "fused", True, 1, 1e8) == pytest.approx(0.4)  # and from 4 to 1: x 4
    bench = -(-int(1e8) // BENCH_TENSOR_NUMEL)
    assert torch_adam_s(Costs(), 1e8, "fused", True, 4, 1e8, bench + 20) == pytest.approx(0.1 + 20e-3)
    assert torch_adam_s(Costs(), 5e7, "fused", True, 4, 1e8) == pytest.approx(0.05)  # share of the step
