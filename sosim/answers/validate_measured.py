"""Measured DeepSpeed training steps as validation rows, step by step and phase by phase (issue 9).

The rows are read from data, never hand-written: every ``calibration/<machine>/deepspeed_steps.csv`` the
step script (``scripts/ds_train_step.py``) wrote, one run per ``run_id``, with the exact DeepSpeed config of
the run (column ``ds_config_file``) and the model's shape (columns ``layers``, ``hidden``, ``heads``, ...).
Each run becomes a scenario through :mod:`sosim.formats.dsconfig` (the same mapping ``sosim run --ds-config`` uses)
on the hardware profile of the machine it ran on (:data:`PROFILE_BY_MACHINE`), is simulated, and compared.
Measured runs are never model inputs: nothing here feeds a number back into a profile or a constant.

**What is compared.**

* *Step*: the median of the ``unsynced`` timing rows (the real step: one ``torch.cuda.synchronize()`` at the
  end of each step) against the predicted step of the same harness (below); p10-p90 of the measured steps
  are shown next to it. A run is "within 10%" when |predicted / measured median - 1| <= 10%.
* *Phases*: the ``phased`` rows synchronise after forward, after backward and after ``step()``; their
  medians are compared with the same three intervals of a replay that has those barriers. Where the step
  script also timed DeepSpeed's own methods inside ``step()`` (``t_<name>_s`` columns), the ones with a
  counterpart in the plan's typed ops are compared too (:data:`TIMERS`).
* The *compute floor* (``config`` floor: plain bf16 forward + backward, no optimizer) is compared with the
  GPU compute time of the plain GPU-only scenario (the ``gpu_compute_s`` metric), as before.

**How the harness's barriers are modelled** (:func:`with_barriers`). The plan's ops are typed: each has a
:class:`~sosim.engine.plan.Phase` and runs on a :class:`~sosim.engine.plan.Resource`. ``torch.cuda.synchronize()``
makes the host wait until every queued GPU-side op (GPU stream, side stream, both copy directions, collectives) is
done, and the host thread itself (``cpu_main`` resource: the training process's casts, copies, hooks) runs
its program in order. So a barrier after section *k* (forward = phase forward; backward = phases backward
and gradient; step = optimizer and refresh; fetch and checkpoint ops belong to the section of the first op
that uses them) adds, to every op of a later section of the same iteration on those resources, a dependency
on the last op of every earlier section on those resources. The CPU optimizer resource gets no barrier: it
starts when its inputs are ready (SuperOffload's worker process is not stopped by the main thread's
synchronize; ZeRO-1/2/3's Adam inside ``step()`` already waits for the last gradient copy). The end of
each step (both modes) is a barrier on every resource: the next iteration's first op on each resource waits
for everything of the previous one. The barrier plan is re-ordered topologically (resource order kept) and
run by the engine; a plan whose resource order contradicts the barriers is reported, not forced.

Why this module is over 500 lines: one pipeline from a measured run to its compared row: reading the runs (the step
CSV and each run's DeepSpeed config), the scenario of each, the replay of the harness's phase barriers on the
simulated plan, and the step and per-phase comparison. Each section consumes the previous one's types (MeasuredRun,
HarnessReplay); the barrier replay (with_barriers to harness_replay) is the part that could become a module of its
own next.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sosim.costs.model import Costs
from sosim.engine.plan import Category, Op, Phase, Plan, ResourceKind
from sosim.formats.hf_model import model_from_hf
from sosim.hardware.moe import runtime_from_tag
from sosim.inputs.config import Scenario
from sosim.inputs.ds_versions import NEWEST
from sosim.inputs.errors import ConfigError
from sosim.inputs.resources import data_root, shipped_calibration_dir
from sosim.inputs.safe_read import read_text
from sosim.run.loader import Located, available_profiles, load_scenario
from sosim.run.result import Result

# The shipped calibration folders: the checkout's calibration/, or sosim/_data/calibration in a wheel (never
# a path built from this file's location, which in an installed package is site-packages/).
ROOT = data_root()
CALIBRATION_DIR = shipped_calibration_dir()
STEPS_FILE = "deepspeed_steps.csv"
BUDGET_REL = 0.10  # issue 9: every measured offloaded run within 10% of its median
BAND_TARGET_COVERAGE = 0.80  # issue 11: >= 80% of runs inside their predicted 80% band
BAND_TARGET_HALF_WIDTH = 0.15  # ... with bands no wider than +-15%

# Machine folder prefix -> hardware profile (longest prefix first). A folder whose profile does not exist
# (yet) is listed as skipped with the reason, never simulated on a stand-in.
PROFILE_BY_MACHINE: tuple[tuple[str, str], ...] = (
    ("nvidia-h200x2-", "h200x2-pcie-gen5-x86"),
    ("nvidia-h200-", "h200-pcie-gen5-x86"),
)
SYSTEM_NAMES: dict[str, str] = {
    "floor": "compute floor (GPU only)",
    "zero2": "ZeRO-2 offload",
    "zero3": "ZeRO-3 offload",
    "superoffload": "SuperOffload",
}
OFFLOADED = ("zero2", "zero3", "superoffload")
# Configurations the step script measures that no sosim system replays: skipped with the reason, not an error.
UNMODELLED_CONFIGS: dict[str, str] = {
    "zero3gpu": "ZeRO-3 without offload (GPU AdamW): measured for its stage-3 hook timers, no sosim system replays it",
}

# Program sections of one training step, by the ops' typed phase.
FORWARD, BACKWARD, STEP = 0, 1, 2
SECTION_NAMES = ("forward", "backward", "step")
_SECTION_OF_PHASE: dict[Phase, int | None] = {
    Phase.FORWARD: FORWARD,
    Phase.BACKWARD: BACKWARD,
    Phase.GRADIENT: BACKWARD,
    Phase.OPTIMIZER: STEP,
    Phase.REFRESH: STEP,
    Phase.FETCH: None,  # the section of the op that uses it
    Phase.CHECKPOINT: None,
}
# Resources a torch.cuda.synchronize() on the host waits for (GPU-side queues) or that run the host
# thread's own program in order. Not the CPU optimizer worker.
SYNCED_KINDS: frozenset[ResourceKind] = frozenset(
    {ResourceKind.GPU, ResourceKind.GPU_CAST, ResourceKind.H2D, ResourceKind.D2H, ResourceKind.NET,
     ResourceKind.CPU_MAIN}
)


# ------------------------------------------------------------------------------------------------------
# Reading the measured runs
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stat:
    median: float
    p10: float = math.nan
    p90: float = math.nan


@dataclass(frozen=True)
class MeasuredRun:
    """One measured configuration: its step-time statistics, phase medians, timers and what it ran."""

    run_id: str
    machine: str  # the calibration folder's name
    where: str  # file:line of its unsynced row
    config: str  # floor | zero2 | zero3 | superoffload
    step: Stat  # unsynced steps
    n_steps: int
    phased_total: Stat | None
    phases: dict[str, Stat]  # forward / backward / step of the phased steps
    timers: dict[str, float]  # t_<name>_s medians (phased steps), seconds
    ds_config: Path | None
    model: dict[str, Any]  # Hugging Face config.json keys for the measured shape
    seq: int
    micro_batch: int
    activation_checkpointing: bool
    gpus: int
    clip: float
    ratio: float
    cores_perc: float
    sub_group_size: float
    model_label: str
    session: str = ""  # the step script's output folder of the device session that measured it ("" unknown)
    # The DeepSpeed release the run imported (its deepspeed_version column; "" in old rows: the release of every
    # earlier campaign, 0.19.8). The prediction runs that release's code (sosim/schedules/blocks/ds_version.py).
    deepspeed_version: str = NEWEST

    @property
    def pair_key(self) -> tuple[Any, ...]:
        """Everything but clipping and ratio: runs that differ only in those two form the effect pairs."""
        return (self.machine, self.model_label, self.seq, self.micro_batch, self.config, self.cores_perc,
                self.sub_group_size, self.activation_checkpointing, self.gpus)


@dataclass(frozen=True)
class Skipped:
    run_id: str
    machine: str
    where: str
    reason: str


def _cell(row: Mapping[str, str], key: str) -> str:
    return (row.get(key) or "").strip()


def _num(row: Mapping[str, str], key: str, where: str, default: float | None = None) -> float:
    text = _cell(row, key)
    if not text:
        if default is None:
            raise ConfigError([f"{where}: {key}: missing value"])
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError([f"{where}: {key}: expected a number, got {text!r}"]) from None
    if not math.isfinite(value):
        raise ConfigError([f"{where}: {key}: expected a finite number, got {text!r}"])
    return value


def _stat(row: Mapping[str, str], prefix: str, where: str) -> Stat | None:
    if not _cell(row, f"{prefix}_median_s"):
        return None
    return Stat(_num(row, f"{prefix}_median_s", where), _num(row, f"{prefix}_p10_s", where, math.nan),
                _num(row, f"{prefix}_p90_s", where, math.nan))


def _bool(row: Mapping[str, str], key: str, where: str, default: bool) -> bool:
    text = _cell(row, key).lower()
    if not text:
        return default
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError([f"{where}: {key}: expected true or false, got {text!r}"])


def profile_for(machine: str) -> str | None:
    for prefix, profile in PROFILE_BY_MACHINE:
        if machine.startswith(prefix):
            return profile
    return None


def _hf_config(row: Mapping[str, str], where: str) -> dict[str, Any]:
    """The measured model as a Hugging Face config. Column ``family`` (added 2026-12-01; empty in older files:
    llama): ``llama`` is sosim's torch Llama (SwiGLU, RMSNorm, untied embeddings, no biases:
    sosim/calibrate/llama.py), ``gpt2`` the GPT-2 family of sosim/calibrate/families.py (biases, LayerNorm,
    GELU, learned positions, untied head); an MoE row (family ``moe``) adds its Qwen3-MoE keys (:func:`_moe_config`)."""
    family = _cell(row, "family") or "llama"
    if family == "gpt2":
        return {
            "_name_or_path": f"measured-gpt2-{_cell(row, 'model') or 'model'}",
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "tie_word_embeddings": False,
            "n_embd": int(_num(row, "hidden", where)),
            "n_layer": int(_num(row, "layers", where)),
            "n_head": int(_num(row, "heads", where)),
            "n_inner": int(_num(row, "ffn", where)),
            "n_positions": max(int(_num(row, "seq", where)), 1024),
            "vocab_size": int(_num(row, "vocab", where)),
        }
    return {
        "_name_or_path": f"measured-llama-{_cell(row, 'model') or 'model'}",
        "model_type": "llama",
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "hidden_size": int(_num(row, "hidden", where)),
        "num_hidden_layers": int(_num(row, "layers", where)),
        "num_attention_heads": int(_num(row, "heads", where)),
        "num_key_value_heads": int(_num(row, "kv_heads", where)),
        "intermediate_size": int(_num(row, "ffn", where)),
        "vocab_size": int(_num(row, "vocab", where)),
        **_moe_config(row, where),
    }


def _moe_config(row: Mapping[str, str], where: str) -> dict[str, Any]:
    """A Qwen3-MoE step row (issue 22: Hugging Face Qwen3MoeForCausalLM built from its config): its Qwen3MoeConfig
    keys; {} for a Llama row. Columns as scripts/ds_train_step.py writes them (family moe, moe_experts, moe_top_k,
    ffn = the experts' width, head_dim, moe_impl) or as moe-needs.md named them (experts, experts_per_token,
    moe_ffn). ``_moe_impl`` (not a config key) carries how the run held and ran its experts to scenario_dict."""
    experts = _cell(row, "moe_experts") or _cell(row, "experts")
    if not experts and _cell(row, "family") != "moe":
        return {}
    top_k = "moe_top_k" if _cell(row, "moe_top_k") else "experts_per_token"
    width = "moe_ffn" if _cell(row, "moe_ffn") else "ffn"
    return {
        "_name_or_path": f"measured-qwen3-moe-{_cell(row, 'model') or 'model'}",
        "model_type": _cell(row, "model_type") or "qwen3_moe",
        "num_experts": int(_num(row, "moe_experts" if _cell(row, "moe_experts") else "experts", where)),
        "num_experts_per_tok": int(_num(row, top_k, where)),
        "moe_intermediate_size": int(_num(row, width, where)),
        "head_dim": int(_num(row, "head_dim", where)),
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "_moe_impl": _cell(row, "moe_impl"),
    }


def _ds_config_path(folder: Path, name: str) -> Path:
    """The run's DeepSpeed config: as the CSV names it (relative to the folder), else under the folder's
    ``deepspeed_runs/`` (the step script writes ``runs/``; the committed folders keep them in deepspeed_runs/)."""
    given = folder / name
    if given.is_file():
        return given
    moved = folder / "deepspeed_runs" / Path(name).name
    return moved if moved.is_file() else given


def _session(ds_config: Path | None) -> str:
    """Which device session measured a run: the ``args.out`` of its raw record (``<run_id>.json`` beside its
    DeepSpeed config). Runs of different sessions may differ by machine drift (another lease, another host)."""
    if ds_config is None:
        return ""
    record = ds_config.with_name(ds_config.name.replace(".ds_config.json", ".json"))
    try:
        data = json.loads(read_text(record, "run record"))
    except (ConfigError, ValueError):
        return ""
    args = data.get("args") if isinstance(data, dict) else None
    return str(args.get("out", "")) if isinstance(args, dict) else ""


def read_runs(folder: Path) -> tuple[list[MeasuredRun], list[Skipped]]:
    """Every run of one ``deepspeed_steps.csv`` (a run = its unsynced row + its phased row)."""
    path = folder / STEPS_FILE
    text = read_text(path, "measured steps table")  # the one bounded reader (regular files only, UTF-8)
    with contextlib.suppress(ValueError):  # file:line in messages relative to the repository when inside it
        path = path.resolve().relative_to(ROOT)
    lines = text.splitlines()
    reader = csv.DictReader(lines)
    by_run: dict[str, dict[str, tuple[int, dict[str, str]]]] = {}
    for i, row in enumerate(reader, start=2):
        run_id = _cell(row, "run_id")
        if not run_id:
            raise ConfigError([f"{path}:{i}: run_id: missing value"])
        by_run.setdefault(run_id, {})[_cell(row, "timing")] = (i, row)
    runs: list[MeasuredRun] = []
    skipped: list[Skipped] = []
    for run_id, timings in by_run.items():
        if "unsynced" not in timings:
            line = next(iter(timings.values()))[0]
            skipped.append(Skipped(run_id, folder.name, f"{path}:{line}", "no unsynced timing row"))
            continue
        line, row = timings["unsynced"]
        where = f"{path}:{line}"
        if _cell(row, "status") != "ok":
            skipped.append(Skipped(run_id, folder.name, where, f"status {_cell(row, 'status') or 'missing'}: "
                                   f"{_cell(row, 'error')[:120]}"))
            continue
        phased_row = timings.get("phased", (0, {}))[1]
        pwhere = f"{path}:{timings['phased'][0]}" if "phased" in timings else where
        phases: dict[str, Stat] = {}
        for name, prefix in (("forward", "fwd"), ("backward", "bwd"), ("step", "optimizer_step")):
            s = _stat(phased_row, prefix, pwhere) if phased_row else None
            if s is not None:
                phases[name] = s
        timers = {key[2:-2]: _num(phased_row, key, pwhere) for key in phased_row
                  if key.startswith("t_") and key.endswith("_s") and _cell(phased_row, key)}
        if phased_row and _cell(phased_row, "step_fixed_median_s"):
            timers["fixed"] = _num(phased_row, "step_fixed_median_s", pwhere)
        config = _cell(row, "config")
        if config in UNMODELLED_CONFIGS:
            skipped.append(Skipped(run_id, folder.name, where, UNMODELLED_CONFIGS[config]))
            continue
        if config not in SYSTEM_NAMES:
            raise ConfigError([f"{where}: config: unknown configuration {config!r} "
                               f"(known: {', '.join(SYSTEM_NAMES)})"])
        ds_file = _cell(row, "ds_config_file")
        ds_path = _ds_config_path(folder, ds_file) if ds_file else None
        if config != "floor" and (ds_path is None or not ds_path.is_file()):
            skipped.append(Skipped(run_id, folder.name, where, f"DeepSpeed config {ds_file or '(none)'} not found "
                                   f"in {folder}"))
            continue
        model = _hf_config(row, where)
        try:  # a shape the model reader refuses (MoE, head_dim x heads != hidden) is skipped, located, not fatal
            model_from_hf(Located(model, f"{where} (model shape columns)"))
        except ConfigError as error:
            reason = "; ".join(sorted({p.rsplit(": ", 1)[-1] for p in error.problems}))
            skipped.append(Skipped(run_id, folder.name, where, f"model not readable by sosim: {reason}"))
            continue
        step = _stat(row, "step", where)
        runs.append(MeasuredRun(
            run_id=run_id, machine=folder.name, where=where, config=config,
            step=step if step is not None else Stat(_num(row, "step_median_s", where)),
            n_steps=int(_num(row, "n_steps", where, 0)),
            phased_total=_stat(phased_row, "step", pwhere) if phased_row else None,
            phases=phases, timers=timers, ds_config=ds_path, model=model,
            seq=int(_num(row, "seq", where)), micro_batch=int(_num(row, "micro_batch", where)),
            activation_checkpointing=_bool(row, "activation_checkpointing", where, True),
            gpus=int(_num(row, "gpus", where, 1)), clip=_num(row, "gradient_clipping", where, 0.0),
            ratio=_num(row, "ratio", where, 1.0), cores_perc=_num(row, "cpuadam_cores_perc", where, 0.8),
            sub_group_size=_num(row, "sub_group_size", where, 0.0), model_label=_cell(row, "model"),
            session=_session(ds_path),
            deepspeed_version=_cell(row, "deepspeed_version").split("+")[0] or NEWEST,
        ))
    return runs, skipped


def find_run_folders(root: Path = CALIBRATION_DIR) -> list[Path]:
    """Every calibration folder holding a deepspeed_steps.csv, in name order."""
    return sorted(p.parent for p in root.glob(f"*/{STEPS_FILE}"))


# ------------------------------------------------------------------------------------------------------
# A measured run -> scenario
# ------------------------------------------------------------------------------------------------------
def scenario_dict(run: MeasuredRun, profile: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The scenario of a run: its DeepSpeed config and shape through sosim.formats.dsconfig (floor: GPU only)."""
    config = dict(run.model)
    runtime = runtime_from_tag(str(config.pop("_moe_impl", "")))  # how an MoE run held and ran its experts
    hf = model_from_hf(Located(config, f"{run.where} (model shape columns)"))
    hf.model.update(runtime)
    if run.config == "floor":
        return {
            "name": f"{run.run_id}@{run.machine}", "hardware": profile, "model": hf.model,
            "training": {"seq_len": run.seq, "micro_batch": run.micro_batch, "precision": "bf16",
                         "activation_checkpointing": run.activation_checkpointing, "gradient_clipping": 0.0},
            "schedule": {"system": "gpu_only"},
        }
    from sosim.formats.dsconfig import RunInputs, map_ds_config
    from sosim.formats.jsonio import read_json

    assert run.ds_config is not None
    inputs = RunInputs(hardware=profile, gpus=run.gpus, seq_len=run.seq,
                       activation_checkpointing=run.activation_checkpointing, overrides=tuple(overrides),
                       deepspeed_version=None if run.deepspeed_version == NEWEST else run.deepspeed_version)
    mapping = map_ds_config(read_json(run.ds_config), hf, inputs, name=f"{run.run_id}@{run.machine}")
    return mapping.scenario


