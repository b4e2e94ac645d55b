"""Error bands (issue 11 §2): p10 / p50 / p90 of a prediction from the spread of what it was built from.

A band replays the same scenario ``n`` times with sampled component costs and reads the step time of each
replay. Two sources of spread, and only these two:

* **Measured run-to-run spread of each calibrated component.** The calibration table keeps p10 / median /
  p90 of every timing. One replay draws one quantile per component kind (GEMMs, attention, whole layers,
  copies, CPU Adam, casts, each DeepSpeed stage-3 section the table has), shared by all lookups of that
  kind (:meth:`sosim.costs.table.TableCostModel.sample`; why shared: see
  :meth:`sosim.costs.calibration_table.CalibrationTable.sampled`).
* **A stated uncertainty for analytic estimates.** A cost the table does not cover falls back to the
  analytic model; where that fallback rests on an *estimate* (not a measurement), :data:`ESTIMATE_SPREADS`
  gives it a relative spread with its justification, and each replay draws one factor per estimate kind.
  Analytic costs derived from measurements (efficiency curves fitted to the same table) get no extra spread:
  the band then says which analytic kinds were used without one (:attr:`Band.unspread_analytic`).

What never widens a band: the measured run-to-run spread of whole training steps. Those runs are
validation data (``sosim validate``); using their spread here would fit the band to the rows it is checked
against.

The draw of a quantile ``u ~ U(0, 1)`` maps to a cost the way the table maps quantiles
(:func:`sosim.costs.calibration_table.quantile_times`): piecewise linear through p10, median, p90, flat outside
[0.1, 0.9]. An estimate's factor follows the same rule with p10 = 1 - rel and p90 = 1 + rel. So the
replay at every ``u = 0.5`` is exactly the deterministic :func:`sosim.simulate` (tested).

Speed: each replay rebuilds the plan (a plan's ops are built from cost calls; the plan API has no way to
re-time a built structure), but through a memo of the sampled cost model, so the many identical cost
lookups of one plan (every layer, every sub-group, every iteration) are computed once per replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from sosim.costs import grace_host, published
from sosim.costs.model import Costs
from sosim.costs.table import TableCostModel, load_tables
from sosim.hardware.machine import Machine
from sosim.hardware.model import global_tokens_per_step
from sosim.inputs.config import Scenario
from sosim.run.result import Result
from sosim.run.simulate import make_cost_model, make_costs, simulate

DEFAULT_REPLAYS = 100  # p10/p90 of 100 replays: each quantile's rank is known to about +-3 replays
DEFAULT_SEED = 0
# At most 20x the default: at 2,000 replays the p10 rank is known to about +-13 of 200 (0.7 percentile points),
# finer than the measured spread the draws come from; each replay is a simulation, so an unbounded count is an
# unbounded run (docs/limits.md).
MAX_REPLAYS = 2_000
QUANTILES: tuple[float, float, float] = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class EstimateSpread:
    """A relative spread for one analytic estimate: its 80% interval is [1 - rel, 1 + rel] x the estimate."""

    rel: float
    why: str


# Cost kinds as the table cost model's ledger names them (a kind matches itself and its suffixed variants,
# e.g. "disk" covers "disk_read" and "disk_write"). Only estimates are listed; keep them few and honest.
ESTIMATE_SPREADS: Mapping[str, EstimateSpread] = {
    "stage3_hook": EstimateSpread(
        0.5, "DeepSpeed ZeRO-3 hook cost per parameter module (sosim.costs.analytic.STAGE3_HOOK_S_PER_MODULE): an "
        "unmeasured order-of-magnitude estimate of Python hook work; +-50% is the smallest interval that "
        "can honestly be claimed for a number with no timing behind it"),
    "ds_step_fixed": EstimateSpread(
        0.5, "engine.step()'s fixed part (HOST_SYNC_S + the x86 VM's measured per-sub-group, per-tensor and "
        "per-step pieces, moved to another host by cpu.host_thread_speed): one lease's pieces, and on other "
        "hosts a transferred speed ratio"),
    "so_worker": EstimateSpread(
        0.5, "SuperOffload worker round trip (SO_WORKER_IPC_S + shared-buffer copies): the queue latency is "
        "an unmeasured estimate"),
    "ds_refresh": EstimateSpread(
        0.3, "stage-3 parameter refresh analytic fallback: its cast and copy rates are measured, the "
        "first-touch page-fault rate (FIRST_TOUCH_GBps_PER_CORE) is an estimate; +-30% of the whole"),
    "gemm": EstimateSpread(
        0.1, "a GEMM shape the table did not time (e.g. the vocabulary projection) from the efficiency curve "
        "fitted to the measured GEMMs: their efficiencies scatter 0.60-0.81 around ~0.70 of peak, so the "
        "curve's 80% interval for an unmeasured shape is about +-10%"),
    "disk": EstimateSpread(
        0.3, "NVMe rates per drive from a published RAID-0 result on another machine (DeepNVMe blog), not "
        "measured on the profile's drives"),
}


# Extra spread for costs *transferred* to a profile built from published measurements (issue 16: GH200): the
# analytic fallback then rests on a number carried from another machine, on top of any estimate above. Applied
# only where the profile says it transferred something (a published table, or sosim.costs.grace_host moving the x86
# VM's host costs); drawn from a separate seeded stream, so bands of other profiles keep their exact draws.
TRANSFERRED_SPREADS: Mapping[str, EstimateSpread] = {
    "stage3_hook": EstimateSpread(
        0.3, "ZeRO-3 hook time on Grace = the x86 VM's / cpu.host_thread_speed, an assumed speed ratio (1.0: no "
        "published comparison); the VM figure itself spans 0.6-1.0 ms per tensor over two leases"),
    "ds_step_fixed": EstimateSpread(0.3, "step() bookkeeping moved by the same assumed host_thread_speed"),
    "so_worker": EstimateSpread(0.3, "the worker's queue messages moved by the same assumed host_thread_speed"),
    "ds_refresh": EstimateSpread(
        0.2, "the refresh's CPU cast rate is the x86 cast/DRAM ratio at Grace's STREAM, its first touch a "
        "page-size model: both transferred"),
    "cpu_cast": EstimateSpread(
        0.25, "PyTorch's CPU fp32->bf16 rate on Grace = 0.43 x STREAM, the ratio measured on the x86 VM"),
    "ds_step_unscale_clip": EstimateSpread(
        0.15, "a CPU mul_ pass at Grace's published STREAM range (307-365 GB/s, +-9%) plus the kernel's unknown "
        "fraction of it"),
    "attention": EstimateSpread(
        0.1, "SDPA efficiency transferred from the H200's measured 0.53-0.65 of peak (same SMs)"),
    "gpu_cast": EstimateSpread(0.1, "a memory-bound GPU kernel at the published HBM3 range (3.3-3.7 TB/s)"),
}
# Seed offset of the transferred draws' own stream.
TRANSFERRED_STREAM = 16


def _estimate_kind(kind: str, spreads: Mapping[str, EstimateSpread] = ESTIMATE_SPREADS) -> str | None:
    for name in sorted(spreads, key=len, reverse=True):
        if kind == name or kind.startswith(name + "_"):
            return name
    return None


def quantile_factor(u: float, rel: float) -> float:
    """The factor at quantile ``u`` of an estimate with spread ``rel``: linear through (0.1, 1 - rel),
    (0.5, 1), (0.9, 1 + rel), flat outside [0.1, 0.9] (the table's own rule for its timings)."""
    return 1.0 + rel * (min(max(u, 0.1), 0.9) - 0.5) / 0.4


@dataclass(frozen=True)
class SpreadCostModel(TableCostModel):
    """The table cost model with a factor on each analytic fallback that is a stated estimate."""

    estimate_factors: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)
    transferred_factors: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)

    def _use(
        self,
        kind: str,
        measured: float | None,
        analytic: Callable[[Any], float],
        measured_at: Callable[[Any], float] | None = None,
        cpu: bool = False,
    ) -> float:
        value = super()._use(kind, measured, analytic, measured_at, cpu)
        if measured is None:
            estimate = _estimate_kind(kind)
            if estimate is not None:
                value *= self.estimate_factors.get(estimate, 1.0)
            moved = _estimate_kind(kind, TRANSFERRED_SPREADS)
            if moved is not None:
                value *= self.transferred_factors.get(moved, 1.0)
        return value


