"""ZeRO-3 hook host time: per hooked module, per parameter tensor, or both (issue 21 item 2).

Reads the hook-timed runs of a device campaign (deepspeed_steps.csv rows with hook_timers true; columns in
/work/signals/measure-notes.md: t_hook_total_fwd_s, n_hook_fwd_pre, hooked_modules, param_modules,
param_tensors, layers, family) and fits the forward hooks' host time per step as

    t_fwd = a * (hooked module calls) + b * (parameter tensors fetched)

by least squares over GPT-2-family and Llama rows (their module and tensor counts differ: 12 tensors in 6
parameter modules vs 9 in 9), then prints a, b and each row's fit error. Module calls per step are
n_hook_fwd_pre; tensors fetched are param_tensors (one forward fetches every parameter once).

    PYTHONPATH=. python scripts/hook_fit.py FOLDER_WITH_deepspeed_steps.csv
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np


def rows(folder: Path) -> list[dict[str, str]]:
    path = folder / "deepspeed_steps.csv"
    if not path.is_file():
        path = next(folder.rglob("deepspeed_steps.csv"))
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r.get("hook_timers", "").lower() == "true"
                and r.get("t_hook_total_fwd_s") and r.get("phase", r.get("sync", "")) != "unsynced"]


def main(argv: list[str]) -> int:
    data = rows(Path(argv[0]))
    if not data:
        print("no hook-timed rows", file=sys.stderr)
        return 2
    x, y, labels = [], [], []
    for r in data:
        calls = float(r["n_hook_fwd_pre"])
        tensors = float(r["param_tensors"])
        x.append([calls, tensors])
        y.append(float(r["t_hook_total_fwd_s"]))
        labels.append(f"{r['run_id']} {r.get('family', '?')} {r.get('config', '?')} calls={calls:g} tensors={tensors:g}"
                      f" param_modules={r.get('param_modules', '?')}")
    a = np.array(x)
    b = np.array(y)
    for name, cols in (("per module call", [0]), ("per tensor", [1]), ("both", [0, 1])):
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        pred = a[:, cols] @ coef
        err = np.abs(pred / b - 1.0)
        terms = ", ".join(f"{['module call', 'tensor'][c]} {v * 1e6:.1f} us" for c, v in zip(cols, coef))
        print(f"{name:16s} {terms:44s} mean |err| {err.mean():.1%}  max {err.max():.1%}")
    for lab, t in zip(labels, b):
        print(f"  {lab}: {t * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
