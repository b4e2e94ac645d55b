"""What ``sosim tune`` prints: the top configurations, the bottleneck of each in words, why the runner-up
loses, the memory each system needs ("will it fit", "how much host RAM"), as text or one JSON object."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sosim.answers.tune.result import Evaluation, SystemMemory, TuneResult
from sosim.answers.tune.space import LABELS, TRAINING_KNOBS, Knob, all_system_knobs

# Words for the breakdown buckets of a result (sosim.run.result.BREAKDOWN_KEYS); a bucket a later build adds
# is named from its key ("exposed_nvme_s" -> "nvme exposed").
BUCKET_WORDS: dict[str, str] = {
    "gpu_compute_s": "GPU compute",
    "gpu_other_s": "other GPU work (GPU optimizer, casts, syncs)",
    "exposed_cpu_optimizer_s": "CPU Adam exposed",
    "exposed_stage3_hooks_s": "ZeRO-3 hooks (host thread) exposed",
    "exposed_cpu_cast_s": "CPU casts/bookkeeping exposed",
    "exposed_d2h_s": "device-to-host copies exposed",
    "exposed_h2d_s": "host-to-device copies exposed",
    "exposed_comm_s": "collectives exposed",
    "idle_s": "GPU idle",
}
# Below this share of the step a bucket is not worth naming.
MENTION_FRACTION = 0.02


def _breakdown_keys(metrics: Mapping[str, Any]) -> list[str]:
    try:
        from sosim.run.result import BREAKDOWN_KEYS

        keys = [k for k in BREAKDOWN_KEYS if k in metrics]
    except ImportError:  # pragma: no cover - a reshaped build
        keys = []
    extra = [k for k in metrics if k.startswith("exposed_") and k.endswith("_s") and k not in keys]
    return keys + sorted(extra)


def bucket_words(key: str) -> str:
    if key in BUCKET_WORDS:
        return BUCKET_WORDS[key]
    name = key.removesuffix("_s")
    if name.startswith("exposed_"):
        return name.removeprefix("exposed_").replace("_", " ") + " exposed"
    return name.replace("_", " ")


def _s(x: float) -> str:
    return f"{x:.3g} s"


def bottleneck(metrics: Mapping[str, Any]) -> str:
    """The bottleneck of one step in words: the largest stall if any matters, else 'compute-bound'."""
    step = float(metrics["step_time_s"])
    keys = _breakdown_keys(metrics)
    stalls = sorted(((float(metrics[k]), k) for k in keys if k != "gpu_compute_s"), key=lambda t: (-t[0], t[1]))
    compute = float(metrics.get("gpu_compute_s", 0.0))
    big = [(v, k) for v, k in stalls if v >= MENTION_FRACTION * step]
    if not big:
        return f"compute-bound: GPU compute {_s(compute)} of {_s(step)} ({compute / step:.0%})"
    v, k = big[0]
    text = f"{bucket_words(k)} {_s(v)} of {_s(step)}"
    if len(big) > 1:
        v2, k2 = big[1]
        text += f"; then {bucket_words(k2)} {_s(v2)}"
    return text + f" (GPU compute {compute / step:.0%})"


def _knob_index() -> dict[str, Knob]:
    out: dict[str, Knob] = {}
    for knob in (*TRAINING_KNOBS, *all_system_knobs()):
        out.setdefault(knob.key, knob)
    return out


KNOBS = _knob_index()


def setting_text(key: str, value: Any, dp: int = 1) -> str:
    if key in KNOBS:
        return KNOBS[key].text(value, dp)
    label = LABELS.get(key, key.rsplit(".", 1)[-1])
    return f"{label} {value:g}" if isinstance(value, float) else f"{label} {value}"


def settings_text(ev: Evaluation, skip_parallel: bool = True) -> str:
    s = ev.settings
    parts = []
    if skip_parallel and s.get("cluster.sequence_parallel", 1) == 1 and s.get("cluster.data_parallel", 1) == 1:
        keys = [k for k in s if not k.startswith("cluster.")]
    else:
        keys = list(s)
    order = ["cluster.data_parallel", "cluster.sequence_parallel", "training.micro_batch", "training.grad_accum"]
    keys = [k for k in order if k in keys] + [k for k in keys if k not in order]
    dp = int(s.get("cluster.data_parallel", 1))
    for k in keys:
        parts.append(setting_text(k, s[k], dp))
    return ", ".join(parts)


def differences(a: Evaluation, b: Evaluation) -> list[str]:
    """Settings of ``b`` that differ from ``a``, as 'label a -> b'."""
    if a.system != b.system:
        return [f"system {a.system} -> {b.system}"]
    out = []
    for k in [*a.settings, *(k for k in b.settings if k not in a.settings)]:
        va, vb = a.settings.get(k), b.settings.get(k)
        if va != vb:
            ka = setting_text(k, va) if va is not None else f"{k} unset"
            vb_text = setting_text(k, vb).split(" ", 1)[-1] if vb is not None else "unset"
            out.append(f"{ka} -> {vb_text}")
    return out


def why_loses(winner: Evaluation, other: Evaluation) -> str:
    """Why ``other`` is slower than ``winner``: the step-time delta split over the breakdown buckets."""
    mw, mo = winner.metrics or {}, other.metrics or {}
    tw, to = float(mw["tokens_per_s"]), float(mo["tokens_per_s"])
    sw, so = float(mw["step_time_s"]), float(mo["step_time_s"])
    slower = 1.0 - to / tw if tw > 0 else math.nan
    tokens_w = tw * sw
    tokens_o = to * so
    text = f"{slower:.1%} fewer tokens/s"
    if not math.isclose(tokens_w, tokens_o, rel_tol=1e-9):
        # Same global batch normally; if not (the user's own config), compare time per token.
        return text + f" (step {_s(so)} for {tokens_o:,.0f} tokens vs {_s(sw)} for {tokens_w:,.0f})"
    keys = _breakdown_keys(mw)
    deltas = sorted(((float(mo.get(k, 0.0)) - float(mw.get(k, 0.0)), k) for k in keys),
                    key=lambda t: (-abs(t[0]), t[1]))
    # Name the buckets that carry the difference (at least a tenth of it, and a millisecond).
    shown = [f"{bucket_words(k)} {d:+.3g} s" for d, k in deltas if abs(d) >= max(1e-3, 0.1 * abs(so - sw))][:3]
    text += f": step {so - sw:+.3g} s"
    if shown:
        text += " (" + ", ".join(shown) + ")"
    diff = differences(winner, other)
    if diff:
        text += "; differs in " + ", ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
    mem = []
    if winner.gpu_mem_gib is not None and other.gpu_mem_gib is not None:
        d = other.gpu_mem_gib - winner.gpu_mem_gib
        if abs(d) >= 1.0:
            mem.append(f"HBM {d:+.1f} GiB")
    if winner.cpu_mem_gib is not None and other.cpu_mem_gib is not None:
        d = other.cpu_mem_gib - winner.cpu_mem_gib
        if abs(d) >= 1.0:
            mem.append(f"host {d:+.1f} GiB")
    if mem:
        text += "; memory " + ", ".join(mem)
    return text


def _band(metrics: Mapping[str, Any], name: str, fmt: str) -> str:
    lo, hi = metrics.get(f"{name}_p10"), metrics.get(f"{name}_p90")
    if lo is None or hi is None:
        return ""
    try:
        return f" [{format(float(lo), fmt)}-{format(float(hi), fmt)}]"
    except (TypeError, ValueError):
        return ""


def distinct_top(result: TuneResult, k: int) -> list[tuple[Evaluation, list[Evaluation]]]:
    """The ``k`` best configurations with distinct scores, each with the variants of the same system within
    ``FOLD_FRACTION`` of it (knobs that make no real difference there)."""
    out: list[tuple[Evaluation, list[Evaluation]]] = []
    for ev in result.ranked:
        if out and _same_score(out[-1][0], ev):
            out[-1][1].append(ev)
            continue
        if len(out) >= k:
            break
        out.append((ev, []))
    return out


# Variants of one system within this fraction of a shown configuration are folded into it (and the knobs
# they differ in are named as having no real effect there).
FOLD_FRACTION = 1e-3


def _same_score(a: Evaluation, b: Evaluation) -> bool:
    sa, sb = a.score or 0.0, b.score or 0.0
    return a.system == b.system and abs(sa - sb) <= FOLD_FRACTION * abs(sa)


def no_effect_keys(ev: Evaluation, ties: Sequence[Evaluation]) -> list[str]:
    keys = []
    for t in ties:
        for k, v in t.settings.items():
            if ev.settings.get(k) != v and k not in keys:
                keys.append(k)
    return keys


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _hours(s: float) -> str:
    return f"{s / 3600:.3g} h"


def _metric_cell(result: TuneResult, ev: Evaluation) -> str:
    m = ev.metrics or {}
    if result.options.objective == "time_to_tokens" and result.options.token_budget:
        steps = math.ceil(result.options.token_budget / result.tokens_per_step)
        return _hours(steps * float(m["step_time_s"]))
    return f"{float(m['tokens_per_s']):,.0f}{_band(m, 'tokens_per_s', ',.0f')}"


def system_line(sm: SystemMemory, result: TuneResult) -> str:
    if sm.unavailable:
        return f"  {sm.system:<14} not searched: {sm.unavailable}"
    head = f"  {sm.system:<14} "
    if sm.best is not None:
        b = sm.best
        m = b.metrics or {}
        text = (head + f"best {float(m['tokens_per_s']):>10,.0f} tok/s  HBM {_gib(b.gpu_mem_gib):>6} GiB  "
                f"host {_gib(b.cpu_mem_gib):>6} GiB")
    else:
        reasons = [e.reason_key for e in result.evaluations if e.system == sm.system and not e.fits and e.reason_key]
        common = max(sorted(set(reasons)), key=reasons.count) if reasons else "no candidate"
        text = head + f"does not fit ({sm.candidates_checked} checked; mostly {common})"
    if sm.min_host_installed_gib is not None:
        text += f" | fits in HBM with >= {sm.min_host_installed_gib:.0f} GiB host RAM per GPU"
    elif sm.min_hbm_installed_gib is not None:
        text += f" | needs >= {sm.min_hbm_installed_gib:.0f} GiB HBM per GPU"
    return text


def _header_lines(result: TuneResult, scenario_name: str, hardware: str, elapsed_s: float | None) -> list[str]:
    o = result.options
    obj = ("tokens/s" if o.objective == "tokens_per_s"
           else f"time to {o.token_budget:,.0f} tokens (steps rounded up)")
    lines = [f"sosim tune: {scenario_name} on {hardware} x{result.gpus} GPU(s), global batch "
             f"{result.global_batch} x {result.tokens_per_step // max(result.global_batch, 1)} tokens, "
             f"objective {obj}"]
    took = f" in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    reused = (f" ({result.reused} of them the same simulation as an earlier candidate, reused)"
              if result.reused else "")
    lines.append(f"searched {len(result.search_space)} system(s): {result.simulated} candidates simulated{reused}"
                 f"{took}; "
                 f"{len(result.evaluations)} considered, {result.memory_rejected} rejected by the memory check before "
                 f"simulation, {result.invalid} not valid")
    lines += [f"NOTE: {note}" for note in result.notes]
    summary = result.infeasible_summary()
    if summary:
        lines.append("did not fit: " + "; ".join(f"{n} x {k}" for k, n in summary[:4])
                     + (f"; {len(summary) - 4} more reason(s)" if len(summary) > 4 else ""))
    return lines


def _table_lines(result: TuneResult, shown: list[tuple[Evaluation, list[Evaluation]]], top: int) -> list[str]:
    col = "tokens/s" + (" [p10-p90]" if any("tokens_per_s_p10" in (e.metrics or {}) for e in result.ranked[:top])
                        else "") if result.options.objective == "tokens_per_s" else "time"
    lines = [f" #  {'system':<14} {col:>12}  {'step s':>7}  {'HBM GiB':>7}  {'host GiB':>8}  settings"]
    for i, (ev, _ties) in enumerate(shown, 1):
        m = ev.metrics or {}
        step = f"{float(m['step_time_s']):.3f}"
        mark = " (your config)" if ev.is_base else ""
        lines.append(f"{i:>2}  {ev.system:<14} {_metric_cell(result, ev):>12}  {step:>7}  "
                     f"{_gib(ev.gpu_mem_gib):>7}  {_gib(ev.cpu_mem_gib):>8}  {settings_text(ev)}{mark}")
    lines += ["", "bottlenecks:"]
    for i, (ev, ties) in enumerate(shown, 1):
        text = f"{i:>2}  {bottleneck(ev.metrics or {})}"
        same = no_effect_keys(ev, ties)
        if same:
            text += f"  [{len(ties)} variant(s) within {FOLD_FRACTION:.1%}: " + ", ".join(
                KNOBS[k].short if k in KNOBS else LABELS.get(k, k) for k in same) + "]"
        lines.append(text)
    return lines


def _why_lines(result: TuneResult, shown: list[tuple[Evaluation, list[Evaluation]]]) -> list[str]:
    lines = []
    if len(shown) > 1:
        lines += ["", f"why #2 loses: {why_loses(shown[0][0], shown[1][0])}"]
    if shown and (len(shown) < 2 or shown[1][0].system == shown[0][0].system):
        # The runner-up is a variant of the winner: also say why the best other system loses.
        other = max((sm.best for sm in result.systems if sm.best is not None
                     and sm.best.system != shown[0][0].system), key=lambda e: e.score or 0.0, default=None)
        if other is not None:
            lines.append(f"best other system, {other.system}: {why_loses(shown[0][0], other)}")
    return lines


def _base_lines(result: TuneResult) -> list[str]:
    base, o = result.base, result.options
    if base is None or base.metrics is None or result.best is None:
        return []
    best = result.best
    gain = float(best.metrics["tokens_per_s"]) / float(base.metrics["tokens_per_s"]) - 1.0  # type: ignore[index]
    status = "" if base.fits else f" (does not fit: {base.reason_key})"
    impl = getattr(base.scenario.schedule, "implementation", None) if base.scenario is not None else None
    if impl is not None and o.implementation is not None and impl != o.implementation:
        status += f" (implementation {impl}; the search used {o.implementation})"
    return [f"your config ({base.system}, {settings_text(base)}): "
            f"{float(base.metrics['tokens_per_s']):,.0f} tok/s{status}; tuned {gain:+.1%}"]


def _memory_lines(result: TuneResult) -> list[str]:
    o = result.options
    lines = ["", f"memory per GPU (usable: HBM {result.hbm_usable_gib:.1f} GiB, host {result.host_usable_gib:.1f} GiB; "
             f"reserved {result.hbm_reserved_gib:g} / {result.host_reserved_gib:g} GiB"
             + (f"; caps: --max-hbm {o.max_hbm_gib:g}" if o.max_hbm_gib else "")
             + (f" --max-host-ram {o.max_host_ram_gib:g}" if o.max_host_ram_gib else "") + "):"]
    if result.best is not None:
        b = result.best
        lines.append(f"  winner needs {_gib(b.gpu_mem_gib)} GiB HBM and {_gib(b.cpu_mem_gib)} GiB host memory "
                     f"(install >= {(b.gpu_mem_gib or 0) + result.hbm_reserved_gib:.0f} GiB HBM, "
                     f">= {(b.cpu_mem_gib or 0) + result.host_reserved_gib:.0f} GiB host RAM per GPU)")
    lines += [system_line(sm, result) for sm in result.systems]
    if result.dropped_knobs:
        dropped = sorted({k for ks in result.dropped_knobs.values() for k in ks})
        lines.append(f"(not in this build's schema, not searched: {', '.join(dropped)})")
    return lines


def _written_lines(written: Mapping[str, Any]) -> list[str]:
    """Where the winner's DeepSpeed config went, and what the run needs besides it (tune/write_deepspeed.py)."""
    if not written.get("path"):
        return ["", f"no DeepSpeed config written: {written['skipped']}"] if written.get("skipped") else [""]
    lines = ["", f"wrote {written['path']}: {written.get('format', 'DeepSpeed config')} of #1"
             + (" (overwrote the existing file)" if written.get("overwrote") else "")]
    outside = written.get("outside_config", [])
    if outside:
        lines.append("  the run needs, besides the config (predict it with the command below):")
        lines += [f"    {change['flag']:<40} {change['reason']}" for change in outside]
        lines.append(f"  predict it: {written['run_back']}")
    listed = {change["key"] for change in outside}
    lines += [f"  not in the config: {note}" for note in written.get("not_expressible", [])
              if note.split(":")[0] not in listed]
    return lines