def table_has_spread(sc: Scenario) -> bool:
    """Whether the scenario's profile names a calibration table with any measured p10 / p90."""
    if sc.hardware.calibration is None:
        return False
    table = load_tables(sc.hardware.calibration_paths)
    for cols in table.columns_by_op.values():
        med = cols["median_s"]
        for name in ("p10_s", "p90_s"):
            q = cols.get(name)
            if q is not None and bool(np.any(np.isfinite(q) & (q > 0) & (q != med))):
                return True
    return False


def has_transferred_costs(sc: Scenario) -> bool:
    """Whether the profile is built from published values with transferred costs (a published table, or host
    costs moved from the x86 VM by sosim.costs.grace_host): its bands then draw TRANSFERRED_SPREADS too."""
    if grace_host.transferred_note(sc.hardware.cpu):
        return True
    paths = sc.hardware.calibration_paths
    return bool(paths) and bool(published.table_origin(load_tables(paths)))


def band_unavailable_reason(sc: Scenario) -> str | None:
    """None when ``sc`` can carry a band; else why not (for messages and JSON)."""
    if sc.hardware.calibration is None:
        return f"profile '{sc.hardware.name}' names no calibration table, so no measured spread"
    if not table_has_spread(sc):
        return f"the calibration table of '{sc.hardware.name}' holds no p10/p90 spread"
    return None


