"""``sosim check``: a user's CI guard on predicted throughput.

``sosim check --write BASELINE scenarios...`` predicts each scenario and stores, per scenario, the numbers
(tokens/s, step time, MFU, peak GPU and CPU memory, feasibility) and what produced them: the scenario file and
its SHA-256, the overrides, the hardware profile's name, file and SHA-256, the calibration tables and their
SHA-256, the system and implementation, sosim's version and a digest of its code. ``sosim check BASELINE``
predicts the same scenarios again, compares every number under a stated relative tolerance (1% unless
``--tolerance`` says otherwise), and for each scenario that moved names the inputs that moved.

Exit status: 0 every scenario within tolerance, 1 some prediction moved, 2 bad input (a missing or corrupt
baseline, a scenario that no longer loads). ``--junit FILE`` writes JUnit XML, one testcase per scenario, for
CI systems that show test reports. The baseline is JSON (indented, stable key order) so that it diffs well
when committed next to the scenarios.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from sosim.answers.check_rows import entry_problems
from sosim.formats import safe_write
from sosim.formats.output import check_finite_result, json_safe, print_json
from sosim.inputs.errors import ConfigError, SosimError
from sosim.inputs.version import VERSION

BASELINE_FORMAT = "sosim-check/1"
DEFAULT_TOLERANCE_REL = 0.01  # 1%: far above the simulator's run-to-run noise (it is deterministic: none)
# Compared numbers: key in the result's metrics -> (label, the direction that is better).
METRICS: dict[str, tuple[str, str]] = {
    "tokens_per_s": ("tokens/s", "higher"),
    "step_time_s": ("step time (s)", "lower"),
    "mfu": ("MFU", "higher"),
    "gpu_mem_peak_gib": ("peak GPU memory (GiB)", "lower"),
    "cpu_mem_peak_gib": ("peak CPU memory (GiB)", "lower"),
}
# Inputs a prediction depends on, in the order a moved scenario names them.
INPUT_LABELS: dict[str, str] = {
    "scenario_sha256": "scenario file",
    "overrides": "overrides",
    "profile_sha256": "hardware profile",
    "calibration": "calibration table",
    "system": "system",
    "implementation": "implementation",
    "sosim_version": "sosim version",
    "sosim_code_sha256": "sosim code",
}


# ------------------------------------------------------------------------------------------- fingerprints
def sha256_file(path: Path) -> str:
    """Through the one bounded reader (a file swapped for a FIFO after it loaded is refused, not read)."""
    from sosim.inputs.safe_read import MAX_TABLE_BYTES, read_bytes

    return hashlib.sha256(read_bytes(path, "file", MAX_TABLE_BYTES)).hexdigest()


def code_sha256() -> str:
    """A digest of sosim's own source: an editable install keeps its version while its code changes."""
    root = Path(str(files("sosim")))
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _profile_source(source: str, overrides: Sequence[str]) -> tuple[Path | None, str]:
    """The profile file load_scenario picks for ``source`` and its SHA-256; for a profile written inline in
    the scenario, (None, the SHA-256 of that mapping as JSON): the same on every machine, unlike the resolved
    profile, which holds absolute calibration paths."""
    from sosim.run.loader import parse_override, read_yaml, resolve_profile_path, resolve_scenario_path

    path = resolve_scenario_path(source)
    data = read_yaml(path).data
    ref = data.get("hardware") if isinstance(data, dict) else None
    for text in overrides:
        key_path, value = parse_override(text)
        if key_path == ("hardware",):
            ref = value
    if isinstance(ref, (str, Path)):
        with contextlib.suppress(KeyError):  # an unknown name: load_scenario has said so already
            found = resolve_profile_path(str(ref), path.resolve().parent)
            return found, sha256_file(found)
    return None, hashlib.sha256(json.dumps(ref, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Prediction:
    """One scenario predicted now: its numbers and the fingerprint of everything that produced them."""

    metrics: dict[str, Any]
    inputs: dict[str, Any]


def predict(source: str, overrides: Sequence[str], version: str, code: str) -> Prediction:
    """Load and simulate one scenario (``source``: a file or a shipped example's name) and fingerprint it."""
    from sosim.run.loader import load_scenario, resolve_scenario_path
    from sosim.run.simulate import simulate

    sc = load_scenario(source, overrides)
    result = simulate(sc)
    check_finite_result(source, result.metrics)  # an inf/NaN number is not a prediction to store or compare
    scenario_file = resolve_scenario_path(source)
    profile, profile_sha = _profile_source(source, overrides)
    inputs = {
        "scenario_file": str(scenario_file), "scenario_sha256": sha256_file(scenario_file),
        "overrides": list(overrides),
        "profile": sc.hardware.name, "profile_file": None if profile is None else str(profile),
        "profile_sha256": profile_sha,
        "calibration": [{"file": p, "sha256": sha256_file(Path(p))} for p in sc.hardware.calibration_paths],
        "system": str(sc.schedule.system),
        "implementation": str(getattr(sc.schedule, "implementation", None) or "(one implementation)"),
        "sosim_version": version, "sosim_code_sha256": code,
    }
    metrics: dict[str, Any] = {key: float(result.metrics[key]) for key in METRICS}
    metrics["feasible"] = bool(result.metrics["feasible"])
    metrics["reason"] = str(result.metrics.get("reason", ""))
    return Prediction(metrics, inputs)


def sosim_version() -> str:
    return VERSION


# ------------------------------------------------------------------------------------------- baseline
@dataclass(frozen=True)
class Entry:
    """A baseline's scenario: how to load it again and what it predicted."""

    id: str  # the scenario as given on the command line
    source: str  # file relative to the baseline's folder, or a shipped example's name
    example: bool
    overrides: list[str]
    metrics: dict[str, Any]
    inputs: dict[str, Any]

    def load_source(self, baseline: Path) -> str:
        if self.example or Path(self.source).is_absolute():
            return self.source
        return str(baseline.parent / self.source)


def _stored_source(given: str, baseline: Path) -> tuple[str, bool]:
    """A scenario file relative to the baseline's folder (the baseline moves with the scenarios it checks);
    a shipped example by name (it is found in whichever sosim checks it)."""
    if not Path(given).exists():
        return given, True
    try:
        return os.path.relpath(Path(given).resolve(), baseline.resolve().parent), False
    except ValueError:  # another drive
        return str(Path(given).resolve()), False


def write_baseline(path: Path, sources: Sequence[str], overrides: Sequence[str], progress: bool,
                   force: bool = False) -> list[Entry]:
    dupes = sorted({s for s in sources if sources.count(s) > 1})
    if dupes:
        raise SosimError(f"check --write: scenario(s) given twice: {', '.join(dupes)}")
    version, code = sosim_version(), code_sha256()
    entries = []
    for given in _progress(sources, progress, "check --write"):
        try:
            pred = predict(given, overrides, version, code)
            stored, example = _stored_source(given, path)
        except OSError as exc:  # a name the file system refuses (too long, ...): the scenario's problem
            raise SosimError(f"{_shown(given)}: cannot read scenario: {exc.strerror or exc}") from None
        entries.append(Entry(given, stored, example, list(overrides), pred.metrics, pred.inputs))
    doc = {"format": BASELINE_FORMAT, "sosim_version": version,
           "scenarios": [{"id": e.id, "source": e.source, "example": e.example, "overrides": e.overrides,
                          "metrics": e.metrics, "inputs": e.inputs} for e in entries]}
    text = json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"
    # Atomic (a reader never sees half a baseline), and never over a file that is not a baseline, nor over a
    # scenario it records (sosim/formats/safe_write.py).
    safe_write.write_atomic(path, "--write", "sosim check baseline", lambda p: p.write_text(text),
                            safe_write.CHECK_BASELINE, force=force, inputs=_inputs(sources))
    return entries


def _inputs(sources: Sequence[str]) -> list[str]:
    from sosim.run.loader import input_files

    return input_files(sources)


def read_baseline(path: Path) -> list[Entry]:
    """The baseline's scenarios; every problem as ``file:line: key: message``."""
    from sosim.formats.jsonio import read_json

    loc = read_json(path)
    data = loc.data
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise ConfigError([f"{path}:1: format: not a sosim check baseline (expected \"format\": "
                           f"\"{BASELINE_FORMAT}\"; write one with sosim check --write {path} SCENARIO...)"])
    rows = data.get("scenarios")
    if not isinstance(rows, list) or not rows:
        raise ConfigError([f"{loc.where(('scenarios',))}: scenarios: must be a non-empty list"])
    problems: list[str] = []
    for i, row in enumerate(rows):
        problems += entry_problems(row, i, loc, METRICS)
    if problems:
        raise ConfigError(problems)
    return [Entry(r["id"], r["source"], r["example"], [str(o) for o in r["overrides"]], r["metrics"], r["inputs"])
            for r in rows]


# ------------------------------------------------------------------------------------------- comparing
def parse_tolerances(specs: Sequence[str]) -> dict[str, float]:
    """``--tolerance`` values: ``2%`` or ``0.02`` for every number, ``tokens_per_s=0.5%`` for one."""
    tol = dict.fromkeys(METRICS, DEFAULT_TOLERANCE_REL)
    for spec in specs:
        key, sep, value = spec.rpartition("=")
        keys = [key.strip()] if sep else list(METRICS)
        if sep and key.strip() not in METRICS:
            raise SosimError(f"--tolerance {spec}: unknown number '{key.strip()}' (one of {', '.join(METRICS)})")
        text = value.strip()
        try:
            rel = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
        except ValueError:
            raise SosimError(f"--tolerance {spec}: '{text}' is not a number (e.g. 1% or 0.01)") from None
        if not (math.isfinite(rel) and 0.0 <= rel < 10.0):
            raise SosimError(f"--tolerance {spec}: must be a relative tolerance from 0 to 1000%")
        tol.update(dict.fromkeys(keys, rel))
    return tol


@dataclass
class Outcome:
    """One scenario checked: the numbers that moved (beyond tolerance), the inputs that moved, or an error."""

    entry: Entry
    now: Prediction | None = None
    moved: list[str] = field(default_factory=list)  # one line per number outside its tolerance
    changes: dict[str, float] = field(default_factory=dict)  # relative change of every compared number
    inputs_moved: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return "error" if self.error else ("moved" if self.moved else "ok")


def _rel(old: float, new: float) -> float:
    if old == new:
        return 0.0
    return (new - old) / abs(old) if old else math.inf


def compare(entry: Entry, now: Prediction, tol: dict[str, float], only_worse: bool) -> Outcome:
    out = Outcome(entry, now)
    for key, (label, better) in METRICS.items():
        old, new = float(entry.metrics[key]), float(now.metrics[key])
        change = _rel(old, new)
        out.changes[key] = change
        worse = change < 0 if better == "higher" else change > 0
        if abs(change) > tol[key] and (worse or not only_worse):
            out.moved.append(f"{label} {old:.6g} -> {new:.6g} ({change:+.2%}, tolerance {tol[key]:.2%})")
    if entry.metrics["feasible"] != now.metrics["feasible"]:
        was, is_ = ("feasible", "INFEASIBLE") if entry.metrics["feasible"] else ("infeasible", "feasible")
        if is_ == "INFEASIBLE" or not only_worse:
            reason = f": {now.metrics['reason']}" if now.metrics["reason"] else ""
            out.moved.append(f"{was} -> {is_}{reason}")
    out.inputs_moved = inputs_moved(entry.inputs, now.inputs)
    return out


def _shown(text: str) -> str:
    """A name as messages show it: at most 200 characters."""
    return text if len(text) <= 200 else f"{text[:100]}...({len(text)} characters)"


def _short(digest: Any) -> str:
    return str(digest)[:12]


def inputs_moved(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each recorded input that differs, as ``label: before -> now``."""
    lines = []
    for key, label in INPUT_LABELS.items():
        before, after = old[key], new[key]  # read_baseline checked the recorded ones
        if key == "calibration":
            before = [c["sha256"] for c in before]
            after = [c["sha256"] for c in after]
        if before == after:
            continue
        if key == "scenario_sha256":
            lines.append(f"{label} {new['scenario_file']}: sha256 {_short(before)} -> {_short(after)}")
        elif key == "profile_sha256":
            lines.append(f"{label} {old.get('profile')} ({old.get('profile_file') or 'inline'}, sha256 "
                         f"{_short(before)}) -> {new['profile']} ({new['profile_file'] or 'inline'}, sha256 "
                         f"{_short(after)})")
        elif key == "calibration":
            was, now = (", ".join(f"{Path(c['file']).parent.name}/{Path(c['file']).name} {_short(c['sha256'])}"
                                  for c in d["calibration"]) for d in (old, new))
            lines.append(f"{label}(s) [{was or 'none'}] -> [{now or 'none'}]")
        elif key.endswith("sha256"):
            lines.append(f"{label} sha256 {_short(before)} -> {_short(after)}")
        else:
            lines.append(f"{label} {before} -> {after}")
    return lines


def check_entries(entries: Sequence[Entry], baseline: Path, tol: dict[str, float], extra: Sequence[str],
                  only_worse: bool, progress: bool) -> list[Outcome]:
    version, code = sosim_version(), code_sha256()
    outcomes = []
    for entry in _progress(entries, progress, "check"):
        t0 = time.perf_counter()
        try:
            now = predict(entry.load_source(baseline), [*entry.overrides, *extra], version, code)
            outcome = compare(entry, now, tol, only_worse)
        except SosimError as exc:  # the scenario no longer loads (or no longer simulates): say where
            lines = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            outcome = Outcome(entry, error="; ".join(lines))
        except OSError as exc:
            outcome = Outcome(entry, error=f"{_shown(entry.source)}: cannot read scenario: {exc.strerror or exc}")
        outcome.seconds = time.perf_counter() - t0
        outcomes.append(outcome)
    return outcomes


def _progress(items: Sequence[Any], enabled: bool, desc: str) -> Iterator[Any]:
    """A progress bar on stderr when it is a terminal (tqdm; plain iteration otherwise)."""
    if not enabled:
        yield from items
        return
    from tqdm import tqdm  # plain (not .auto): the bar goes to stderr

    yield from tqdm(items, desc=desc, unit="scenario", file=sys.stderr, dynamic_ncols=True, leave=False)


# ------------------------------------------------------------------------------------------- reports
def junit_xml(outcomes: Sequence[Outcome], baseline: Path) -> str:
    """JUnit XML: one testsuite, one testcase per scenario; a moved scenario is a failure, one that no longer
    loads an error. The message names the moved numbers; the text adds the moved inputs."""
    failures = sum(o.status == "moved" for o in outcomes)
    errors = sum(o.status == "error" for o in outcomes)
    suite = ET.Element("testsuite", name=f"sosim check {baseline}", tests=str(len(outcomes)),
                       failures=str(failures), errors=str(errors),
                       time=f"{sum(o.seconds for o in outcomes):.3f}")
    for o in outcomes:
        case = ET.SubElement(suite, "testcase", classname="sosim.answers.check", name=o.entry.id,
                             time=f"{o.seconds:.3f}")
        if o.error:
            ET.SubElement(case, "error", message=o.error[:500], type="input").text = o.error
        elif o.moved:
            text = "\n".join([*o.moved, "inputs that moved:", *(o.inputs_moved or [_NONE_MOVED])])
            ET.SubElement(case, "failure", message="; ".join(o.moved), type="prediction moved").text = text
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


_NONE_MOVED = ("none of the recorded inputs (scenario, overrides, profile, calibration, sosim version and code) "
               "moved: a dependency or the environment did")


def text_report(outcomes: Sequence[Outcome], baseline: Path, tol: dict[str, float]) -> str:
    tols = ", ".join(f"{METRICS[k][0]} {v:.2%}" for k, v in tol.items())
    lines = [f"sosim check {baseline}: {len(outcomes)} scenario(s); tolerances: {tols}"]
    for o in outcomes:
        head = f"{o.status.upper():<6} {o.entry.id}"
        if o.error:
            lines.append(f"{head}: {o.error}")
            continue
        assert o.now is not None
        tps = o.now.metrics["tokens_per_s"]
        lines.append(f"{head}: {tps:,.0f} tokens/s ({o.changes['tokens_per_s']:+.2%}), profile "
                     f"{o.now.inputs['profile']}, implementation {o.now.inputs['implementation']}")
        lines += [f"         moved: {m}" for m in o.moved]
        if o.moved:
            lines += [f"         input moved: {m}" for m in o.inputs_moved or [_NONE_MOVED]]
        elif o.inputs_moved:
            lines += [f"         (input moved, predictions held: {m})" for m in o.inputs_moved]
    counts = {s: sum(o.status == s for o in outcomes) for s in ("ok", "moved", "error")}
    lines.append(f"\n{counts['ok']} ok, {counts['moved']} moved, {counts['error']} error(s)")
    return "\n".join(lines)


def _json_report(outcomes: Sequence[Outcome], baseline: Path, tol: dict[str, float]) -> dict[str, Any]:
    return {"baseline": str(baseline), "tolerances_rel": tol, "scenarios": [
        {"id": o.entry.id, "status": o.status, "error": o.error or None, "moved": o.moved,
         "inputs_moved": o.inputs_moved, "changes_rel": o.changes,
         "baseline": o.entry.metrics, "now": None if o.now is None else o.now.metrics,
         "inputs": None if o.now is None else o.now.inputs} for o in outcomes]}


# ------------------------------------------------------------------------------------------- command
def _cmd(args: argparse.Namespace) -> int:
    progress = sys.stderr.isatty()
    if args.write is not None:
        # argparse fills the optional BASELINE positional first: with --write it is the first scenario.
        sources = [s for s in (args.baseline, *args.scenarios) if s is not None]
        if not sources:
            raise SosimError("check --write BASELINE: name the scenario files (or shipped examples) to record")
        from sosim.run.loader import input_files

        force = getattr(args, "force", False)
        path = safe_write.prepare_output(args.write, "--write", "sosim check baseline", safe_write.CHECK_BASELINE,
                                         force=force, inputs=input_files(sources))
        entries = write_baseline(path, sources, args.overrides, progress, force)
        print(f"wrote {path}: {len(entries)} scenario(s), sosim {sosim_version()}")
        for e in entries:
            print(f"  {e.id}: {e.metrics['tokens_per_s']:,.0f} tokens/s, profile {e.inputs['profile']}"
                  + ("" if e.metrics["feasible"] else " (INFEASIBLE)"))
        return 0
    if args.baseline is None or args.scenarios:
        raise SosimError("check: give one BASELINE to check (sosim check BASELINE), or record one with "
                         "sosim check --write BASELINE SCENARIO...")
    tol = parse_tolerances(args.tolerance)
    force = getattr(args, "force", False)
    junit = (safe_write.prepare_output(args.junit, "--junit", "JUnit report", safe_write.JUNIT, force=force,
                                       inputs=[args.baseline]) if args.junit is not None else None)
    baseline = Path(args.baseline)
    entries = read_baseline(baseline)
    outcomes = check_entries(entries, baseline, tol, args.overrides, args.only_worse, progress)
    if junit is not None:
        text = junit_xml(outcomes, baseline)
        safe_write.write_atomic(junit, "--junit", "JUnit report", lambda p: p.write_text(text), safe_write.JUNIT,
                                force=force, inputs=[args.baseline])
    if args.format == "json":
        print_json(_json_report(outcomes, baseline, tol))
    else:
        print(text_report(outcomes, baseline, tol))
    errors = [o for o in outcomes if o.error]
    for o in errors:  # the lines that say what to fix, on stderr too (stdout may be a JSON file)
        print(f"sosim check: {baseline}: scenario {o.entry.id}: {o.error}", file=sys.stderr)
    return 2 if errors else (1 if any(o.moved for o in outcomes) else 0)


def register_cli(sub: Any) -> None:
    p = sub.add_parser("check", help="compare predictions with a stored baseline (CI regression guard)",
                       description=(__doc__ or "").split("\n\n")[1])
    p.add_argument("baseline", nargs="?", metavar="BASELINE",
                   help="baseline JSON to check against (with --write: the first scenario)")
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="with --write: scenario files or example names")
    p.add_argument("--write", metavar="BASELINE", help="predict SCENARIOs and record them in BASELINE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override applied to every scenario (recorded with --write; added on top when checking)")
    p.add_argument("--tolerance", action="append", default=[], metavar="[NUMBER=]REL",
                   help=f"relative tolerance, e.g. 2%% or 0.02 for every number, tokens_per_s=0.5%% for one "
                        f"(numbers: {', '.join(METRICS)}; default {DEFAULT_TOLERANCE_REL * 100:g}%%)")
    p.add_argument("--only-worse", action="store_true",
                   help="fail only when a number moves the bad way (slower, more memory, infeasible)")
    p.add_argument("--junit", metavar="OUT.xml", help="write JUnit XML, one testcase per scenario")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=_cmd)
