"""sosim: discrete-event simulator of LLM-training offload schedules on GH200 and PCIe GPU servers.

Public API::

    from sosim import load_scenario, simulate, sweep
    result = simulate(load_scenario("scenarios/gh200_zero_offload_4b.yaml", ["training.micro_batch=4"]))
    result.metrics["tokens_per_s"]; result.spans; result.to_frame()
"""

from __future__ import annotations

from sosim.answers.result import Result
from sosim.answers.simulate import simulate
from sosim.answers.sweep import sweep
from sosim.inputs.config import Scenario
from sosim.inputs.errors import ConfigError, SosimError
from sosim.inputs.loader import load_profile, load_scenario

__all__ = ["ConfigError", "Result", "Scenario", "SosimError", "load_profile", "load_scenario", "simulate", "sweep"]
__version__ = "0.1.0"
