"""Contention as one rule per resource kind (issue 25 item 3): the loop over a plan is written once, each kind's
demand is its rule's, and no function of the two modules is over complexity 10."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sosim import load_scenario
from sosim.engine.plan import CPU_MAIN, H2D, Category, Phase, Plan, Resource, ResourceKind
from sosim.engine.rules import STAGED_FRACTION, CopyRule, CpuRule, NvmeRule, Rules, Site
from sosim.hardware.machine import Machine, cores_id, dram_id

ENGINE = Path(__file__).resolve().parent.parent / "sosim" / "engine"


def test_no_function_of_the_contention_model_is_over_complexity_10() -> None:
    """McCabe's number as ruff counts it (C901), on the loop's module and the rules'."""
    files = [str(ENGINE / "contention.py"), str(ENGINE / "rules.py")]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", "--config",
                           "lint.mccabe.max-complexity=10", *files], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def _site() -> tuple[Machine, Site]:
    sc = load_scenario("h200x2_zero3_offload_llama2.0b")  # two ranks on one socket: cores and DRAM shared
    m = Machine.from_scenario(sc)
    return m, Site.of(m, Plan(), {s.id: k for k, s in enumerate(m.shared_resources())})


def test_each_kind_of_op_has_its_rule() -> None:
    _, site = _site()
    rules = Rules(site, simulated_ranks=2)
    assert isinstance(rules.of(Resource(ResourceKind.H2D, 0)), CopyRule)
    assert isinstance(rules.of(Resource(ResourceKind.NVME_READ, 1)), NvmeRule)
    assert isinstance(rules.of(CPU_MAIN), CpuRule)
    assert rules.of(Resource(ResourceKind.GPU, 0)) is None  # a kernel draws on nothing shared
    assert rules.of(Resource(ResourceKind.H2D, 2)) is None  # a rank not simulated


def test_a_staged_copy_takes_the_threads_and_crosses_dram_three_times() -> None:
    m, site = _site()
    plan = Plan()
    full = site.rate_Bps["h2d"]
    pinned = plan.add(H2D, "pinned", 1.0, phase=Phase.FORWARD, n_bytes=full)
    staged = plan.add(H2D, "staged", 1.0, phase=Phase.FORWARD, n_bytes=0.25 * full)
    rule = CopyRule(site)
    fast = dict(rule.demand(plan.ops[pinned], 1.0) or ())
    slow = dict(rule.demand(plan.ops[staged], 1.0) or ())
    dram, cores = site.index[dram_id(m.rank_socket[0])], site.index[cores_id(None)]
    assert STAGED_FRACTION > 0.25 and cores not in fast and fast[dram] == full
    assert slow[cores] == site.threads and slow[dram] == 3.0 * 0.25 * full


def test_the_host_thread_draws_one_core_and_no_memory() -> None:
    _, site = _site()
    plan = Plan()
    hook = plan.add(CPU_MAIN, "hook", 1e-3, phase=Phase.FORWARD, category=Category.HOOK)
    assert CpuRule(site).demand(plan.ops[hook], 1e-3) == ((site.index[cores_id(None)], 1.0),)