def format_text(result: TuneResult, top: int = 5, scenario_name: str = "", hardware: str = "",
                written: Mapping[str, Any] | None = None, elapsed_s: float | None = None) -> str:
    lines = _header_lines(result, scenario_name, hardware, elapsed_s)
    if not result.ranked:
        lines += ["", "NO CONFIGURATION FITS."]
    else:
        shown = distinct_top(result, top)
        lines += ["", *_table_lines(result, shown, top), *_why_lines(result, shown), *_base_lines(result)]
    lines += _memory_lines(result)
    if written:
        lines += _written_lines(written)
    return "\n".join(lines)


def _ev_json(result: TuneResult, ev: Evaluation, rank: int | None = None) -> dict[str, Any]:
    m = ev.metrics or {}
    out: dict[str, Any] = {
        "rank": rank, "system": ev.system, "settings": ev.settings, "is_base": ev.is_base,
        "fits": ev.fits, "reason": ev.reason, "gpu_mem_gib": ev.gpu_mem_gib, "cpu_mem_gib": ev.cpu_mem_gib,
    }
    if ev.metrics is not None:
        keep = ["step_time_s", "tokens_per_s", "mfu", "model_tflops", *_breakdown_keys(m)]
        keep += [k for k in m if k.endswith(("_p10", "_p50", "_p90"))]
        out["metrics"] = {k: m[k] for k in keep if k in m}
        out["bottleneck"] = bottleneck(m)
        if result.options.token_budget:
            steps = math.ceil(result.options.token_budget / result.tokens_per_step)
            out["time_to_tokens_s"] = steps * float(m["step_time_s"])
    return out


