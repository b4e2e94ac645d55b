"""sosim: discrete-event simulator of LLM-training offload schedules on GH200 and PCIe GPU servers.

Public API::

    from sosim import load_scenario, simulate, sweep
    result = simulate(load_scenario("scenarios/gh200_zero_offload_4b.yaml", ["training.micro_batch=4"]))
    result.metrics["tokens_per_s"]; result.spans; result.to_frame()
"""

from __future__ import annotations

from sosim.config import Scenario
from sosim.errors import ConfigError, SosimError
from sosim.loader import load_profile, load_scenario
from sosim.result import Result
from sosim.simulate import simulate
from sosim.sweep import sweep

__all__ = ["ConfigError", "Result", "Scenario", "SosimError", "load_profile", "load_scenario", "simulate", "sweep"]
__version__ = "0.1.0"
