"""One candidate of ``sosim tune``, checked without the search: its keys (for reuse and ties), its dotted
settings, its memory verdict (the same one ``simulate`` gives) and the simulation a worker runs for it."""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sosim.inputs.config import Scenario
from sosim.inputs.errors import SosimError

if TYPE_CHECKING:
    from sosim.run.simulate import EngineRuns


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt n) steps (a scenario's global batch can be large)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


SCALARS = (bool, int, float, str, type(None))


def section_keys(system: str, settings: Mapping[str, Any]) -> dict[str, Hashable] | None:
    """Per searched section, a key of its data that two candidates of ``system`` share only when that
    section's data are equal value for value and type for type (``1``, ``1.0`` and ``True`` differ; floats by
    their exact bits). A section's data are the base's (the system's schedule base) with the candidate's
    settings of that section written in (``Candidates.scenario_data``), so the settings of the section are its key.
    None when a setting is not a scalar (nothing cached)."""
    items: dict[str, list[tuple[str, str, Any]]] = {"training": [], "cluster": [], "schedule": []}
    for k, v in settings.items():
        section, _, name = k.partition(".")
        t = type(v)
        if t not in SCALARS or section not in items:
            return None
        items[section].append((name, t.__name__, v.hex() if t is float else v))
    return {section: (section, system if section == "schedule" else "", tuple(sorted(found)))
            for section, found in items.items()}


def canonical_key(system: str, settings: Mapping[str, Any]) -> str:
    return json.dumps([system, sorted(settings.items())], default=str)


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def get_dotted(sc: Scenario, key: str) -> Any:
    node: Any = sc
    for p in key.split("."):
        node = getattr(node, p)
    return node


def reason_class(reason: str, gpu_items: Mapping[str, float] | None = None,
                  cpu_items: Mapping[str, float] | None = None) -> str:
    """A short class for a memory verdict: the side(s) and their largest item."""
    classes = []
    for part in reason.split("; "):
        side = part.split(":", 1)[0].strip()
        items = gpu_items if side.startswith("GPU") else cpu_items if side.startswith("CPU") else None
        if items:
            biggest = max(sorted(items), key=lambda k: items[k])
            classes.append(f"{side} (largest item: {biggest})")
        elif "(" in part and side.endswith("memory"):
            # "GPU memory: needs 150.3 GiB (activations 90.1, ...) > ...": the first item is the largest.
            first = part.split("(", 1)[1].split(" ", 1)[0]
            classes.append(f"{side} (largest item: {first})")
        else:
            classes.append(side[:80])
    return " + ".join(classes)


def memory_check(sc: Scenario) -> tuple[float, float, bool, str, str]:
    """(HBM GiB, host GiB, fits, reason, reason class) without simulating.

    Uses the schedule's own ``memory_usage`` and ``check_fit``, which is exactly how ``simulate`` decides
    ``feasible`` (sosim/run/simulate.py); a build without them falls back to a simulation (slower, same answer).
    """
    try:
        from sosim.hardware.memory import check_fit
        from sosim.inputs.units import GIB
        from sosim.schedules.registry import SYSTEMS

        usage = SYSTEMS[sc.schedule.system].memory_usage(sc)
    except (ImportError, AttributeError, KeyError, TypeError):  # pragma: no cover - a reshaped build
        from sosim.run.simulate import simulate

        m = simulate(sc).metrics
        reason = str(m.get("reason") or "")
        return (float(m["gpu_mem_peak_gib"]), float(m["cpu_mem_peak_gib"]), bool(m["feasible"]), reason,
                reason_class(reason) if reason else "")
    fit = check_fit(usage, sc.hardware)
    klass = reason_class(fit.reason, usage.gpu_bytes, usage.cpu_bytes) if not fit.feasible else ""
    return usage.gpu_peak_bytes / GIB, usage.cpu_peak_bytes / GIB, fit.feasible, fit.reason, klass


def simulate_metrics(sc: Scenario, runs: EngineRuns | None = None) -> dict[str, Any]:
    """The metrics of one simulation (the default evaluator; tests inject their own). ``runs``: engine runs
    shared with earlier candidates whose node plan and contention were the same (see
    :class:`sosim.run.simulate.EngineRuns`; the same metrics, bit for bit)."""
    from sosim.run.simulate import simulate

    return dict(simulate(sc, runs=runs).metrics)


class _WorkerRuns:
    """The engine runs of this process, for the worker tasks of a search. Worker tasks are separate calls
    into a pool process, so what they share lives in the process: one :class:`EngineRuns`, made by the first
    task that asks. It only memoizes a pure function (the engine), so no result depends on what it holds."""

    def __init__(self) -> None:
        self.runs: EngineRuns | None = None

    def get(self) -> EngineRuns:
        if self.runs is None:
            from sosim.run.simulate import EngineRuns

            self.runs = EngineRuns()
        return self.runs


WORKER_RUNS = _WorkerRuns()


def simulate_batch(scs: Sequence[Scenario | None], share_runs: bool = False) -> list[dict[str, Any] | str]:
    """:func:`simulate_metrics` of each scenario (a worker's task: several candidates per round trip), or the
    message of the error it raised. ``share_runs``: reuse this process's engine runs across tasks."""
    runs = WORKER_RUNS.get() if share_runs else None
    out: list[dict[str, Any] | str] = []
    for sc in scs:
        assert sc is not None
        try:
            out.append(simulate_metrics(sc, runs))
        except SosimError as exc:
            out.append(str(exc))
    return out
