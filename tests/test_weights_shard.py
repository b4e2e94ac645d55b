"""Host-streamed weights (ZeRO-Infinity offload_param: cpu, SuperOffload weight-flow) with several ranks: each
rank copies only its 1/dp shard from host memory, then the layer is all-gathered (issue 10)."""

from __future__ import annotations

import pytest

from sosim.run.loader import load_scenario
from sosim.run.simulate import simulate


def _fetch_and_gather(gpus: int) -> tuple[float, float, int]:
    sc = load_scenario("gh200_zero_infinity_13b", overrides=["hardware=hgx-h100x8-x86", f"cluster.gpus={gpus}"])
    plan = simulate(sc).plan
    it = plan.ops[-1].iteration
    fetch = next(op for op in plan.ops if op.iteration == it and op.name.startswith("fetch_fwd:"))
    layer = fetch.name.split(":", 1)[1]
    gather = [op for op in plan.ops if op.iteration == it and op.name == f"allgather_fwd:{layer}"]
    return fetch.n_bytes, gather[0].n_bytes if gather else 0.0, sc.model.hidden


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_each_rank_fetches_its_shard_and_the_layer_is_gathered(gpus: int) -> None:
    one, gathered_one, _ = _fetch_and_gather(1)
    many, gathered, _ = _fetch_and_gather(gpus)
    assert gathered_one == 0.0
    assert many == pytest.approx(one / gpus, rel=1e-12)
    # The all-gather moves the other ranks' shards of the same bf16 layer: (dp - 1) / dp of it.
    assert gathered == pytest.approx(one * (gpus - 1) / gpus, rel=1e-12)
