"""What ``sosim tune`` is asked and what it answers, as data: :class:`TuneOptions`, :class:`Evaluation` (one
candidate), :class:`SystemMemory` and :class:`TuneResult`. The search (sosim/answers/tune/search.py) fills them;
the report (sosim/answers/tune/report.py) and the writer (sosim/answers/tune/write_deepspeed.py) read them, without
importing the search."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError

Objective = Literal["tokens_per_s", "time_to_tokens"]
Settings = dict[str, Any]  # dotted scenario key -> value


@dataclass(frozen=True)
class TuneOptions:
    """What to search and how hard. ``None`` means: take it from the base scenario."""

    global_batch: int | None = None  # sequences per optimizer step (DeepSpeed train_batch_size)
    gpus: int | None = None
    objective: Objective = "tokens_per_s"
    token_budget: float | None = None  # tokens to train, for objective time_to_tokens
    systems: tuple[str, ...] | None = None  # None: every system of the schema
    implementation: str | None = None  # None: the base scenario's (DeepSpeed for a DeepSpeed config)
    budget: int = 2000  # simulations at most
    beam: int = 3  # structural points per system that coordinate descent starts from
    micro_batches_kept: int = 3
    exhaustive_limit: int = 64  # a system with at most this many grid points is searched exhaustively
    max_passes: int = 3  # coordinate-descent passes over the knobs
    refine_rounds: int = 3
    max_host_ram_gib: float | None = None  # per GPU; a cap below the profile's usable host memory
    max_hbm_gib: float | None = None  # per GPU; a cap below the profile's usable HBM
    jobs: int = 1  # worker processes for large batches (1: in this process)
    progress: bool | None = False  # tqdm bar on stderr; None: only when stderr is a terminal

    def check(self) -> None:
        problems = []
        if self.objective == "time_to_tokens" and not (self.token_budget and self.token_budget > 0):
            problems.append("--objective time_to_tokens needs --token-budget T (tokens to train, > 0)")
        if self.objective not in ("tokens_per_s", "time_to_tokens"):
            problems.append(f"--objective: expected tokens_per_s or time_to_tokens, got {self.objective!r}")
        for name in ("budget", "beam", "micro_batches_kept", "jobs"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("global_batch", "gpus"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name}: must be at least 1, got {value}")
        for name in ("max_host_ram_gib", "max_hbm_gib"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                problems.append(f"{name}: must be > 0 GiB, got {value}")
        if problems:
            raise ConfigError(problems)


@dataclass
class Evaluation:
    """One candidate: its settings and what became of it (memory verdict, simulation, score)."""

    system: str
    settings: Settings
    key: str
    scenario: Scenario | None = None
    gpu_mem_gib: float | None = None  # per GPU, from the memory check (or the simulation)
    cpu_mem_gib: float | None = None  # per GPU (rank), host side
    fits: bool = False
    reason: str = ""  # why it does not fit / is not valid (empty otherwise)
    reason_key: str = ""  # the summary class of ``reason`` ("GPU memory (largest: activations)")
    metrics: dict[str, Any] | None = None  # simulated metrics
    score: float | None = None  # higher is better; None: not ranked
    is_base: bool = False
    # False for the user's own configuration when it lies outside the searched space (another implementation,
    # another global batch): shown for comparison, never ranked.
    in_space: bool = True

    @property
    def simulated(self) -> bool:
        return self.metrics is not None

    @property
    def ranked(self) -> bool:
        return self.score is not None


@dataclass
class SystemMemory:
    """The 'will it fit' answer for one system."""

    system: str
    best: Evaluation | None  # best feasible configuration of the system
    candidates_checked: int
    fitting: int
    # Smallest host memory (per GPU) of the configurations of this system that fit in HBM, and the
    # installed host RAM that needs (usage + the profile's reserved memory); None if none fits in HBM.
    min_host_gib: float | None
    min_host_installed_gib: float | None
    min_hbm_gib: float | None  # same for HBM over the configurations that fit in host memory
    min_hbm_installed_gib: float | None
    unavailable: str = ""  # why the system was not searched at all


@dataclass
class TuneResult:
    base: Evaluation | None  # the user's own configuration as given
    ranked: list[Evaluation]  # feasible, simulated, best first
    evaluations: list[Evaluation]  # every candidate considered, in generation order
    systems: list[SystemMemory]
    options: TuneOptions
    global_batch: int
    tokens_per_step: int
    gpus: int
    simulated: int
    memory_rejected: int
    invalid: int
    interrupted: bool = False
    budget_exhausted: bool = False
    # Of ``simulated``: candidates whose metrics were an earlier candidate's identical simulation, reused (by
    # simulation key: sosim/answers/tune/key.py); they count against the budget like the others, so the searched set
    # is the same.
    reused: int = 0
    search_space: dict[str, list[str]] = field(default_factory=dict)  # system -> searched knob keys
    dropped_knobs: dict[str, list[str]] = field(default_factory=dict)  # system -> keys not in this schema
    hbm_usable_gib: float = 0.0
    host_usable_gib: float = 0.0
    hbm_reserved_gib: float = 0.0
    host_reserved_gib: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None

    def infeasible_summary(self) -> list[tuple[str, int]]:
        """(reason class, count) of every candidate that did not fit or was not valid, most common first."""
        counts = Counter(e.reason_key for e in self.evaluations if not e.fits and e.reason_key)
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
