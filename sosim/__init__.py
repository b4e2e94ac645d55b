"""sosim: discrete-event simulator of LLM-training offload schedules on GH200 and PCIe GPU servers.

Public API::

    from sosim import load_scenario, simulate, sweep
    result = simulate(load_scenario("scenarios/gh200_zero_offload_4b.yaml", ["training.micro_batch=4"]))
    result.metrics["tokens_per_s"]; result.spans; result.to_frame()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sosim.inputs.version import VERSION

if TYPE_CHECKING:
    from sosim.answers.sweep import sweep
    from sosim.inputs.config import Scenario
    from sosim.inputs.errors import ConfigError, SosimError
    from sosim.run.loader import load_profile, load_scenario
    from sosim.run.result import Result
    from sosim.run.simulate import simulate

# Where each public name lives. Resolved on first use (PEP 562) because every ``import sosim.x.y`` runs this file
# first: importing the names here would load the whole simulator (pandas, pydantic, every system) for a module
# as small as sosim.inputs.units, or for the calibration harness, which imports nothing of sosim.
_WHERE: dict[str, str] = {
    "ConfigError": "sosim.inputs.errors", "SosimError": "sosim.inputs.errors", "Scenario": "sosim.inputs.config",
    "load_profile": "sosim.run.loader", "load_scenario": "sosim.run.loader", "Result": "sosim.run.result",
    "simulate": "sosim.run.simulate", "sweep": "sosim.answers.sweep",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["ConfigError", "Result", "Scenario", "SosimError", "load_profile", "load_scenario", "simulate", "sweep"]
__version__ = VERSION