def scenario_for(run: MeasuredRun, profile: str, overrides: Sequence[str] = ()) -> Scenario:
    try:
        return load_scenario(scenario_dict(run, profile, overrides), list(overrides))
    except ConfigError as exc:
        raise ConfigError([f"{run.where}: run {run.run_id}: {p}" for p in exc.problems]) from None


# ------------------------------------------------------------------------------------------------------
# The harness's barriers
# ------------------------------------------------------------------------------------------------------
class BarrierError(ValueError):
    """The plan's resource order contradicts the barriers (an op queued before one of an earlier section)."""


def op_sections(plan: Plan) -> list[int]:
    """The program section of every op (forward / backward / step); fetch and checkpoint ops take the
    section of the first op that depends on them (else of their latest dependency, else forward)."""
    sections: list[int | None] = [_SECTION_OF_PHASE[op.phase] for op in plan.ops]
    users: dict[int, int] = {}
    for op in plan.ops:
        for d in op.deps:
            users.setdefault(d, op.id)
    # Resolve from the last op backwards: a user always has a larger id than what it depends on.
    for op in reversed(plan.ops):
        if sections[op.id] is None and op.id in users:
            sections[op.id] = sections[users[op.id]]
    for op in plan.ops:
        if sections[op.id] is None:
            sections[op.id] = max((sections[d] or FORWARD for d in op.deps), default=FORWARD)
    return [s if s is not None else FORWARD for s in sections]


