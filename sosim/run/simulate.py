"""``simulate(scenario) -> Result``: the one pure entry point (no files written, no global state)."""

from __future__ import annotations

import gc
from collections.abc import Callable

from sosim.costs.analytic import AnalyticCostModel
from sosim.costs.model import Costs
from sosim.engine import fast as engine_fast
from sosim.engine import simpy_engine
from sosim.engine.contention import node_plan
from sosim.engine.fingerprint import engine_fingerprint
from sosim.engine.fluid import Contention, EngineRun
from sosim.engine.plan import Plan
from sosim.hardware.machine import Machine
from sosim.hardware.memory import check_fit
from sosim.hardware.model import tokens_per_gpu
from sosim.inputs.config import Scenario
from sosim.run.result import Result, compute_metrics
from sosim.schedules.blocks import ds_version
from sosim.schedules.registry import SYSTEMS

# The engine's contract: a node plan and its contention in, every op's start and end (and stretch) out.
Engine = Callable[[Plan, Contention | None], EngineRun]

# The engines, by name: SimPy is the reference; "fast" is the same run without SimPy (sosim/engine/fast.py,
# held equal to SimPy by tests/test_engines.py), the default. docs/engines.md describes both.
ENGINES: dict[str, Engine] = {"simpy": simpy_engine.run_plan_detailed, "fast": engine_fast.run_plan_detailed}
DEFAULT_ENGINE = "fast"


def make_cost_model(sc: Scenario) -> AnalyticCostModel:
    """The profile's component costs: the analytic model, or its measured table over it (sosim/costs/table.py)."""
    analytic = AnalyticCostModel(sc.hardware, sc.model, sc.training, tokens_per_gpu(sc))
    if sc.hardware.calibration is None:
        return analytic
    # Imported here so that profiles without a calibration table never touch its reader.
    from sosim.costs.table import TableCostModel

    return TableCostModel.from_profile(analytic)


def make_costs(sc: Scenario, components: AnalyticCostModel | None = None, machine: Machine | None = None) -> Costs:
    """The cost object of ``sc``: ``components`` (default: the profile's, :func:`make_cost_model`) on the
    scenario's machine topology, with its own cache (sosim/costs/model.py)."""
    machine = Machine.from_scenario(sc) if machine is None else machine
    return Costs(make_cost_model(sc) if components is None else components, machine)


class EngineRuns:
    """Engine runs by :func:`sosim.engine.fingerprint.engine_fingerprint` of what the engine ran: a search's
    candidates whose node plans and contention are equal share one run (the engine is a pure function of
    them). Bounded by the ops held (``max_ops``: starts and ends, 16 bytes an op, so 64 MiB at the default):
    beyond it the oldest runs are forgotten (a later twin runs the engine again, with the same result).
    ``hits``/``misses`` count lookups."""

    def __init__(self, max_ops: int = 1 << 22) -> None:
        self.max_ops = max_ops
        self.runs: dict[bytes, EngineRun] = {}
        self.ops_held = 0
        self.hits = 0
        self.misses = 0

    def run(self, engine: str, node: Plan, contention: Contention | None) -> EngineRun:
        key = engine_fingerprint(node, contention, engine)
        hit = self.runs.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        run = ENGINES[engine](node, contention)
        # Shared by every twin's result: nobody may write into it.
        run.start_s.flags.writeable = False
        run.end_s.flags.writeable = False
        while self.runs and self.ops_held + len(run.start_s) > self.max_ops:
            self.ops_held -= len(self.runs.pop(next(iter(self.runs))).start_s)
        if len(run.start_s) <= self.max_ops:
            self.runs[key] = run
            self.ops_held += len(run.start_s)
        return run


def simulate(sc: Scenario, costs: Costs | None = None, engine: str = DEFAULT_ENGINE, *,
             runs: EngineRuns | None = None) -> Result:
    """Simulate ``sc`` and return its metrics, spans and memory. Deterministic for a given scenario.

    ``costs``: another cost object for the same scenario (error bands replay sampled tables,
    sosim.answers.bands); default: the profile's own (:func:`make_costs`). ``engine``: a name in
    :data:`ENGINES` ("simpy", the reference, or "fast", the default); the result's provenance names it.
    ``runs``: engine runs to share with earlier simulations whose node plan and contention were the same
    (the tuner's; same result)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    # A simulation allocates many small, acyclic objects (ops, tuples, events) and frees them all at once:
    # the cyclic garbage collector would only walk them again and again. Paused here, restored after.
    paused = gc.isenabled()
    gc.disable()
    try:
        return simulate_with(sc, costs, engine, runs)
    finally:
        if paused:
            gc.enable()


def simulate_with(sc: Scenario, costs: Costs | None, engine: str, runs: EngineRuns | None = None) -> Result:
    """:func:`simulate` without the garbage-collector pause: the engine named ``engine`` runs the node plan
    (or ``runs`` has its run already)."""
    machine = Machine.from_scenario(sc)
    costs = make_costs(sc, machine=machine) if costs is None else costs
    module = SYSTEMS[sc.schedule.system]
    usage = module.memory_usage(sc)
    # One rank's plan, expanded to the ranks of one node that share a host, with the node's shared resources
    # handed to the engine (sosim/engine/contention.py).
    plan = module.build_plan(sc, costs, machine)
    node, contention, ranks = node_plan(machine, plan)
    run = ENGINES[engine](node, contention) if runs is None else runs.run(engine, node, contention)
    # Metrics, spans and trace are rank 0's view (its ops are every ranks-th op of the node plan).
    start, end = run.start_s[::ranks], run.end_s[::ranks]
    fit = check_fit(usage, sc.hardware, machine)
    metrics = compute_metrics(sc, plan, start, end, usage, fit)
    prov = provenance(sc, costs, module.choices(sc, machine))
    prov["engine"] = engine
    prov.update({k: str(v) for k, v in machine.describe().items()})
    # The FLOP convention behind model_tflops / mfu (sosim/hardware/model.py): long-sequence anchors hinge on it.
    prov["attention_flops"] = "causal (half the s x s matrix; x2 for Megatron/paper-style full counting)"
    prov.update({f"contention_{k}_s": f"{v:.6g}" for k, v in run.stretch_s.items()})
    return Result(sc, metrics, plan, start, end, usage, prov)


def provenance(sc: Scenario, costs: Costs, choices: dict[str, str]) -> dict[str, str]:
    """What produced a result: system, implementation, hardware profile, cost model and calibration table,
    then the cost model's own notes and the choices the system made for this scenario."""
    sched = sc.schedule
    out = {
        "system": sched.system,
        "implementation": str(getattr(sched, "implementation", "n/a")),
        "profile": sc.hardware.name,
        "calibration": "none",
    }
    out.update(ds_version.describe(sc))  # which DeepSpeed release the system runs, and what that changes
    out.update(costs.provenance)
    out.update(choices)
    return out
