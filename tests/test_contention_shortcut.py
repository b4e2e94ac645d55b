"""The shortcut in contention_for (only per-rank links whose two directions fit their bidirectional total:
nothing can be oversubscribed) must give what the full per-op demands give: no effective contention."""

from __future__ import annotations

from pathlib import Path

import pytest

from sosim.engine import contention as ct
from sosim.engine.fluid import effective_contention
from sosim.hardware.machine import Machine
from sosim.run.loader import load_scenario
from sosim.run.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))


def _node(sc_path: Path) -> tuple[object, Machine, object]:
    sc = load_scenario(sc_path)
    return sc, Machine.from_scenario(sc), simulate(sc).plan


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_shortcut_is_taken_only_where_the_full_demands_contend_nothing(path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _, m, plan = _node(path)
    if not ct._only_links_that_cannot_contend(m.shared_resources()):
        return
    _, short, _ = ct.node_plan(m, plan)  # type: ignore[arg-type]
    assert short.uses == {}
    monkeypatch.setattr(ct, "_only_links_that_cannot_contend", lambda shared: False)
    full_node, full, _ = ct.node_plan(m, plan)  # type: ignore[arg-type]
    assert full.names == short.names and full.capacity == short.capacity
    # Wherever the copies draw on the link, they never oversubscribe it.
    assert effective_contention(full_node, full) is None


def test_the_gh200_takes_it_and_a_pcie_host_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GH200's spec-sheet C2C (450 + 450 <= 900 GB/s); the shipped profile's published reading (377 + 297 >
    # 450 GB/s both ways at once, nvbandwidth issue 41) can contend and takes the full path.
    sc = load_scenario("gh200_superoffload_deepspeed_8b", ["hardware.link.h2d_GBps=450", "hardware.link.d2h_GBps=450",
                                                          "hardware.link.bidir_GBps=900"])
    gh200 = Machine.from_scenario(sc)
    assert ct._only_links_that_cannot_contend(gh200.shared_resources())
    # Its copies do draw on the link (the full demands are not empty), and none is oversubscribed.
    monkeypatch.setattr(ct, "_only_links_that_cannot_contend", lambda shared: False)
    node, full, _ = ct.node_plan(gh200, simulate(sc).plan)
    assert full.uses and effective_contention(node, full) is None
    monkeypatch.undo()
    pcie = Machine.from_scenario(load_scenario("gh200_superoffload_deepspeed_8b", ["hardware=h200-pcie-gen5-x86"]))
    assert not ct._only_links_that_cannot_contend(pcie.shared_resources())  # 55.5 + 55.4 > 100 GB/s