def to_json(result: TuneResult, top: int = 5, written: Mapping[str, Any] | None = None,
            elapsed_s: float | None = None) -> dict[str, Any]:
    shown = distinct_top(result, top)
    out: dict[str, Any] = {
        "objective": result.options.objective, "token_budget": result.options.token_budget,
        "global_batch": result.global_batch, "tokens_per_step": result.tokens_per_step, "gpus": result.gpus,
        "simulated": result.simulated, "reused": result.reused, "considered": len(result.evaluations),
        "memory_rejected": result.memory_rejected, "invalid": result.invalid,
        "interrupted": result.interrupted, "budget_exhausted": result.budget_exhausted, "elapsed_s": elapsed_s,
        "infeasible": [{"reason": k, "count": n} for k, n in result.infeasible_summary()],
        "top": [{**_ev_json(result, ev, i), "ties": len(ties), "no_effect": no_effect_keys(ev, ties)}
                for i, (ev, ties) in enumerate(shown, 1)],
        "runner_up_loses": why_loses(shown[0][0], shown[1][0]) if len(shown) > 1 else None,
        "base": _ev_json(result, result.base) if result.base is not None else None,
        "memory": {
            "hbm_usable_gib": result.hbm_usable_gib, "host_usable_gib": result.host_usable_gib,
            "hbm_reserved_gib": result.hbm_reserved_gib, "host_reserved_gib": result.host_reserved_gib,
            "systems": [{
                "system": sm.system, "unavailable": sm.unavailable or None,
                "best": _ev_json(result, sm.best) if sm.best is not None else None,
                "candidates_checked": sm.candidates_checked, "fitting": sm.fitting,
                "min_host_gib": sm.min_host_gib, "min_host_installed_gib": sm.min_host_installed_gib,
                "min_hbm_gib": sm.min_hbm_gib, "min_hbm_installed_gib": sm.min_hbm_installed_gib,
            } for sm in result.systems],
        },
        "search_space": result.search_space, "not_in_schema": result.dropped_knobs, "notes": result.notes,
        "ds_config_written": dict(written) if written else None,
    }
    return out