def sampled_cost_models(sc: Scenario, n: int, seed: int) -> Iterator[Costs]:
    """``n`` seeded cost objects: per replay one quantile per table component kind, then one factor per
    estimate kind (drawn in sorted order from the same generator, so a seed fixes everything). Each is the
    scenario's cost object (topology and cache included) built on that replay's sampled table."""
    machine = Machine.from_scenario(sc)
    base = make_cost_model(sc)
    if not isinstance(base, TableCostModel):
        raise ValueError(band_unavailable_reason(sc) or "no calibration table")
    spread = SpreadCostModel.from_analytic(base, base.table, base.baseline, base.baseline_source)
    rng = np.random.default_rng(seed)
    moved_rng = np.random.default_rng([seed, TRANSFERRED_STREAM]) if has_transferred_costs(sc) else None
    for i in range(n):
        sampled = cast(SpreadCostModel, spread.sample(rng, label=f"band replay {i} seed {seed}"))
        factors = {k: quantile_factor(float(rng.uniform()), ESTIMATE_SPREADS[k].rel) for k in sorted(ESTIMATE_SPREADS)}
        moved = {} if moved_rng is None else {k: quantile_factor(float(moved_rng.uniform()), TRANSFERRED_SPREADS[k].rel)
                                              for k in sorted(TRANSFERRED_SPREADS)}
        model = dataclasses.replace(sampled, estimate_factors=factors, transferred_factors=moved)
        yield make_costs(sc, model, machine)


def steady_step_s(result: Result) -> float:
    return float(result.metrics["step_time_s"])


@dataclass(frozen=True)
class Band:
    """p10 / p50 / p90 of step time and tokens/s over ``n`` seeded replays."""

    n: int
    seed: int
    step_time_s: tuple[float, float, float]
    tokens_per_s: tuple[float, float, float]
    samples_s: tuple[float, ...]
    sampled_kinds: tuple[str, ...]  # table component kinds with a measured spread
    estimates_used: tuple[str, ...]  # analytic estimate kinds this scenario used (each drawn with its spread)
    unspread_analytic: tuple[str, ...]  # analytic costs used without a stated spread (measurement-derived)
    # The lease-to-lease log-sd drawn per component class, and where it came from.
    lease_log_sd: Mapping[str, float] = field(default_factory=dict)
    lease_source: str = "none"
    # Transferred-cost kinds (TRANSFERRED_SPREADS) this scenario used, each drawn with its extra spread.
    transferred_used: tuple[str, ...] = ()

    @property
    def half_width_rel(self) -> float:
        """(p90 - p10) / 2 / p50 of the step time: the band is p50 x (1 +- this) when symmetric."""
        lo, mid, hi = self.step_time_s
        return (hi - lo) / 2.0 / mid if mid > 0 else float("nan")

    def metrics(self) -> dict[str, float]:
        """The JSON keys of ``sosim run`` (tokens/s p10 is the rate at the p90 step time, and so on)."""
        return {
            "step_time_s_p10": self.step_time_s[0], "step_time_s_p50": self.step_time_s[1],
            "step_time_s_p90": self.step_time_s[2],
            "tokens_per_s_p10": self.tokens_per_s[0], "tokens_per_s_p50": self.tokens_per_s[1],
            "tokens_per_s_p90": self.tokens_per_s[2],
        }

    def describe(self) -> dict[str, Any]:
        """How the band was made (JSON ``band`` object)."""
        return {
            "replays": self.n, "seed": self.seed, "half_width_rel": self.half_width_rel,
            "sampled_component_kinds": list(self.sampled_kinds),
            "estimate_spreads_used": {k: ESTIMATE_SPREADS[k].rel for k in self.estimates_used},
            "analytic_without_spread": list(self.unspread_analytic),
            "lease_log_sd": dict(self.lease_log_sd), "lease_source": self.lease_source,
            "transferred_spreads_used": {k: TRANSFERRED_SPREADS[k].rel for k in self.transferred_used},
            "not_sampled": "the run-to-run spread of whole measured training steps (validation data)",
        }

    def line(self) -> str:
        """One line for tables: the band of the step time and of tokens/s."""
        lo, mid, hi = self.step_time_s
        tlo, _, thi = self.tokens_per_s
        return (f"p10-p90 step {lo:.4g}-{hi:.4g} s (p50 {mid:.4g}, +-{self.half_width_rel:.1%}), "
                f"{tlo:.4g}-{thi:.4g} tokens/s; {self.n} replays, seed {self.seed}")


