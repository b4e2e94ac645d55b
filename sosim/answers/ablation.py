"""``sosim ablation``: SuperOffload's techniques added one at a time to a ZeRO-Offload-like baseline.

The baseline is SuperOffload's schedule with every technique off — DeepSpeed CPU-Adam, CPU-side casts,
no speculation, 1000 MB buckets, nothing updated on the GPU — i.e. ZeRO-Offload's data movement on the
stage-3 builder. The steps and the paper's incremental factors follow the paper's ablation (SuperOffload,
ASPLOS'26, arXiv 2509.21271): GraceAdam x1.104, GPU casting x1.127, STV x1.45, bucketization x1.141
(about 2.06x together).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from sosim.formats.output import print_json
from sosim.inputs.config import Scenario
from sosim.run.loader import load_scenario
from sosim.run.simulate import simulate

BASELINE: tuple[str, ...] = (
    "schedule.system=superoffload", "schedule.implementation=ideal", "schedule.cpu_adam=cpu_adam",
    "schedule.cast=cpu", "schedule.speculation=false", "schedule.bucket_mb=1000",
    "schedule.gpu_optimizer_fraction=0", "schedule.weight_placement=stationary",
)
# (label, overrides added at this step, the paper's incremental factor)
STEPS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("+ GraceAdam", ("schedule.cpu_adam=grace_adam",), 1.104),
    ("+ GPU casting", ("schedule.cast=gpu",), 1.127),
    ("+ STV (speculation)", ("schedule.speculation=true",), 1.45),
    ("+ bucketization", ("schedule.bucket_mb=64", "schedule.gpu_optimizer_fraction=0.1"), 1.141),
)


@dataclass(frozen=True)
class AblationRow:
    step: str
    tokens_per_s: float
    incremental: float
    cumulative: float
    paper_incremental: float | None
    paper_cumulative: float | None


def run_ablation(source: str | dict[str, Any] | Scenario, overrides: list[str] | None = None) -> list[AblationRow]:
    base = source.model_dump(mode="json") if isinstance(source, Scenario) else source
    applied = [*(overrides or []), *BASELINE]
    first = simulate(load_scenario(base, applied)).metrics["tokens_per_s"]
    rows = [AblationRow("baseline (ZeRO-Offload-like)", first, 1.0, 1.0, None, None)]
    prev, paper_cum = first, 1.0
    for label, extra, paper in STEPS:
        applied = [*applied, *extra]
        tps = simulate(load_scenario(base, applied)).metrics["tokens_per_s"]
        paper_cum *= paper
        rows.append(AblationRow(label, tps, tps / prev, tps / first, paper, paper_cum))
        prev = tps
    return rows


def _cmd(args: argparse.Namespace) -> int:
    rows = run_ablation(str(args.scenario), args.overrides)
    if args.format == "json":
        print_json({"scenario": args.scenario, "rows": [r.__dict__ for r in rows]})
        return 0
    print(f"{'step':<30} {'tokens/s':>10} {'incr':>7} {'paper':>7} {'cumul':>7} {'paper':>7}")
    for r in rows:
        pi = f"{r.paper_incremental:.3f}" if r.paper_incremental else "-"
        pc = f"{r.paper_cumulative:.3f}" if r.paper_cumulative else "-"
        print(f"{r.step:<30} {r.tokens_per_s:>10.0f} {r.incremental:>7.3f} {pi:>7} {r.cumulative:>7.3f} {pc:>7}")
    return 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser("ablation", help="add SuperOffload's techniques one at a time (paper ablation)")
    p.add_argument("scenario")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=_cmd)
