"""Multiplexed routing through real replicas: a model sticks to the replica that holds it,
a hot one spreads (docs/using.md, policy/model_routing.py).

Its own instance with one proxy worker: the copy bound is each router's, and several
routers racing to spread one model may each add a copy before they hear of the other's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from surge.api.instance import current
from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def one_proxy() -> Iterator[Running]:
    with running_instance(proxy_workers=1) as instance:
        yield instance


@serve.deployment(num_replicas=3, max_ongoing_requests=4)
class Spread:
    """Which replica answered, whether the model was resident, and what this replica holds."""

    def __init__(self) -> None:
        import os

        self.pid = os.getpid()
        self.loads: list[str] = []

    @serve.multiplexed(max_num_models_per_replica=4, max_replicas_per_model=2)
    async def get_model(self, model_id: str) -> str:
        self.loads.append(model_id)
        await asyncio.sleep(0.2)  # a model load
        return model_id

    async def __call__(self, request: Any = None) -> dict[str, Any]:
        await self.get_model(serve.get_multiplexed_model_id())
        await asyncio.sleep(0.05)  # the model runs
        return {"pid": self.pid, "loads": list(self.loads)}


def test_a_model_sticks_to_its_replica_and_a_hot_one_spreads(one_proxy: Running) -> None:
    surge_instance = one_proxy
    serve.run(Spread.bind(), name="spread", route_prefix="/spread")
    url = f"{surge_instance.url}/spread"

    def get(model: str) -> dict[str, Any]:
        response = httpx.get(url, headers={"serve_multiplexed_model_id": model}, timeout=30)
        assert response.status_code == 200, response.text
        return dict(response.json())

    # Sequential requests for one model: all on the replica that loaded it, one load.
    answers = [get("m1") for _ in range(8)]
    assert len({a["pid"] for a in answers}) == 1
    assert answers[-1]["loads"].count("m1") == 1
    # Another model goes elsewhere (the replica with the fewest models).
    assert get("m2")["pid"] != answers[0]["pid"]

    # 12 concurrent requests for a hot model overflow one replica (4 at a time): it
    # spreads to a second one, and no further (max_replicas_per_model=2).
    async def burst() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as client:
            responses = await asyncio.gather(*(
                client.get(url, headers={"serve_multiplexed_model_id": "hot"})
                for _ in range(12)))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        return [dict(r.json()) for r in responses]

    hot = asyncio.run(burst())
    holders = {a["pid"] for a in hot}
    assert len(holders) == 2, hot
    loads = {a["pid"]: a["loads"].count("hot") for a in hot}
    assert all(count == 1 for count in loads.values()), loads

    # `surge status` (and the dashboard) show each replica's models, from its telemetry.
    instance = current()
    assert instance is not None

    def holding_hot() -> int:
        return sum("hot" in r["models"] for r in instance.call("replicas", timeout=10)
                   if r["app"] == "spread")

    eventually(lambda: holding_hot() == 2, 10, what="two replicas listed holding 'hot'")
    env = dict(os.environ, SURGE_ADDRESS=surge_instance.control_address)
    text = subprocess.run([sys.executable, "-m", "surge.cli.main", "status", "-n", "spread",
                           "--table"],
                          capture_output=True, text=True, env=env, timeout=60).stdout
    assert "models" in text and "hot" in text and "m1" in text, text
    serve.delete("spread")
