"""ZeRO-3 hook host time: per hooked module, per parameter tensor, or both (issue 21 item 2).

Reads the hook-timed runs of a device campaign (deepspeed_steps.csv rows with hook_timers true; columns in
/work/signals/measure-notes.md: t_hook_total_fwd_s, n_hook_fwd_pre, hooked_modules, param_modules,
param_tensors, layers, family) and fits the forward hooks' host time per step as

    t_hook_total = a * (hooked modules) | a * (parameter modules) | b * (parameter tensors) | both

by least squares over the GPT-2-family and Llama rows (their module and tensor counts differ: 12 tensors in 6
parameter modules vs 9 in 9), then prints each fit's coefficient and error, and the rows.

    PYTHONPATH=. python scripts/hook_fit.py FOLDER   # with deepspeed_steps.csv, or z3_hooks.csv
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np


def rows(folder: Path) -> list[dict[str, str]]:
    path = folder / "deepspeed_steps.csv"
    if not path.is_file():
        hooks = folder / "z3_hooks.csv"
        path = hooks if hooks.is_file() else next(folder.rglob("deepspeed_steps.csv"))
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r.get("hook_timers", "true").lower() == "true"
                and r.get("t_hook_total_s") and r.get("family") in ("gpt2", "llama")]


FITS = (("per hooked module", [0]), ("per param module", [1]), ("per tensor", [2]), ("module + tensor", [1, 2]))
TERMS = ("hooked module", "param module", "tensor")


def main(argv: list[str]) -> int:
    data = rows(Path(argv[0]))
    if not data:
        print("no hook-timed rows", file=sys.stderr)
        return 2
    a = np.array([[float(r["hooked_modules"]), float(r["param_modules"]), float(r["param_tensors"])] for r in data])
    b = np.array([float(r["t_hook_total_s"]) for r in data])
    for name, cols in FITS:
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        err = np.abs(a[:, cols] @ coef / b - 1.0)
        terms = ", ".join(f"{TERMS[c]} {v * 1e3:.3f} ms" for c, v in zip(cols, coef))
        print(f"{name:18s} {terms:44s} mean |err| {err.mean():.1%}  max {err.max():.1%}")
    for r, t in zip(data, b):
        print(f"  {r['run_id']} ({r.get('timing', '')}): {t * 1e3:.1f} ms; modules {r['hooked_modules']} hooked, "
              f"{r['param_modules']} with parameters, {r['param_tensors']} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
