"""Tiny, fully specified scenarios whose timelines can be computed by hand in the tests."""

from __future__ import annotations

import copy
from typing import Any

SRC = "test fixture"

TINY_PROFILE: dict[str, Any] = {
    "name": "tiny",
    "gpu": {
        "name": "tinygpu", "peak_bf16_tflops": 100.0, "hbm_gib": 80.0, "hbm_GBps": 1000.0,
        "hbm_efficiency": 1.0, "reserved_gib": 0.0, "gemm_efficiency": [[1.0, 0.5]],
        "attention_efficiency": 0.5, "attention_bwd_factor": 2.0, "layer_overhead_us": 0.0,
        "sources": {k: SRC for k in ("peak_bf16_tflops", "hbm_gib", "hbm_GBps", "hbm_efficiency", "reserved_gib",
                                     "gemm_efficiency", "attention_efficiency", "attention_bwd_factor",
                                     "layer_overhead_us")},
    },
    "cpu": {
        "name": "tinycpu", "cores": 8, "mem_gib": 512.0, "mem_GBps": 100.0,
        "adam_s_by_gparams": {"cpu_adam": [[1.0, 0.5]], "torch": [[1.0, 2.0]]},
        "adam_ref_cores": 8, "adam_saturation_cores": 8, "cast_GBps": 50.0, "reserved_gib": 0.0,
        "sources": {k: SRC for k in ("cores", "mem_gib", "mem_GBps", "adam_s_by_gparams", "adam_ref_cores",
                                     "adam_saturation_cores", "cast_GBps", "reserved_gib")},
    },
    "link": {
        "kind": "pcie", "h2d_GBps": 20.0, "d2h_GBps": 20.0, "bidir_GBps": 40.0, "pageable_factor": 0.5,
        "latency_us": 0.0,
        "sources": {k: SRC for k in ("h2d_GBps", "d2h_GBps", "bidir_GBps", "pageable_factor", "latency_us")},
    },
}


def tiny_scenario(schedule: dict[str, Any], **training: Any) -> dict[str, Any]:
    t = {"seq_len": 512, "micro_batch": 2, "activation_checkpointing": False, "precision": "bf16",
         "gradient_clipping": 1.0}
    t.update(training)
    return {
        "name": "tiny",
        "hardware": copy.deepcopy(TINY_PROFILE),
        "model": {"layers": 2, "hidden": 512, "heads": 8, "ffn_kind": "gelu", "vocab": 1024},
        "training": t,
        "schedule": schedule,
    }


def random_plan_strategy(durations: Any) -> Any:
    """Hypothesis strategy: plans of 1-40 ops on the GPU, both link directions and the CPU optimizer, each
    depending on up to 3 earlier ops, with durations drawn from ``durations``."""
    from hypothesis import strategies as st

    from sosim.engine.plan import CPU_OPT, D2H, GPU, H2D, Phase, Plan

    @st.composite
    def plans(draw: st.DrawFn) -> Plan:
        plan = Plan()
        n = draw(st.integers(1, 40))
        for i in range(n):
            resource = draw(st.sampled_from([GPU, D2H, H2D, CPU_OPT]))
            duration = draw(durations)
            deps = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
            plan.add(resource, f"op{i}", duration, deps, phase=Phase.FORWARD)
        return plan

    return plans()
