"""``sosim tune``: the fastest configuration of a training run that fits, and why it wins.

Given a scenario (or the user's DeepSpeed config + model config + hardware profile), the tuner searches the
system (gpu_only, zero_offload, the ZeRO-3 family, SuperOffload...), the implementation knobs of each system
(:mod:`sosim.answers.tune.space`, from the systems), activation checkpointing, the micro-batch / gradient accumulation
split at a fixed global batch, and the data / sequence parallel split where there are several GPUs. Only
configurations that fit in memory on every side are ranked. docs/tuner.md describes the design.

This module is the public entry point (:func:`tune`, and the names below); each part has its own module:

- the search strategy, its stages and order: sosim/answers/tune/search.py (:class:`Tuner`);
- candidates, their validated scenarios and memory verdicts: sosim/answers/tune/candidates.py;
- what defines a simulation (the reuse key): sosim/answers/tune/key.py;
- evaluation, batches and worker processes: sosim/answers/tune/execute.py;
- scores, ranking and the result: sosim/answers/tune/rank.py;
- options and answers as data: sosim/answers/tune/result.py;
- the command line: sosim/answers/tune/cli.py; the report: sosim/answers/tune/report.py;
- the written config: sosim/answers/tune/write_deepspeed.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from sosim.answers.tune.candidate_eval import memory_check
from sosim.answers.tune.cli import EXIT_INTERRUPTED, add_tune_parser, register_cli, run_tune
from sosim.answers.tune.execute import PARALLEL_MIN_BATCH
from sosim.answers.tune.rank import SCORE_DIGITS
from sosim.answers.tune.result import Evaluation, SystemMemory, TuneOptions, TuneResult
from sosim.answers.tune.search import Tuner
from sosim.answers.tune.write_deepspeed import write_ds_config
from sosim.inputs.config import Scenario
from sosim.run.loader import load_scenario


def tune(base: Scenario | str | Path | Mapping[str, Any], options: TuneOptions | None = None, *,
         overrides: Sequence[str] | None = None, executor: Executor | None = None,
         evaluate: Callable[[Scenario], dict[str, Any]] | None = None, memo: bool = True) -> TuneResult:
    """Search the fastest configuration of ``base`` that fits (see docs/tuner.md).

    ``base`` is a Scenario, a scenario YAML path or dict (``overrides`` apply as with ``load_scenario``).
    ``executor`` (any ``concurrent.futures.Executor``) evaluates large batches in parallel; by default
    ``options.jobs`` worker processes are started when ``jobs > 1``. ``memo=False`` simulates every candidate
    rather than reusing an identical earlier simulation (sosim/answers/tune/key.py; the same result, slower).
    """
    sc = base if isinstance(base, Scenario) else load_scenario(base, list(overrides or []))
    if isinstance(base, Scenario) and overrides:
        sc = load_scenario(base.model_dump(mode="python", exclude_unset=True), list(overrides))
    return Tuner(sc, options, evaluate=evaluate, executor=executor, memo=memo).run()


__all__ = ["EXIT_INTERRUPTED", "PARALLEL_MIN_BATCH", "SCORE_DIGITS", "Evaluation", "SystemMemory", "TuneOptions",
           "TuneResult", "Tuner", "add_tune_parser", "memory_check", "register_cli", "run_tune", "tune",
           "write_ds_config"]