def _analytic_kinds(result: Result) -> list[str]:
    text = str(result.provenance.get("costs_analytic", ""))
    if not text or text == "none" or text.startswith("all"):
        return []
    return [item.rsplit(" x", 1)[0].strip() for item in text.split(",") if item.strip()]


def simulate_band(
    sc: Scenario,
    n: int = DEFAULT_REPLAYS,
    seed: int = DEFAULT_SEED,
    step_of: Callable[[Scenario, Costs], float] | None = None,
    reference: Result | None = None,
) -> Band:
    """Replay ``sc`` ``n`` times with sampled component costs; p10/p50/p90 of step time and tokens/s.

    ``step_of(sc, costs)``: how one replay's step time is read (default: :func:`sosim.simulate` with the
    sampled costs, its ``step_time_s``); validation passes a replay that models the measuring harness.
    ``reference``: the deterministic result of ``sc`` if the caller has it (its provenance says which costs
    were analytic); computed when not given. Raises ValueError when the profile has no spread data.
    """
    if n < 2:
        raise ValueError(f"a band needs at least 2 replays, got {n}")
    reason = band_unavailable_reason(sc)
    if reason is not None:
        raise ValueError(reason)
    if step_of is None:
        def step_of(s: Scenario, costs: Costs) -> float:
            return steady_step_s(simulate(s, costs=costs))
    steps = np.array([step_of(sc, costs) for costs in sampled_cost_models(sc, n, seed)], dtype=float)
    ref = reference if reference is not None else simulate(sc)
    tokens = float(global_tokens_per_step(sc))
    step_q = tuple(float(np.quantile(steps, q)) for q in QUANTILES)
    tok_q = tuple(float(np.quantile(tokens / steps, q)) for q in QUANTILES)
    table = load_tables(sc.hardware.calibration_paths)  # non-empty: checked by the reason above
    analytic = _analytic_kinds(ref)
    used = sorted({k for k in (_estimate_kind(a) for a in analytic) if k is not None})
    lease, source = lease_spread_of(sc, table)
    moved = has_transferred_costs(sc)
    return Band(
        n=n, seed=seed, step_time_s=(step_q[0], step_q[1], step_q[2]), tokens_per_s=(tok_q[0], tok_q[1], tok_q[2]),
        samples_s=tuple(float(s) for s in steps), sampled_kinds=tuple(sorted({op for op, _ in table.columns_by_op})),
        estimates_used=tuple(used),
        unspread_analytic=tuple(a for a in analytic if _estimate_kind(a) is None
                                and not (moved and _estimate_kind(a, TRANSFERRED_SPREADS) is not None)),
        lease_log_sd=lease, lease_source=source,
        transferred_used=tuple(sorted({k for k in (_estimate_kind(a, TRANSFERRED_SPREADS) for a in analytic)
                                       if k is not None})) if moved else (),
    )


