"""The generated tables of docs/calibrate-your-machine.md: one lease's DeepSpeed runs predicted from that lease's
own ``sosim calibrate --profile`` tables and from the shipped profile, with error bands and coverage.

    python scripts/calibrate_report.py                                   # print every generated section
    python scripts/calibrate_report.py --write docs/calibrate-your-machine.md

Each section replaces the text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` in the page;
the prose around the markers is kept. Inputs are data only: the lease's folder (``--folder``, default
calibration/nvidia-h200-2026-12-01: deepspeed_steps.csv, the DeepSpeed configs, measurements.csv and the profile
the device wrote under profiles/), never a hand-typed number.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "calibration" / "nvidia-h200-2026-12-01"
OWN_PROFILE = "h200-lease-2026-12-01"
SHIPPED_PROFILE = "h200-pcie-gen5-x86"
# Diagnostic, not a target: the own profile with lease B's re-measured copy and ds_refresh sections listed after
# lease A's table (a later table replaces the sections it measured again), to show how much of the own
# profile's error one outlying component carries. Written at run time into a temporary folder.
DIAG_PROFILE = "h200-lease-2026-12-01-refresh-b"
PROFILES = (OWN_PROFILE, SHIPPED_PROFILE, DIAG_PROFILE)
EARLIER_LEASES = (
    "nvidia-h200-2026-11-30c", "nvidia-h200-2026-11-29", "nvidia-h200-2026-11-30", "nvidia-h200-2026-11-30b"
)
BAND_REPLAYS = 60
BAND_SEED = 0
# Issue 18's targets.
TARGET_OWN = (0.04, 0.08)
TARGET_SHIPPED = (0.05, 0.10)
TARGET_COVERAGE = 0.80
TARGET_HALF_WIDTH = 0.12


@dataclass(frozen=True)
class Row:
    run_id: str
    lease: str
    shape: str
    held_out: bool
    system: str
    measured: tuple[float, float, float]  # median, p10, p90
    predicted: dict[str, float]
    band: dict[str, tuple[float, float, float] | None]
    timers: dict[str, dict[str, tuple[float | None, float | None]]]
    # Phased forward / backward / step: (measured median, predicted) per profile.
    phases: dict[str, dict[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)

    def error(self, profile: str) -> float:
        return self.predicted[profile] / self.measured[0] - 1.0

    def in_band(self, profile: str) -> bool | None:
        b = self.band[profile]
        return None if b is None else b[0] <= self.measured[0] <= b[2]

    def half_width(self, profile: str) -> float:
        b = self.band[profile]
        return math.nan if b is None else (b[2] - b[0]) / 2.0 / b[1]


def table_layer_shapes() -> set[tuple[int, int, int, int]]:
    """(hidden, heads, kv_heads, ffn) of every Llama layer the shipped H200 tables measured."""
    shapes: set[tuple[int, int, int, int]] = set()
    for lease in EARLIER_LEASES:
        with (ROOT / "calibration" / lease / "measurements.csv").open(newline="") as handle:
            for r in csv.DictReader(handle):
                if r["op"] == "layer" and r["hidden"] and r["heads"] and r["ffn"]:
                    shapes.add((int(float(r["hidden"])), int(float(r["heads"])), int(float(r["kv_heads"] or 0)),
                                int(float(r["ffn"]))))
    return shapes


def _shape(model: dict[str, int]) -> tuple[str, tuple[int, int, int, int]]:
    h, a, kv, f = (model["hidden_size"], model["num_attention_heads"], model["num_key_value_heads"],
                   model["intermediate_size"])
    label = f"{model['num_hidden_layers']}x{h}, {a}/{kv} heads, d{h // a}, ffn {f}"
    return label, (h, a, kv, f)


def leases_of(folder: Path) -> dict[str, str]:
    with (folder / "deepspeed_steps.csv").open(newline="") as handle:
        return {r["run_id"]: r.get("lease", "") for r in csv.DictReader(handle)}


def _diagnostic_profile(folder: Path, tmp: Path) -> None:
    """DIAG_PROFILE in ``tmp``: the own profile with lease B's warm copy + ds_refresh table added after lease A's."""
    import yaml

    data = yaml.safe_load((folder / "profiles" / f"{OWN_PROFILE}.yaml").read_text())
    data["name"] = DIAG_PROFILE
    data["description"] = f"diagnostic: {OWN_PROFILE} with lease B's copy and ds_refresh rows"
    data["calibration"] = [str((folder / "measurements.csv").resolve()),
                           str((folder / "lease-b-cold-warm" / "warm" / "measurements.csv").resolve())]
    (tmp / f"{DIAG_PROFILE}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def collect(folder: Path, bands: int) -> list[Row]:
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="calibrate_report_"))
    _diagnostic_profile(folder, tmp)
    os.environ["SOSIM_PROFILES"] = os.pathsep.join(
        [str(folder / "profiles"), str(tmp),
         *([os.environ["SOSIM_PROFILES"]] if os.environ.get("SOSIM_PROFILES") else [])])
    from sosim.answers.validate_measured import measured_timers, predict, read_runs

    runs, skipped = read_runs(folder)
    if skipped:
        print(f"calibrate_report: skipped {[s.run_id for s in skipped]}", file=sys.stderr)
    leases = leases_of(folder)
    known = table_layer_shapes()
    rows = []
    for run in runs:
        label, key = _shape(run.model)
        system = run.config + (" + offload_param (ZeRO-Infinity)" if run.run_id.endswith("-offparam") else "")
        predicted: dict[str, float] = {}
        band: dict[str, tuple[float, float, float] | None] = {}
        timers: dict[str, dict[str, tuple[float | None, float | None]]] = {}
        phases: dict[str, dict[str, tuple[float, float]]] = {}
        for profile in PROFILES:
            res = predict(run, profile, bands=bands if profile != DIAG_PROFILE else 0, seed=BAND_SEED)
            predicted[profile] = res.predicted_s
            band[profile] = res.band
            measured = measured_timers(run)
            timers[profile] = {name: (measured.get(name), value) for name, value in res.timers_pred.items()}
            phases[profile] = {name: (run.phases[name].median, res.phases_pred[name])
                               for name in ("forward", "backward", "step")
                               if name in run.phases and name in res.phases_pred}
        rows.append(Row(run.run_id, leases.get(run.run_id, ""), label, key not in known, system,
                        (run.step.median, run.step.p10, run.step.p90), predicted, band, timers, phases))
    return rows


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _band(row: Row, profile: str) -> str:
    b = row.band[profile]
    if b is None:
        return "—"
    return f"{b[0]:.3f}-{b[2]:.3f} ({'in' if row.in_band(profile) else '**out**'})"


def lease_table(rows: Sequence[Row]) -> str:
    out = ["| run | lease | shape | held out | system | measured s (p10-p90) | own profile s | error | own band "
           "| shipped s | error | shipped band |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.measured
        out.append(
            f"| {r.run_id} | {r.lease.removeprefix('nvidia-h200-')} | {r.shape} | {'yes' if r.held_out else 'no'} "
            f"| {r.system} | {m[0]:.3f} ({m[1]:.3f}-{m[2]:.3f}) | {r.predicted[OWN_PROFILE]:.3f} "
            f"| {_pct(r.error(OWN_PROFILE))} | {_band(r, OWN_PROFILE)} | {r.predicted[SHIPPED_PROFILE]:.3f} "
            f"| {_pct(r.error(SHIPPED_PROFILE))} | {_band(r, SHIPPED_PROFILE)} |")
    return "\n".join(out)


def _stats(rows: Sequence[Row], profile: str) -> str:
    if not rows:
        return "| — | — | — | — | — |"
    errs = [abs(r.error(profile)) for r in rows]
    inside = [r.in_band(profile) for r in rows if r.in_band(profile) is not None]
    widths = [r.half_width(profile) for r in rows if r.band[profile] is not None]
    cov = f"{sum(inside)}/{len(inside)} ({sum(inside) / len(inside):.0%})" if inside else "—"
    hw = f"±{statistics.median(widths):.1%} (max ±{max(widths):.1%})" if widths else "—"
    return f"| {len(rows)} | {statistics.mean(errs):.1%} | {max(errs):.1%} | {cov} | {hw} |"


def summary(rows: Sequence[Row]) -> str:
    out = ["| profile | runs | mean abs error | worst | measured median inside p10-p90 | band half-width median |",
           "|---|---|---|---|---|---|"]
    for profile, name, target in ((OWN_PROFILE, "this lease's own profile", TARGET_OWN),
                                  (SHIPPED_PROFILE, "shipped profile", TARGET_SHIPPED),
                                  (DIAG_PROFILE, "diagnostic: own profile, refresh re-measured on lease B", None)):
        for subset, label in ((rows, "all"), ([r for r in rows if not r.held_out], "shapes in a table"),
                              ([r for r in rows if r.held_out], "held-out shapes")):
            out.append(f"| {name} ({profile}), {label} " + _stats(subset, profile))
        if target is not None:
            out.append(f"| target for {name} | | <= {target[0]:.0%} | <= {target[1]:.0%} | >= {TARGET_COVERAGE:.0%} "
                       f"| <= ±{TARGET_HALF_WIDTH:.0%} |")
    by_system: dict[str, list[Row]] = {}
    for r in rows:
        by_system.setdefault(r.system, []).append(r)
    out += ["", "| system | runs | own: mean / worst error | shipped: mean / worst error | diagnostic: mean / worst |",
            "|---|---|---|---|---|"]
    for system, items in sorted(by_system.items()):
        cells = []
        for profile in PROFILES:
            errs = [r.error(profile) for r in items]
            cells.append(f"{statistics.mean(abs(e) for e in errs):.1%} / {max(errs, key=abs):+.1%}")
        out.append(f"| {system} | {len(items)} | {cells[0]} | {cells[1]} | {cells[2]} |")
    return "\n".join(out)


def components(rows: Sequence[Row]) -> str:
    """DeepSpeed's own timers inside step() against the plan's ops: which cost carries the error."""
    names = sorted({n for r in rows for n in r.timers[OWN_PROFILE]})
    out = ["| run | " + " | ".join(f"{n}: measured / own / shipped s" for n in names) + " |",
           "|---|" + "---|" * len(names)]
    for r in rows:
        cells = []
        for n in names:
            m, own = r.timers[OWN_PROFILE].get(n, (None, None))
            _, shipped = r.timers[SHIPPED_PROFILE].get(n, (None, None))
            cells.append("—" if m is None else f"{m:.3f} / {own or math.nan:.3f} / {shipped or math.nan:.3f}")
        out.append(f"| {r.run_id} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _medians(path: Path) -> dict[tuple[str, ...], float]:
    keys = ("op", "variant", "m", "n", "k", "batch", "seq", "heads", "kv_heads", "head_dim", "hidden", "ffn", "bytes",
            "elements", "threads", "gpus", "subgroups", "layers")
    with path.open(newline="") as handle:
        return {tuple(r.get(k) or "" for k in keys): float(r["median_s"]) for r in csv.DictReader(handle)}


def lease_spread(folder: Path) -> str:
    """This lease's components against the same points of the earlier leases, and the kind's pooled spread."""
    from sosim.costs.table import load_tables

    new = _medians(folder / "measurements.csv")
    out = ["| section | vs lease | points | median ratio (this / earlier) | min-max |", "|---|---|---|---|---|"]
    for lease in EARLIER_LEASES:
        old = _medians(ROOT / "calibration" / lease / "measurements.csv")
        by: dict[str, list[float]] = {}
        for key, value in new.items():
            if key in old and old[key] >= 1e-3:
                by.setdefault(key[0], []).append(value / old[key])
        for op, ratios in sorted(by.items()):
            out.append(f"| {op} | {lease.removeprefix('nvidia-h200-')} | {len(ratios)} "
                       f"| {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    paths = [str(ROOT / "calibration" / lease / "measurements.csv") for lease in EARLIER_LEASES]
    before = load_tables(paths)
    after = load_tables([*paths, str(folder / "measurements.csv")])
    out.append("")
    for label, t in (("4 earlier leases", before), ("with this lease (5 leases)", after)):
        sd = dict(t.session_log_sd)
        pts = dict(t.session_points)
        out.append(f"* Pooled lease-to-lease log-sd, {label}: host {sd.get('host', math.nan):.3f} over "
                   f"{pts.get('host', 0)} points, device {sd.get('device', math.nan):.3f} over {pts.get('device', 0)}.")
    return "\n".join(out)


def cold_warm(folder: Path) -> str:
    """Lease B: the same sections before and after touching 48 GiB of host memory (host_warmup)."""
    base = folder / "lease-b-cold-warm"
    if not (base / "cold" / "measurements.csv").is_file():
        return "(no lease-b-cold-warm data)"
    cold, warm = _medians(base / "cold" / "measurements.csv"), _medians(base / "warm" / "measurements.csv")
    by: dict[str, list[float]] = {}
    for key, value in cold.items():
        if key in warm and warm[key] >= 1e-3:
            by.setdefault(f"{key[0]}/{key[1]}", []).append(value / warm[key])
    out = ["| section / variant | points | median cold / warm | min-max |", "|---|---|---|---|"]
    for name, ratios in sorted(by.items()):
        out.append(f"| {name} | {len(ratios)} | {statistics.median(ratios):.2f} "
                   f"| {min(ratios):.2f}-{max(ratios):.2f} |")
    lease_a = _medians(folder / "measurements.csv")
    by_a: dict[str, list[float]] = {}
    for key, value in lease_a.items():
        if key in warm and warm[key] >= 1e-3:
            by_a.setdefault(f"{key[0]}/{key[1]}", []).append(value / warm[key])
    out += ["", "| section / variant | points | median lease A / lease B (warm) | min-max |", "|---|---|---|---|"]
    for name, ratios in sorted(by_a.items()):
        out.append(f"| {name} | {len(ratios)} | {statistics.median(ratios):.2f} "
                   f"| {min(ratios):.2f}-{max(ratios):.2f} |")
    with (base / "warmup" / "measurements.csv").open(newline="") as handle:
        for r in csv.DictReader(handle):
            gbps = float(r["bytes"]) / float(r["median_s"]) / 1e9
            out.append(f"\n* `host_mem / {r['variant']}`: 2 GiB allocated and filled in {float(r['median_s']):.3f} s "
                       f"median ({gbps:.1f} GB/s, {r['n_samples']} chunks)")
    return "\n".join(out)


def _refresh_points(folder: Path) -> list[tuple[str, str, str, float, float]]:
    """(lease folder, run, shape, parameters, measured t_refresh s) of every one-GPU stage-3 run on the H200 kind
    with the parameters on the GPU (ZeRO-3 and SuperOffload at ratio 1.0, phased rows)."""
    points = []
    for steps in sorted((ROOT / "calibration").glob("nvidia-h200-2026-*/deepspeed_steps.csv")):
        with steps.open(newline="") as handle:
            for r in csv.DictReader(handle):
                if (r.get("timing") != "phased" or r.get("status") != "ok" or not r.get("t_refresh_s")
                        or r["config"] not in ("zero3", "superoffload") or r.get("offload_param")
                        or (r.get("gpus") or "1") != "1" or (r.get("ratio") or "1.0") not in ("1.0", "1")):
                    continue
                shape = f"{r['layers']}x{r['hidden']} {r['heads']}/{r['kv_heads']}"
                points.append((steps.parent.name, r["run_id"], shape, float(r["params"]), float(r["t_refresh_s"])))
    return points


def shape_holdout(folder: Path) -> str:
    """The refresh, fitted as seconds per parameter on the tabled shapes' runs (every lease), against the runs of
    the held-out shapes: does the per-parameter cost generalise to shapes no table holds?"""
    known = table_layer_shapes()
    points = _refresh_points(folder)

    def is_held(shape: str) -> bool:
        dims, heads = shape.split(" ")
        hidden = int(dims.split("x")[1])
        a, kv = (int(x) for x in heads.split("/"))
        return not any(k[0] == hidden and k[1] == a and k[2] == kv for k in known)

    fit = [p for p in points if not is_held(p[2])]
    rate = sum(t * n for *_, n, t in fit) / sum(n * n for *_, n, _t in fit)
    resid = [t / (rate * n) - 1 for *_, n, t in fit]
    out = [f"Fit on {len(fit)} runs of tabled shapes over {len({p[0] for p in fit})} leases: **{rate * 1e9:.3f} s per "
           f"1e9 parameters** (in-sample |residual| mean {statistics.mean(abs(r) for r in resid):.1%}, "
           f"max {max(abs(r) for r in resid):.1%}).", "",
           "| held-out run | lease | shape | parameters | measured refresh s | fitted s | error |",
           "|---|---|---|---|---|---|---|"]
    errs = []
    for lease, run, shape, n, t in points:
        if is_held(shape):
            err = rate * n / t - 1
            errs.append(abs(err))
            out.append(f"| {run} | {lease.removeprefix('nvidia-h200-')} | {shape} | {n / 1e9:.3f}e9 | {t:.3f} "
                       f"| {rate * n:.3f} | {err:+.1%} |")
    if errs:
        out.append(f"\nHeld-out refresh: mean |error| {statistics.mean(errs):.1%}, worst {max(errs):.1%} "
                   f"over {len(errs)} runs.")
    return "\n".join(out)


def phase_errors(rows: Sequence[Row]) -> str:
    """Where each run's shipped-profile error sits: phased forward / backward / step, predicted - measured (ms),
    and the step's two largest host costs (DeepSpeed's timers), so the cost that dominates is read, not guessed."""
    lines = ["| run | held out | system | step error | forward ms | backward ms | step() ms | adam+unscale ms "
             "| refresh ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ph = r.phases.get(SHIPPED_PROFILE, {})
        tm = r.timers.get(SHIPPED_PROFILE, {})

        def delta(pair: tuple[float | None, float | None] | None) -> str:
            if pair is None or pair[0] is None or pair[1] is None:
                return "—"
            return f"{1e3 * (pair[1] - pair[0]):+.0f}"

        cells = [delta(ph.get(name)) for name in ("forward", "backward", "step")]
        lines.append(f"| {r.run_id} | {'yes' if r.held_out else 'no'} | {r.system} | {_pct(r.error(SHIPPED_PROFILE))} "
                     f"| {' | '.join(cells)} | {delta(tm.get('adam+unscale'))} | {delta(tm.get('refresh'))} |")
    return "\n".join(lines)


MECH_FOLDER = ROOT / "calibration" / "nvidia-h200-2026-12-01-mech"


def mechanisms(folder: Path = MECH_FOLDER) -> str:
    """The layer_offload section's rows (per decoder layer / per flush) and the constants sosim derives."""
    from types import SimpleNamespace

    from sosim.costs.calibration_table import CalibrationTable
    from sosim.costs.offload_mechanisms import z2_flush_costs, zinf_fetch_s_per_tensor

    lease = (folder / "lease.txt").read_text().split()[1]
    lines = [f"Lease {lease} (`{folder.relative_to(ROOT)}/measurements.csv`), median (p10-p90) ms:", "",
             "| row | shape | median ms (p10-p90) |", "|---|---|---|"]
    with (folder / "measurements.csv").open(newline="") as handle:
        for r in csv.DictReader(handle):
            if r["op"] == "layer":
                shape = f"per layer of a {r['layers']}-layer stack, hidden {r['hidden']}, batch {r['batch']}"
            else:
                shape = f"{r['subgroups']} tensors, {float(r['elements']) / 1e6:.1f} M elements"
            lines.append(f"| {r['op']} {r['variant']} | {shape} | {1e3 * float(r['median_s']):.3f} "
                         f"({1e3 * float(r['p10_s']):.3f}-{1e3 * float(r['p90_s']):.3f}) |")
    table = CalibrationTable.from_csv(folder / "measurements.csv")
    costs = SimpleNamespace(measured_table=lambda: table)  # the cost object's door to its table
    z2 = z2_flush_costs(costs)
    zinf = zinf_fetch_s_per_tensor(costs)
    assert z2 is not None and zinf is not None
    wait_us, kernel_ps, fetch_ms = 1e6 * z2.sync_s_per_tensor, 1e12 * z2.norm_overflow_s_per_element, 1e3 * zinf[0]
    lines += ["", f"Derived (`sosim/costs/offload_mechanisms.py`): ZeRO-2 flush, host wait **{wait_us:.0f} us per "
              f"parameter tensor**, norm + overflow kernels **{kernel_ps:.1f} ps per element**; ZeRO-Infinity "
              f"fetch, **{fetch_ms:.3f} ms per fetched tensor** (forward)."]
    return "\n".join(lines)