def with_barriers(plan: Plan, phased: bool) -> Plan:
    """The plan as the step script runs it: a barrier at the end of every step, and with ``phased`` also
    after forward and after backward (see the module docstring)."""
    sections = op_sections(plan)
    extra: dict[int, set[int]] = {}
    by_iteration: dict[int, list[Op]] = {}
    for op in plan.ops:
        by_iteration.setdefault(op.iteration, []).append(op)
    iterations = sorted(by_iteration)
    for before, after in itertools.pairwise(iterations):
        last = {}
        for op in by_iteration[before]:
            last[op.resource] = op.id
        first_seen: set[Any] = set()
        for op in by_iteration[after]:
            if op.resource not in first_seen:
                first_seen.add(op.resource)
                extra.setdefault(op.id, set()).update(last.values())
    if phased:
        for ops in by_iteration.values():
            for k in (BACKWARD, STEP):
                last_before: dict[Any, int] = {}
                for op in ops:
                    if op.resource.kind in SYNCED_KINDS and sections[op.id] < k:
                        last_before[op.resource] = op.id
                for op in ops:
                    if op.resource.kind in SYNCED_KINDS and sections[op.id] == k:
                        extra.setdefault(op.id, set()).update(last_before.values())
    return _reorder(plan, extra)


def _reorder(plan: Plan, extra: Mapping[int, set[int]]) -> Plan:
    """A new plan with the extra dependencies, ops renumbered in a topological order that keeps every
    resource's queue order (Kahn's algorithm, smallest original id first)."""
    import heapq

    ops = plan.ops
    deps: list[set[int]] = [set(op.deps) | extra.get(op.id, set()) for op in ops]
    prev_on_resource: dict[Any, int] = {}
    for op in ops:
        p = prev_on_resource.get(op.resource)
        if p is not None:
            deps[op.id].add(p)
        prev_on_resource[op.resource] = op.id
    waiting = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in ops]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(ops):
        stuck = next(op for op in ops if waiting[op.id] > 0)
        raise BarrierError(f"the harness's barriers contradict the plan's resource order (first blocked op: "
                           f"{stuck.name}, iteration {stuck.iteration})")
    new_id = {old: new for new, old in enumerate(order)}
    new_ops = [dataclasses.replace(ops[old], id=new_id[old],
                                   deps=tuple(sorted(new_id[d] for d in set(ops[old].deps) | extra.get(old, set()))))
               for old in order]
    return Plan(new_ops, [new_id[i] for i in plan.iteration_starts])


