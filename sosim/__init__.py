"""sosim: discrete-event simulator of LLM-training offload schedules on GH200 and PCIe GPU servers.

Public API::

    from sosim import load_scenario, simulate, sweep
    result = simulate(load_scenario("scenarios/gh200_zero_offload_4b.yaml", ["training.micro_batch=4"]))
    result.metrics["tokens_per_s"]; result.spans; result.to_frame()

The names are imported when first used (PEP 562): ``import sosim`` itself stays light, so that the ``sosim``
command installs its signal handlers before pandas and pyarrow load (a Ctrl-C in the first second printed a
traceback; sosim/cli.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sosim.answers.result import Result
    from sosim.answers.simulate import simulate
    from sosim.answers.sweep import sweep
    from sosim.inputs.config import Scenario
    from sosim.inputs.errors import ConfigError, SosimError
    from sosim.inputs.loader import load_profile, load_scenario

# Public name -> the module that defines it.
_WHERE = {
    "Result": "sosim.answers.result",
    "simulate": "sosim.answers.simulate",
    "sweep": "sosim.answers.sweep",
    "Scenario": "sosim.inputs.config",
    "ConfigError": "sosim.inputs.errors",
    "SosimError": "sosim.inputs.errors",
    "load_profile": "sosim.inputs.loader",
    "load_scenario": "sosim.inputs.loader",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sosim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = ["ConfigError", "Result", "Scenario", "SosimError", "load_profile", "load_scenario", "simulate", "sweep"]
__version__ = "0.1.0"
