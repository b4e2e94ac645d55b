"""The measured FSDP2 CPU-offload steps against sosim's prediction (issue 24).

Rows are read from data: every ``calibration/<machine>/fsdp2_steps.csv`` that scripts/fsdp2_train_step.py wrote
(the unsynced row of each run: the true step time). Each run becomes a scenario from its own recorded conditions
(model shape, sequence, micro-batch, checkpointing, AdamW implementation, pin_memory, resharding, activation
offload, and the torch intra-op threads the run had) on the machine's profile; nothing of the step itself feeds
the prediction: the costs are the profile's component tables (layers, copies, the torch AdamW bench rows).
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sosim.inputs.errors import ConfigError
from sosim.inputs.resources import shipped_calibration_dir

STEPS_FILE = "fsdp2_steps.csv"
# The lent H200 machine's profile (its calibration folders are named nvidia-h200-<date>...).
PROFILE_OF_PREFIX = {"nvidia-h200-": "h200-pcie-gen5-x86"}


@dataclass(frozen=True)
class Fsdp2Run:
    run_id: str
    machine: str
    measured_s: float
    scenario: dict[str, Any]


@dataclass(frozen=True)
class Fsdp2Check:
    run: Fsdp2Run
    predicted_s: float
    metrics: dict[str, Any]

    @property
    def error(self) -> float:
        return self.predicted_s / self.run.measured_s - 1.0


def scenario_of(row: dict[str, str], hardware: str) -> dict[str, Any]:
    model = {"name": f"llama-{row['model']}", "layers": int(row["layers"]), "hidden": int(row["hidden"]),
             "heads": int(row["heads"]), "kv_heads": int(row["kv_heads"]), "ffn": int(row["ffn"]),
             "ffn_kind": "swiglu", "vocab": int(row["vocab"])}
    return {"name": row["run_id"], "hardware": hardware, "model": model,
            "training": {"seq_len": int(row["seq"]), "micro_batch": int(row["micro_batch"]),
                         "activation_checkpointing": row["activation_checkpointing"] == "true",
                         "precision": "bf16", "gradient_clipping": 0.0},  # the script does not clip
            "schedule": {"system": "fsdp2_offload", "adam_impl": row["adam_impl"],
                         "pin_memory": row["pin_memory"] == "true",
                         "reshard_after_forward": row["reshard_after_forward"] == "true", "launcher": "other",
                         "activation_offload": row.get("activation_offload") == "true"},
            # What the run's rank really had (torch.get_num_threads() in the run): a condition, not a fit.
            "cluster": {"gpus": 1, "cpu_threads_per_rank": int(row["torch_threads"])}}


def read_runs(path: Path, hardware: str) -> list[Fsdp2Run]:
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    runs = []
    for row in rows:
        if row.get("timing") != "unsynced" or row.get("status") != "ok" or row.get("cpu_offload") != "true":
            continue
        runs.append(Fsdp2Run(row["run_id"], path.parent.name, float(row["step_median_s"]), scenario_of(row, hardware)))
    return runs


def shipped_runs(root: Path | None = None) -> list[Fsdp2Run]:
    """Every measured FSDP2 run of the shipped calibration folders whose machine has a profile."""
    base = root or shipped_calibration_dir()
    runs: list[Fsdp2Run] = []
    for path in sorted(base.glob(f"*/{STEPS_FILE}")):
        profile = next((p for prefix, p in PROFILE_OF_PREFIX.items() if path.parent.name.startswith(prefix)), None)
        if profile is not None:
            runs += read_runs(path, profile)
    return runs


def check(runs: list[Fsdp2Run]) -> list[Fsdp2Check]:
    from sosim.run.loader import load_scenario
    from sosim.run.simulate import simulate

    out = []
    for run in runs:
        metrics = simulate(load_scenario(run.scenario)).metrics
        out.append(Fsdp2Check(run, float(metrics["step_time_s"]), metrics))
    return out


def summary(checks: list[Fsdp2Check]) -> tuple[float, float]:
    """(mean |error|, worst |error|) over the checks."""
    errors = [abs(c.error) for c in checks]
    return (statistics.mean(errors), max(errors)) if errors else (0.0, 0.0)
