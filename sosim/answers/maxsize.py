"""Largest model that fits: grow a model family until GPU or CPU memory runs out.

Feasibility depends only on memory, so the search never runs the event simulation; the final candidate is
simulated once by the caller to report its speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sosim.hardware.machine import Machine
from sosim.hardware.memory import Feasibility, check_fit
from sosim.hardware.model import total_params
from sosim.inputs.config import ModelSpec, Scenario
from sosim.inputs.errors import InfeasibleError
from sosim.schedules.registry import SYSTEMS

Growth = Literal["layers", "width", "paper", "experts"]

# GPT shapes of the SuperOffload artifact (github.com/Supercomputing-System-AI-Lab/SuperOffload):
# name -> (layers, hidden); 32 heads.
PAPER_FAMILY: tuple[tuple[str, int, int], ...] = (
    ("1B", 20, 2048), ("2B", 40, 2048), ("4B", 64, 2304), ("6B", 53, 3072), ("8B", 72, 3072),
    ("10B", 50, 4096), ("13B", 65, 4096), ("15B", 18, 8192), ("20B", 25, 8192), ("25B", 30, 8192),
    ("30B", 36, 8192), ("40B", 50, 8192), ("50B", 60, 8192), ("70B", 20, 16384),
)


@dataclass(frozen=True)
class MaxSize:
    model: ModelSpec
    params_b: float
    next_fit: Feasibility  # why the next size up does not fit
    scenario: Scenario


def fits(sc: Scenario) -> Feasibility:
    return check_fit(SYSTEMS[sc.schedule.system].memory_usage(sc), sc.hardware, Machine.from_scenario(sc))


def _with_model(sc: Scenario, **changes: object) -> Scenario:
    model = sc.model.model_copy(update=changes)
    return sc.model_copy(update={"model": ModelSpec.model_validate(model.model_dump())})


def _bisect(candidate: Callable[[int], Scenario], count: int) -> int:
    """Index of the last fitting candidate among ``count`` ordered by size (fit is monotone in size).

    Candidates are built on demand: a bisection validates ~log2(count) models, not all of them.
    """
    lo, hi = -1, count
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(candidate(mid)).feasible:
            lo = mid
        else:
            hi = mid
    return lo


def find_max_size(sc: Scenario, growth: Growth = "layers", max_layers: int = 2048) -> MaxSize:
    candidate: Callable[[int], Scenario]
    if growth == "layers":
        count = max_layers
        def candidate(i: int) -> Scenario:
            return _with_model(sc, layers=i + 1)
    elif growth == "experts":  # a mixture of experts: more routed experts per layer, the rest of the shape kept
        k = sc.model.experts_per_token
        if k is None:
            raise InfeasibleError("--grow experts needs a mixture-of-experts model (model.experts, "
                                  "model.experts_per_token)")
        count = 8192
        def candidate(i: int) -> Scenario:
            return _with_model(sc, experts=k + i)
    elif growth == "width":
        step = 64 * sc.model.heads  # head_dim grows in multiples of 64
        count = 512
        def candidate(i: int) -> Scenario:
            return _with_model(sc, hidden=(i + 1) * step, ffn=None)
    else:
        count = len(PAPER_FAMILY)
        def candidate(i: int) -> Scenario:
            name, layers, hidden = PAPER_FAMILY[i]
            return _with_model(sc, name=f"gpt-{name}", layers=layers, hidden=hidden, heads=32, kv_heads=None,
                               ffn=None, ffn_kind="gelu", vocab=50432)
    best = _bisect(candidate, count)
    if best < 0:
        raise InfeasibleError(f"no model of this family fits: {fits(candidate(0)).reason}")
    nxt = fits(candidate(best + 1)) if best + 1 < count else Feasibility(True, "end of family")
    chosen = candidate(best)
    return MaxSize(chosen.model, total_params(chosen.model) / 1e9, nxt, chosen)
