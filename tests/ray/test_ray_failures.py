"""The ray backend when things die: a node under load, a replica's actor, the controller."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from surge import serve
from surge.api.instance import current
from tests.ray.apps import Slow, Where
from tests.ray.cluster import RayCluster, Running, surge_on, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def replicas() -> list[dict[str, object]]:
    instance = current()
    assert instance is not None
    result: list[dict[str, object]] = instance.call("replicas", timeout=10)
    return result


def parent(pid: object) -> int:
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rpartition(")")[2].split()[1])


@dataclass
class Load:
    """Closed-loop clients against some URLs until stopped; every outcome recorded."""

    urls: list[str]
    clients: int = 3
    results: list[tuple[str, int, str, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _client(self, url: str) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                try:
                    response = client.get(url)
                    self.results.append((url, response.status_code, response.text,
                                         time.monotonic()))
                except httpx.HTTPError as exc:
                    self.results.append((url, 0, repr(exc), time.monotonic()))

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        threads = [threading.Thread(target=self._client, args=(url,), daemon=True)
                   for url in self.urls for _ in range(self.clients)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=70)

    def of(self, url: str) -> list[tuple[str, int, str, float]]:
        return [r for r in self.results if r[0] == url]


@pytest.fixture
def surge(cluster: RayCluster) -> Iterator[Running]:
    with surge_on(cluster) as running:
        yield running


def test_removing_a_node_under_load_loses_only_its_in_flight_requests(
        cluster: RayCluster) -> None:
    doomed = cluster.cluster.add_node(num_cpus=1, resources={"doomed": 1})
    cluster.cluster.wait_for_nodes()
    with surge_on(cluster) as surge:
        serve.run(Slow.bind(), name="slow", route_prefix="/slow")
        serve.run(Where.bind(), name="where", route_prefix="/where")
        slow, where = f"{surge.url}/slow", f"{surge.url}/where"
        assert httpx.get(slow, timeout=30).json()["node"] == doomed.node_id
        doomed_proxy = f"proxy-node-{doomed.node_id}"
        wait_for(lambda: doomed_proxy in serve.status().proxy_addresses,
                 what="a proxy on the doomed node")
        spare = cluster.cluster.add_node(num_cpus=1, resources={"doomed": 1})
        cluster.cluster.wait_for_nodes()
        load = Load([slow, where], clients=3)
        with load.running():
            time.sleep(1.5)
            removed_at = time.monotonic()
            cluster.cluster.remove_node(doomed, allow_graceful=False)

            def replaced() -> bool:
                return any(code == 200 and spare.node_id in text and at > removed_at
                           for _, code, text, at in load.of(slow))

            wait_for(replaced, timeout=60, what="the replacement on the spare node serving")
            time.sleep(0.5)
        wait_for(lambda: doomed_proxy not in serve.status().proxy_addresses, timeout=30,
                 what="the removed node's proxy leaving the proxy set")
        serve.delete("slow")
        serve.delete("where")
    cluster.cluster.remove_node(spare)
    others = load.of(where)
    assert others and all(code == 200 for _, code, _, _ in others), \
        [r for r in others if r[1] != 200][:3]
    failed = [r for r in load.of(slow) if r[1] != 200]
    # Only what was in flight on the lost replica may fail (max_ongoing_requests=4, and
    # 3 clients): each with a 5xx that says so; queued requests wait for the replacement.
    assert len(failed) <= 3, failed
    for _, code, text, _ in failed:
        assert code >= 500 and "died" in text, (code, text)
    print(f"slow: {len(load.of(slow))} requests, {len(failed)} lost with the node; "
          f"where: {len(others)} requests, all served")


def test_a_replica_whose_actor_dies_is_replaced(surge: Running) -> None:
    serve.run(Where.bind(), name="where", route_prefix="/where")
    before = {str(r["replica_id"]): r["pid"] for r in replicas()}
    victim, pid = next(iter(before.items()))
    os.kill(parent(pid), signal.SIGKILL)  # the Ray actor hosting it (a worker process)

    def replaced() -> bool:
        now = {str(r["replica_id"]) for r in replicas() if r["state"] == "RUNNING"}
        return victim not in now and len(now) == 2

    wait_for(replaced, timeout=60, what="a replacement replica")
    for _ in range(10):
        assert httpx.get(f"{surge.url}/where", timeout=30).status_code == 200


def test_a_controller_restart_keeps_replicas_serving(surge: Running) -> None:
    serve.run(Where.bind(), name="where", route_prefix="/where")
    before = {str(r["replica_id"]): r["pid"] for r in replicas()}
    instance = current()
    assert instance is not None and instance.supervisor is not None
    controller = instance.supervisor.process.pid
    load = Load([f"{surge.url}/where"], clients=2)
    with load.running():
        time.sleep(0.5)
        os.kill(controller, signal.SIGKILL)
        wait_for(lambda: instance.supervisor.process.pid != controller, timeout=60,
                 what="the supervisor restarting the controller")

        def reattached() -> bool:
            try:
                return {str(r["replica_id"]): r["pid"] for r in replicas()} == before
            except Exception:
                return False

        wait_for(reattached, timeout=60, what="the replicas re-attached")
        time.sleep(0.5)
    assert load.results and all(code == 200 for _, code, _, _ in load.results), \
        [r for r in load.results if r[1] != 200][:3]