def lease_spread_of(sc: Scenario, table: Any) -> tuple[dict[str, float], str]:
    """The lease-to-lease spread a band of ``sc`` draws (the same rule as ``CalibrationTable.sampled``: the
    tables' own measured spread wins, else the profile's stated ``lease_spread``) and its source."""
    if table.session_log_sd:
        parts = ", ".join(f"{n} {c}" for c, n in sorted(table.session_points.items()))
        return dict(table.session_log_sd), f"measured: calibration sessions that repeat points ({parts})"
    stated = sc.hardware.lease_spread
    if stated is not None and any(stated.as_mapping().values()):
        # Name where the stated spread came from (a `sosim calibrate --profile` profile states its kind's measured
        # spread, or the nearest kind's with a note), so a band says which leases it stands for.
        why = "; ".join(f"{k}: {v}" for k, v in sorted(stated.sources.items()))
        return stated.as_mapping(), f"stated in the profile (lease_spread{': ' + why if why else '; see its sources'})"
    return {}, "none (the tables repeat no point and the profile states no lease_spread)"


def coverage(measured: Mapping[str, float], bands: Mapping[str, tuple[float, float]]) -> tuple[int, int, list[str]]:
    """(inside, total, ids outside): how many measured values lie inside their [p10, p90] band."""
    outside = [k for k, v in measured.items() if not bands[k][0] <= v <= bands[k][1]]
    return len(measured) - len(outside), len(measured), sorted(outside)


__all__ = [
    "DEFAULT_REPLAYS", "DEFAULT_SEED", "ESTIMATE_SPREADS", "Band", "EstimateSpread", "SpreadCostModel",
    "band_unavailable_reason", "coverage", "lease_spread_of", "quantile_factor", "sampled_cost_models",
    "simulate_band",
    "table_has_spread",
]


# ---- ``sosim run`` (the hook in sosim.cli) -------------------------------------------------------------
def add_arguments(parser: Any) -> None:
    """``--bands`` / ``--no-bands`` (default: on when the profile's table holds spread data), replays, seed."""
    g = parser.add_argument_group("error band (p10/p50/p90 from measured component spread)")
    g.add_argument("--bands", dest="bands", action="store_true", default=None,
                   help="always compute the band (an error when the profile has no spread data)")
    g.add_argument("--no-bands", dest="bands", action="store_false", help="no band (one deterministic replay)")
    g.add_argument("--band-replays", type=_replays, default=DEFAULT_REPLAYS, metavar="N",
                   help=f"replays for the band (default {DEFAULT_REPLAYS}, at most {MAX_REPLAYS:,})")
    g.add_argument("--band-seed", type=band_seed, default=DEFAULT_SEED, metavar="SEED",
                   help=f"seed of the band's draws (default {DEFAULT_SEED})")


def _replays(text: str, allow_zero: bool = False) -> int:
    import argparse

    expected = f"expected {'0 (no band) or ' if allow_zero else ''}a whole number >= 2 and <= {MAX_REPLAYS:,}"
    shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text):,} characters)"
    try:
        value = int(text) if len(text) <= 40 else None
    except ValueError:
        value = None
    if value is None or not (2 <= value <= MAX_REPLAYS or (allow_zero and value == 0)):
        raise argparse.ArgumentTypeError(f"{expected}, got {shown!r}")
    return value


def replays_or_zero(text: str) -> int:
    """``sosim validate --band-replays``: 0 (no bands) or a count as ``sosim run --band-replays`` takes."""
    return _replays(text, allow_zero=True)


def band_seed(text: str) -> int:
    """``--band-seed``: a whole number from 0 to 2^63 - 1 (numpy's seeds are non-negative)."""
    import argparse

    try:
        value = int(text) if len(text) <= 40 else -1
    except ValueError:
        value = -1
    if not 0 <= value < 2**63:
        shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text):,} characters)"
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 2^63 - 1, got {shown!r}")
    return value


def band_for_run(args: Any, sc: Scenario, result: Result) -> tuple[Band | None, str]:
    """The band ``sosim run`` prints: (band, "") or (None, why not). ``--bands`` without spread data is a
    ConfigError; the default quietly reports why there is none."""
    from sosim.inputs.errors import ConfigError

    wanted = getattr(args, "bands", None)
    if wanted is False:
        return None, "turned off (--no-bands)"
    reason = band_unavailable_reason(sc)
    if reason is not None:
        if wanted:
            raise ConfigError([f"--bands: {reason}"])
        return None, reason
    return simulate_band(sc, n=args.band_replays, seed=args.band_seed, reference=result), ""


def band_json(band: Band | None, reason: str) -> dict[str, Any]:
    """The keys ``sosim run --format json`` adds: the p10/p50/p90 metrics and how the band was made."""
    if band is None:
        return {"band": {"available": False, "reason": reason}}
    return {**band.metrics(), "band": {"available": True, **band.describe()}}
