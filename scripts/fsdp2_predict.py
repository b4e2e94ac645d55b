"""Predict the measured FSDP2 CPU-offload steps (scripts/fsdp2_train_step.py's fsdp2_steps.csv) and report the
errors: one scenario per run, built from the run's own conditions (model size, sequence, micro-batch, Adam
implementation, pin_memory, resharding, and the torch threads the run recorded), on the lent machine's
profile. Nothing of the steps themselves feeds the prediction: the costs come from the profile's component
tables (layers, copies, and the torch AdamW bench rows).

  python3 scripts/fsdp2_predict.py /work/device_results/.../fsdp2/fsdp2_steps.csv [--hardware h200-pcie-gen5-x86]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sosim.run.loader import load_scenario
from sosim.run.simulate import simulate


def scenario_of(row: dict[str, str], hardware: str) -> dict:
    model = {"name": f"llama-{row['model']}", "layers": int(row["layers"]), "hidden": int(row["hidden"]),
             "heads": int(row["heads"]), "kv_heads": int(row["kv_heads"]), "ffn": int(row["ffn"]),
             "ffn_kind": "swiglu", "vocab": int(row["vocab"])}
    return {"name": row["run_id"], "hardware": hardware, "model": model,
            "training": {"seq_len": int(row["seq"]), "micro_batch": int(row["micro_batch"]),
                         "activation_checkpointing": row["activation_checkpointing"] == "true",
                         "precision": "bf16", "gradient_clipping": 0.0},
            "schedule": {"system": "fsdp2_offload", "adam_impl": row["adam_impl"],
                         "pin_memory": row["pin_memory"] == "true",
                         "reshard_after_forward": row["reshard_after_forward"] == "true", "launcher": "other",
                         "activation_offload": row.get("activation_offload") == "true"},
            "cluster": {"gpus": 1, "cpu_threads_per_rank": int(row["torch_threads"])}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps_csv", type=Path, nargs="+")
    p.add_argument("--hardware", default="h200-pcie-gen5-x86")
    args = p.parse_args(argv)
    errors = []
    print(f"{'run':48s} {'measured s':>10s} {'predicted':>10s} {'error':>8s}  exposed cpu-opt / h2d / d2h (s)")
    for path in args.steps_csv:
        with path.open(newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if r.get("timing") == "unsynced" and r.get("status") == "ok"
                    and r.get("cpu_offload") == "true"]
        for row in rows:
            m = simulate(load_scenario(scenario_of(row, args.hardware))).metrics
            measured, predicted = float(row["step_median_s"]), float(m["step_time_s"])
            err = predicted / measured - 1
            errors.append(err)
            print(f"{row['run_id']:48s} {measured:10.3f} {predicted:10.3f} {err:+8.1%}  "
                  f"{m['exposed_cpu_optimizer_s']:.3f} / {m['exposed_h2d_s']:.3f} / {m['exposed_d2h_s']:.3f}")
    if errors:
        print(f"\n{len(errors)} runs: mean |error| {statistics.mean(abs(e) for e in errors):.1%}, "
              f"worst {max(errors, key=abs):+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