def run_engine(plan: Plan, sc: Scenario | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every op of one rank's ``plan``; with ``sc``, through the same node expansion and
    shared-resource contention as :func:`sosim.run.simulate.simulate` (ranks of one host contend for its cores,
    DRAM and links), returning rank 0's view."""
    if sc is None:
        from sosim.engine.simpy_engine import run_plan

        return run_plan(plan)
    from sosim.engine.contention import node_plan
    from sosim.engine.simpy_engine import run_plan_detailed
    from sosim.hardware.machine import Machine

    node, contention, ranks = node_plan(Machine.from_scenario(sc), plan)
    run = run_plan_detailed(node, contention)
    return run.start_s[::ranks], run.end_s[::ranks]


@dataclass(frozen=True)
class PhasedView:
    """The measured iteration of the phased replay: its ops, their times, sections and the barrier times."""

    plan: Plan
    start_s: np.ndarray
    end_s: np.ndarray
    sections: list[int]
    iteration: int
    t0: float  # the iteration starts
    b1: float  # forward's barrier returns
    b2: float  # backward's barrier returns
    t_end: float  # step() and its synchronize return

    def busy(self, pick: Callable[[Op], bool], section: int | None = None) -> float:
        """Summed run times of the iteration's ops that ``pick`` selects (in ``section`` if given): end - start,
        so an op stretched by contention (ranks sharing a host) counts as long as it really ran, as a timer
        around it would measure."""
        return float(sum(self.end_s[op.id] - self.start_s[op.id] for op in self.plan.ops
                         if op.iteration == self.iteration and pick(op)
                         and (section is None or self.sections[op.id] == section)))

    def last_end(self, pick: Callable[[Op], bool]) -> float:
        ends = [float(self.end_s[op.id]) for op in self.plan.ops if op.iteration == self.iteration and pick(op)]
        return max(ends, default=self.t0)


@dataclass(frozen=True)
class HarnessReplay:
    """Predicted step of the unsynced steps, and forward / backward / step of the phased steps."""

    step_s: float
    phased_total_s: float
    phases_s: dict[str, float]
    view: PhasedView | None = None


def harness_step_s(plan: Plan, sc: Scenario | None = None) -> float:
    """The predicted step of the unsynced steps: the plan with a barrier at the end of every step."""
    unsynced = with_barriers(plan, phased=False)
    start, _ = run_engine(unsynced, sc)
    its = unsynced.iteration_starts
    return float(start[its[-1]] - start[its[-2]])


def harness_replay(plan: Plan, sc: Scenario | None = None) -> HarnessReplay:
    step = harness_step_s(plan, sc)
    phased = with_barriers(plan, phased=True)
    start, end = run_engine(phased, sc)
    sections = op_sections(phased)
    it = phased.measured_iteration
    t0 = float(start[phased.iteration_starts[-2]])
    ends = {k: t0 for k in range(3)}
    t_end = t0
    for op in phased.ops:
        if op.iteration != it:
            continue
        t_end = max(t_end, float(end[op.id]))
        if op.resource.kind in SYNCED_KINDS:
            for k in range(sections[op.id], 3):
                ends[k] = max(ends[k], float(end[op.id]))
    b1 = ends[FORWARD]
    b2 = max(ends[BACKWARD], b1)
    phases = {"forward": b1 - t0, "backward": b2 - b1, "step": t_end - b2}
    view = PhasedView(phased, start, end, sections, it, t0, b1, b2, t_end)
    return HarnessReplay(step, t_end - t0, phases, view)


# ------------------------------------------------------------------------------------------------------
# Timers inside step(): measured (t_<name>_s, scripts/ds_train_step.py + sosim/calibrate/ds_timers.py) vs
# the phased replay's typed ops. Host wall-clock timers around DeepSpeed 0.19.8's optimizer methods; each
# counterpart below says which ops it sums. Timers without a counterpart are shown measured only.
# ------------------------------------------------------------------------------------------------------
_CPU = (ResourceKind.CPU_MAIN, ResourceKind.CPU_OPT)


def _cpu_optimizer_work(op: Op) -> bool:
    """Optimizer math on a CPU resource: Adam, and the unscale/clip pass (the typed fields do not tell them
    apart, so the timers they are compared with are summed the same way)."""
    return op.resource.kind in _CPU and op.category is Category.OPTIMIZER


def _worker_adam(op: Op) -> bool:
    return op.resource.kind is ResourceKind.CPU_OPT and op.category is Category.OPTIMIZER


def _refresh_blocking(op: Op) -> bool:
    return op.phase is Phase.REFRESH and op.resource.kind in (ResourceKind.CPU_MAIN, ResourceKind.H2D)


def _timer(names: tuple[str, ...], minus: tuple[str, ...] = ()) -> Callable[[Mapping[str, float]], float | None]:
    """A measured quantity: the sum of timers ``names`` minus ``minus`` (None when one is missing)."""
    def measured(timers: Mapping[str, float]) -> float | None:
        if any(n not in timers for n in (*names, *minus)):
            return None
        return sum(timers[n] for n in names) - sum(timers[n] for n in minus)
    return measured


def _adam_unscale(v: PhasedView, run: MeasuredRun) -> float:
    return v.busy(_cpu_optimizer_work, STEP)


def _unscale_main(v: PhasedView, run: MeasuredRun) -> float:
    return v.busy(lambda o: o.resource.kind is ResourceKind.CPU_MAIN and o.category is Category.OPTIMIZER, STEP)


def _refresh(v: PhasedView, run: MeasuredRun) -> float:
    return v.busy(_refresh_blocking, STEP)


def _wait_worker(v: PhasedView, run: MeasuredRun) -> float:
    # step() waits for the worker's outstanding sub-groups: from backward's barrier to the worker's last Adam.
    return max(0.0, v.last_end(_worker_adam) - v.b2)


def _worker_in_step(v: PhasedView, run: MeasuredRun) -> float:
    return v.busy(_worker_adam, STEP)


def _fixed(v: PhasedView, run: MeasuredRun) -> float:
    # The step script's fixed part (ds_timers.fixed_part_s) minus unscale/clip: step() minus the optimizer
    # math, the refresh (stage 3) and the worker wait / synchronous worker Adam (SuperOffload).
    if run.config == "superoffload":
        worker = _worker_in_step(v, run) if run.clip > 0 else _wait_worker(v, run)
        parts = _unscale_main(v, run) + _refresh(v, run) + worker
    else:
        parts = _adam_unscale(v, run) + (_refresh(v, run) if run.config == "zero3" else 0.0)
    return max(0.0, (v.t_end - v.b2) - parts)


@dataclass(frozen=True)
class TimerCheck:
    """One measured quantity inside step() (a sum of the step script's timers) and its predicted counterpart."""

    name: str
    description: str
    systems: tuple[str, ...]
    measured: Callable[[Mapping[str, float]], float | None]
    predicted: Callable[[PhasedView, MeasuredRun], float]
    clipping: bool | None = None  # only runs with (True) / without (False) clipping; None: both

    def applies(self, run: MeasuredRun) -> bool:
        return run.config in self.systems and (self.clipping is None or self.clipping == (run.clip > 0))


TIMERS: tuple[TimerCheck, ...] = (
    TimerCheck("adam+unscale", "Adam and unscale/clip inside step() (t_optimizer + t_unscale_clip) vs the CPU "
               "optimizer-category ops of the step", ("zero2", "zero3"),
               _timer(("optimizer", "unscale_clip")), _adam_unscale),
    TimerCheck("unscale", "SuperOffload's unscale/clip pass in step() (t_unscale_clip) vs the main process's "
               "optimizer-category ops of the step", ("superoffload",), _timer(("unscale_clip",)), _unscale_main),
    TimerCheck("refresh", "the stage-3 refresh (t_refresh: _reassign_or_swap_out_partitioned_parameters, a "
               "blocking copy_ per sub-group) vs the refresh ops of the step", ("zero3", "superoffload"),
               _timer(("refresh",)), _refresh),
    TimerCheck("worker wait", "SuperOffload without clipping: step() waiting for the worker (t_wait_async) vs "
               "the worker's Adam after backward's barrier", ("superoffload",), _timer(("wait_async",)),
               _wait_worker, clipping=False),
    TimerCheck("worker Adam", "SuperOffload with clipping: the synchronous worker Adam (t_sync_cpu_optimizer) "
               "vs the worker's Adam inside step()", ("superoffload",), _timer(("sync_cpu_optimizer",)),
               _worker_in_step, clipping=True),
    TimerCheck("fixed", "step()'s fixed part without unscale/clip (step_fixed - t_unscale_clip) vs the rest of "
               "the predicted step", ("zero2", "zero3", "superoffload"), _timer(("fixed",), ("unscale_clip",)),
               _fixed),
)


def predicted_timers(view: PhasedView, run: MeasuredRun) -> dict[str, float]:
    return {t.name: t.predicted(view, run) for t in TIMERS if t.applies(run)}


def measured_timers(run: MeasuredRun) -> dict[str, float]:
    out = {}
    for t in TIMERS:
        if t.applies(run):
            value = t.measured(run.timers)
            if value is not None:
                out[t.name] = value
    return out


# ------------------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    run: MeasuredRun
    profile: str
    predicted_s: float  # harness replay of the unsynced steps (floor: GPU compute of forward + backward)
    simulate_step_s: float  # sosim's plain steady step (no per-step barrier)
    phases_pred: dict[str, float] = field(default_factory=dict)
    phased_total_pred: float = math.nan
    timers_pred: dict[str, float] = field(default_factory=dict)
    band: tuple[float, float, float] | None = None  # p10, p50, p90 of the predicted step
    note: str = ""

    @property
    def error(self) -> float:
        return self.predicted_s / self.run.step.median - 1.0

    @property
    def within(self) -> bool:
        return abs(self.error) <= BUDGET_REL

    @property
    def in_band(self) -> bool | None:
        if self.band is None:
            return None
        return self.band[0] <= self.run.step.median <= self.band[2]

    @property
    def band_half_width(self) -> float:
        if self.band is None:
            return math.nan
        return (self.band[2] - self.band[0]) / 2.0 / self.band[1]

    def row(self) -> dict[str, Any]:
        r = self.run
        return {
            "run_id": r.run_id, "machine": r.machine, "profile": self.profile, "system": r.config,
            "gpus": r.gpus, "measured_s": r.step.median, "measured_p10_s": r.step.p10, "measured_p90_s": r.step.p90,
            "n_steps": r.n_steps, "predicted_s": self.predicted_s, "error": self.error, "within": self.within,
            "simulate_step_s": self.simulate_step_s,
            "band_p10_s": self.band[0] if self.band else None, "band_p90_s": self.band[2] if self.band else None,
            "in_band": self.in_band,
            "phases": {name: {"measured_s": r.phases[name].median, "predicted_s": self.phases_pred.get(name)}
                       for name in SECTION_NAMES if name in r.phases},
            "timers_raw_s": dict(sorted(r.timers.items())),
            "timers": {name: {"measured_s": measured_timers(r).get(name), "predicted_s": value}
                       for name, value in self.timers_pred.items()},
            "source": r.where, "note": self.note,
        }


def predict(run: MeasuredRun, profile: str, bands: int = 0, seed: int = 0,
            overrides: Sequence[str] = ()) -> RunResult:
    """Simulate one measured run (and its band of ``bands`` replays when > 0)."""
    from sosim.run.simulate import simulate

    sc = scenario_for(run, profile, overrides)
    result = simulate(sc)
    if run.config == "floor":
        out = RunResult(run, profile, float(result.metrics["gpu_compute_s"]), float(result.metrics["step_time_s"]))
        spans = _section_busy(result)
        out.phases_pred = {"forward": spans[FORWARD], "backward": spans[BACKWARD]}
        if bands:
            out.band = _band(sc, bands, seed, lambda s, c: float(simulate(s, costs=c).metrics["gpu_compute_s"]),
                             result)
        return out
    replay = harness_replay(result.plan, sc)
    out = RunResult(run, profile, replay.step_s, float(result.metrics["step_time_s"]),
                    phases_pred=replay.phases_s, phased_total_pred=replay.phased_total_s,
                    timers_pred=predicted_timers(replay.view, run) if replay.view else {})
    if bands:
        out.band = _band(sc, bands, seed, lambda s, c: harness_step_s(simulate(s, costs=c).plan, s), result)
    return out


def _section_busy(result: Result) -> dict[int, float]:
    """GPU compute seconds of forward and backward in the measured iteration (floor runs)."""
    it = result.plan.measured_iteration
    out = {FORWARD: 0.0, BACKWARD: 0.0, STEP: 0.0}
    sections = op_sections(result.plan)
    for op in result.plan.ops:
        if op.iteration == it and op.resource.kind is ResourceKind.GPU and op.category is Category.COMPUTE:
            out[sections[op.id]] += float(result.end_s[op.id] - result.start_s[op.id])
    return out


def _band(sc: Scenario, n: int, seed: int, step_of: Callable[[Scenario, Costs], float],
          reference: Result) -> tuple[float, float, float] | None:
    from sosim.answers.bands import band_unavailable_reason, simulate_band

    if band_unavailable_reason(sc) is not None:
        return None
    b = simulate_band(sc, n=n, seed=seed, step_of=step_of, reference=reference)
    return b.step_time_s


@dataclass
class Report:
    results: list[RunResult]
    skipped: list[Skipped]

    def systems(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        groups: dict[str, list[RunResult]] = {}
        for r in self.results:
            groups.setdefault(r.run.config, []).append(r)
        for name in [*SYSTEM_NAMES]:
            if name in groups:
                out[name] = _summary(groups[name])
        offloaded = [r for r in self.results if r.run.config in OFFLOADED]
        if offloaded:
            out["offloaded (all)"] = _summary(offloaded)
        return out

    def effects(self) -> list[dict[str, Any]]:
        """Paired runs: clipping on vs off, ratio < 1 vs 1 (same everything else): measured vs predicted
        difference of the step, so an effect the model mis-sizes is visible even when the steps match."""
        by_key: dict[tuple[Any, ...], list[RunResult]] = {}
        for r in self.results:
            by_key.setdefault(r.run.pair_key, []).append(r)
        rows = []
        for group in by_key.values():
            for r in group:
                if r.run.clip > 0:
                    base = [b for b in group if b.run.clip == 0 and b.run.ratio == r.run.ratio]
                    if base:
                        rows.append(_effect(f"clipping {r.run.clip:g} vs 0", base[0], r))
                if r.run.ratio < 1.0:
                    base = [b for b in group if b.run.ratio == 1.0 and b.run.clip == r.run.clip]
                    if base:
                        rows.append(_effect(f"ratio {r.run.ratio:g} vs 1", base[0], r))
        return sorted(rows, key=lambda x: (x["effect"], x["run_id"]))

    def coverage(self) -> dict[str, Any]:
        banded = [r for r in self.results if r.band is not None]
        inside = [r for r in banded if r.in_band]
        widths = [r.band_half_width for r in banded]
        return {
            "runs_with_band": len(banded), "inside": len(inside),
            "coverage": len(inside) / len(banded) if banded else math.nan,
            "target_coverage": BAND_TARGET_COVERAGE,
            "half_width_median": float(np.median(widths)) if widths else math.nan,
            "half_width_max": float(np.max(widths)) if widths else math.nan,
            "target_half_width": BAND_TARGET_HALF_WIDTH,
            "outside": [r.run.run_id + "@" + r.run.machine for r in banded if not r.in_band],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": [r.row() for r in self.results],
            "systems": self.systems(),
            "effects": self.effects(),
            "bands": self.coverage(),
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
            "budget_rel": BUDGET_REL,
        }


def _summary(results: Sequence[RunResult]) -> dict[str, Any]:
    errors = [abs(r.error) for r in results]
    return {"runs": len(results), "mean_abs_error": float(np.mean(errors)),
            "max_abs_error": float(np.max(errors)), "within_10pct": sum(r.within for r in results)}


def _effect(label: str, base: RunResult, other: RunResult) -> dict[str, Any]:
    measured = other.run.step.median - base.run.step.median
    predicted = other.predicted_s - base.predicted_s
    # The larger of the two runs' measured p10-p90 half-widths: an effect smaller than this is not resolved
    # by the measurement (its sign and size are run-to-run noise).
    noise = max(_half_spread(base.run.step), _half_spread(other.run.step))
    return {
        "effect": label, "run_id": other.run.run_id, "base_run_id": base.run.run_id, "machine": other.run.machine,
        "measured_s": measured, "predicted_s": predicted,
        "measured_rel": measured / base.run.step.median, "predicted_rel": predicted / base.predicted_s,
        "error_of_effect": (predicted - measured) / abs(measured) if measured else math.nan,
        "measured_noise_s": noise, "resolved": abs(measured) > noise,
        "same_session": base.run.session == other.run.session,
        "phases": {name: {"measured_s": other.run.phases[name].median - base.run.phases[name].median,
                          "predicted_s": other.phases_pred.get(name, math.nan) - base.phases_pred.get(name, math.nan)}
                   for name in SECTION_NAMES if name in other.run.phases and name in base.run.phases},
    }


def _half_spread(s: Stat) -> float:
    if not (math.isfinite(s.p10) and math.isfinite(s.p90)):
        return 0.0
    return (s.p90 - s.p10) / 2.0


def validate_measured(folders: Iterable[Path] | None = None, bands: int = 0, seed: int = 0,
                      overrides: Sequence[str] = (), progress: bool = False) -> Report:
    """Every measured run of every folder, predicted and compared (``bands`` replays per run when > 0).
    ``progress``: a bar on stderr (the CLI passes whether stderr is a terminal)."""
    results: list[RunResult] = []
    skipped: list[Skipped] = []
    known = available_profiles()
    todo: list[tuple[MeasuredRun, str]] = []
    for folder in find_run_folders() if folders is None else folders:
        runs, skip = read_runs(Path(folder))
        skipped += skip
        profile = profile_for(Path(folder).name)
        for run in runs:
            if profile is None or profile not in known:
                skipped.append(Skipped(run.run_id, run.machine, run.where,
                                       f"no hardware profile for machine folder {run.machine}"
                                       + (f" (expected {profile})" if profile else "")))
            else:
                todo.append((run, profile))
    from tqdm import tqdm  # plain (not .auto): the bar goes to stderr

    for run, profile in tqdm(todo, desc="validate: measured runs", unit="run", file=sys.stderr,
                             disable=not progress, dynamic_ncols=True, leave=False):
        try:
            results.append(predict(run, profile, bands, seed, overrides))
        except BarrierError as exc:
            skipped.append(Skipped(run.run_id, run.machine, run.where, str(exc)))
    return Report(results, skipped)


# ------------------------------------------------------------------------------------------------------
# Text output
# ------------------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _s(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _label(r: RunResult) -> str:
    return f"{r.run.run_id}@{r.run.machine.removeprefix('nvidia-')}"


def format_report(rep: Report) -> str:
    width = max([len(_label(r)) for r in rep.results] + [3])
    lines = ["Measured DeepSpeed runs (step = median of unsynced steps; predicted = the step script's replay)",
             f"{'run':<{width}} {'system':<12} {'measured (p10-p90)':<22} {'pred':>7} {'error':>7} "
             f"{'band p10-p90':<14} ok"]
    for r in rep.results:
        m = r.run.step
        band = f"{r.band[0]:.3f}-{r.band[2]:.3f}" if r.band else "—"
        mark = ("yes" if r.within else "NO") + ("" if r.in_band is None else (" in" if r.in_band else " out"))
        lines.append(f"{_label(r):<{width}} {r.run.config:<12} "
                     f"{m.median:.3f} ({m.p10:.3f}-{m.p90:.3f})  {r.predicted_s:>7.3f} {_pct(r.error):>7} "
                     f"{band:<14} {mark}")
    lines.append("")
    lines.append(f"{'system':<24} {'runs':>4} {'mean |err|':>10} {'max |err|':>10} {'within 10%':>10}")
    for name, s in rep.systems().items():
        lines.append(f"{SYSTEM_NAMES.get(name, name):<24} {s['runs']:>4} {s['mean_abs_error']:>10.1%} "
                     f"{s['max_abs_error']:>10.1%} {s['within_10pct']:>6}/{s['runs']}")
    cov = rep.coverage()
    if cov["runs_with_band"]:
        lines.append("")
        lines.append(f"bands: {cov['inside']}/{cov['runs_with_band']} measured medians inside their predicted "
                     f"p10-p90 ({cov['coverage']:.0%}, target >= {BAND_TARGET_COVERAGE:.0%}); half-width median "
                     f"{cov['half_width_median']:.1%}, max {cov['half_width_max']:.1%} (target <= "
                     f"{BAND_TARGET_HALF_WIDTH:.0%})")
    for skip in rep.skipped:
        lines.append(f"skipped {skip.run_id}@{skip.machine}: {skip.reason} ({skip.where})")
    return "\n".join(lines)


def phase_rows(rep: Report) -> list[dict[str, Any]]:
    """One row per run and phase: measured vs predicted (the docs' phase table)."""
    rows = []
    for r in rep.results:
        for name in SECTION_NAMES:
            if name in r.run.phases and name in r.phases_pred:
                meas, pred = r.run.phases[name].median, r.phases_pred[name]
                rows.append({"run_id": r.run.run_id, "machine": r.run.machine, "system": r.run.config,
                             "phase": name, "measured_s": meas, "predicted_s": pred,
                             "error": pred / meas - 1.0 if meas > 0 else math.nan})
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``sosim validate`` options for the measured runs (the hook in sosim.answers.validate)."""
    p.add_argument("--no-measured", action="store_true", help="skip the measured DeepSpeed runs")
    p.add_argument("--measured", action="append", metavar="DIR", default=None,
                   help="calibration folder(s) with deepspeed_steps.csv (default: every one under calibration/)")
    from sosim.answers.bands import replays_or_zero

    p.add_argument("--band-replays", type=replays_or_zero, default=64, metavar="N",
                   help="replays per measured run for its error band (0: no bands; default 64)")
