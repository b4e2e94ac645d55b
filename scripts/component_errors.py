"""Component predictions vs the measured table: how well does the model predict what it did not read?

    python scripts/component_errors.py [--csv calibration/<run>/measurements.csv] [--profile h200-pcie-gen5-x86]

For every measured whole Llama layer (forward, and forward+backward) it compares
  * the analytic model of the profile (efficiency curves; the layer rows are never read), and
  * the table model composed from the measured GEMMs and attention only (the layer rows held out),
and prints a markdown table of relative errors. Copies, CPU Adam and casts are read from the table by the
simulator, so their error there is interpolation error only; the script reports it at points between the
measured sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from sosim.costs.analytic import AnalyticCostModel
from sosim.costs.calibration_table import CalibrationTable
from sosim.costs.table import TableCostModel
from sosim.inputs.config import ModelSpec, TrainingSpec
from sosim.run.loader import load_profile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CSV = ROOT / "calibration" / "nvidia-h200-2026-11-29" / "measurements.csv"


class _NoLayers(CalibrationTable):
    """The table with its whole-layer rows hidden, so a layer must be composed from GEMMs + attention."""

    def layer_time_s(self, hidden: int, seq: int, batch: int, backward: bool, **shape: object) -> float | None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--profile", default="h200-pcie-gen5-x86")
    args = ap.parse_args()
    hw = load_profile(args.profile).model_copy(update={"calibration": None})
    table = CalibrationTable.from_csv(args.csv)
    held_out = _NoLayers(**{f.name: getattr(table, f.name) for f in dataclasses.fields(table)})
    frame = pd.read_csv(args.csv)
    layers = frame[frame.op == "layer"]
    rows = []
    for _, r in layers.iterrows():
        m = ModelSpec(layers=1, hidden=int(r.hidden), heads=int(r.heads), kv_heads=int(r.kv_heads),
                      ffn=int(r.ffn), ffn_kind="swiglu", vocab=32000)
        t = TrainingSpec(seq_len=int(r.seq), micro_batch=int(r.batch), activation_checkpointing=False)
        analytic = AnalyticCostModel(hw, m, t, int(r.seq) * int(r.batch))
        composed = TableCostModel.from_analytic(analytic, held_out)
        backward = r.variant == "fwd_bwd"
        a = analytic.layer_fwd_s() + (analytic.layer_bwd_s() if backward else 0.0)
        c = composed.layer_fwd_s() + (composed.layer_bwd_s() if backward else 0.0)
        rows.append({"layer": f"h{int(r.hidden)} s{int(r.seq)} b{int(r.batch)} {r.variant}",
                     "measured_ms": r.median_s * 1e3, "analytic_ms": a * 1e3,
                     "analytic_err": a / r.median_s - 1, "composed_ms": c * 1e3, "composed_err": c / r.median_s - 1})
    out = pd.DataFrame(rows)
    print("| layer | measured ms | analytic ms | error | composed ms | error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['measured_ms']:.3f} | {r['analytic_ms']:.3f} | {r['analytic_err']:+.1%} | "
              f"{r['composed_ms']:.3f} | {r['composed_err']:+.1%} |")
    print(f"\nmean |error|: analytic {out.analytic_err.abs().mean():.1%}, "
          f"composed from GEMM+attention {out.composed_err.abs().mean():.1%}")


if __name__ == "__main__":
    main()