def sections(folder: Path, bands: int) -> dict[str, Callable[[], str]]:
    cache: dict[str, list[Row]] = {}

    def rows() -> list[Row]:
        if "rows" not in cache:
            cache["rows"] = collect(folder, bands)
        return cache["rows"]

    return {
        "lease-table": lambda: lease_table(rows()),
        "lease-summary": lambda: summary(rows()),
        "lease-components": lambda: components(rows()),
        "lease-spread": lambda: lease_spread(folder),
        "lease-cold-warm": lambda: cold_warm(folder),
        "shape-holdout": lambda: shape_holdout(folder),
        "mechanisms": mechanisms,
        "phase-errors": lambda: phase_errors(rows()),
    }


def write(page: Path, folder: Path, bands: int) -> int:
    text = page.read_text()
    missing = []
    for name, make in sections(folder, bands).items():
        tag = re.escape(name)
        pattern = re.compile(rf"(<!-- generated:{tag} -->\n)(?:.*?\n)?(<!-- /generated:{tag} -->)", re.S)
        if not pattern.search(text):
            missing.append(name)
            continue
        body = make()
        text = pattern.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(2), text)
    page.write_text(text)
    if missing:
        print(f"calibrate_report: no markers for {', '.join(missing)} in {page}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None, help="page whose generated sections to replace")
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--bands", type=int, default=BAND_REPLAYS, help="band replays per run and profile")
    args = parser.parse_args(argv)
    if args.write is not None:
        return write(args.write, args.folder, args.bands)
    for name, make in sections(args.folder, args.bands).items():
        print(f"## {name}\n\n{make()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
