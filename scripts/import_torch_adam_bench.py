"""Turn scripts/torch_cpu_adam_bench.py's torch_cpu_adam.csv into calibration-table rows (measurements.csv
format, sosim/calibrate/records.py): ``cpu_adam`` / ``torch_<impl>[_dtensor]`` with elements, threads and the
median / p10 / p90 of the step. Only the AdamW cells become rows: the bench's copy cells are a cross-check of
the profile's copy rows (printed, not written), since a later table's copy rows would replace the earlier
leases' for every system.

  python3 scripts/import_torch_adam_bench.py /work/device_results/.../fsdp2/torch_cpu_adam.csv \
      --out calibration/nvidia-h200-2026-12-01-fsdp2/measurements.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sosim.calibrate.records import COLUMNS

DEFAULT_TENSOR_NUMEL = 2048 * 5632  # the bench's --tensor-numel default (a 1.1b MLP matrix)


def convert(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[str]]:
    out, copies = [], []
    for r in rows:
        if r.get("op") == "copy":
            copies.append(f"copy {r['impl']} {r['variant']} {int(r['bytes']) / 2**20:.0f} MiB: {r['GBps']} GB/s")
            continue
        if r.get("op") != "cpu_adamw" or not r.get("median_s"):
            continue
        variant = f"torch_{r['impl']}" + ("_dtensor" if r["variant"] == "dtensor" else "")
        # The per-tensor sweep (the same elements in more, smaller tensors) is its own variant: in the main
        # curve it would put several times at one size. Its tensor count goes in the subgroups column.
        main_tensors = -(-int(r["elements"]) // DEFAULT_TENSOR_NUMEL)
        if r.get("n_tensors") and int(r["n_tensors"]) != main_tensors:
            variant += "_sweep"
        out.append({"subgroups": r.get("n_tensors", ""),
            "op": "cpu_adam", "variant": variant, "dtype": "fp32", "elements": r["elements"],
            "threads": r["threads"], "bytes": r.get("bytes", ""), "median_s": r["median_s"], "p10_s": r["p10_s"],
            "p90_s": r["p90_s"], "n_samples": r["repeats"], "device": r["device"], "host_cpu": r["cpu_model"],
            "torch_version": r["torch_version"], "date": r["date"],
        })
    return out, copies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench_csv", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        with args.bench_csv.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        print(f"{args.bench_csv}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return 2
    table, copies = convert(rows)
    if not table:
        print(f"{args.bench_csv}: no cpu_adamw rows", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS), restval="")
        writer.writeheader()
        writer.writerows(table)
    print(f"wrote {len(table)} cpu_adam rows to {args.out}")
    for line in copies:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
