"""``sosim tune``: the fastest configuration of a training run that fits, and why it wins (docs/tuner.md).

The public names (:func:`tune`, :class:`TuneOptions`, ...) are those of :mod:`sosim.answers.tune.api`, the entry
point, which says which module holds each part. They resolve on first use (PEP 562), as sosim/__init__.py's do:
a worker process that imports one part (``candidate_eval``, to simulate) does not load the search, the report
and the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sosim.answers.tune.api import (
        EXIT_INTERRUPTED,
        PARALLEL_MIN_BATCH,
        SCORE_DIGITS,
        Evaluation,
        SystemMemory,
        TuneOptions,
        Tuner,
        TuneResult,
        add_tune_parser,
        memory_check,
        register_cli,
        run_tune,
        tune,
        write_ds_config,
    )

__all__ = ["EXIT_INTERRUPTED", "PARALLEL_MIN_BATCH", "SCORE_DIGITS", "Evaluation", "SystemMemory", "TuneOptions",
           "TuneResult", "Tuner", "add_tune_parser", "memory_check", "register_cli", "run_tune", "tune",
           "write_ds_config"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("sosim.answers.tune.api"), name)
