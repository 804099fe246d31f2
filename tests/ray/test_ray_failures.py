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
from tests.eventually import eventually
from tests.ray.apps import Slow, Where
from tests.ray.cluster import RayCluster, Running, surge_on

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

    def served(self, url: str, since: float = float("-inf")) -> int:
        """200s from `url` answered after `since` (a time.monotonic())."""
        return sum(1 for _, code, _, at in self.of(url) if code == 200 and at > since)


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
        eventually(lambda: doomed_proxy in serve.status().proxy_addresses, 30,
                   interval_s=0.1, what="a proxy on the doomed node")
        spare = cluster.cluster.add_node(num_cpus=1, resources={"doomed": 1})
        cluster.cluster.wait_for_nodes()
        load = Load([slow, where], clients=3)
        with load.running():
            # under load: every client has been answered a few times on both apps
            eventually(lambda: load.served(slow) >= 6 and load.served(where) >= 6, 30,
                       interval_s=0.1, what="the load served on both apps")
            removed_at = time.monotonic()
            cluster.cluster.remove_node(doomed, allow_graceful=False)

            def replaced() -> bool:
                return any(code == 200 and spare.node_id in text and at > removed_at
                           for _, code, text, at in load.of(slow))

            eventually(replaced, 60, interval_s=0.1,
                       what="the replacement on the spare node serving")
            # and the load goes on being served after the replacement
            after = time.monotonic()
            eventually(lambda: load.served(slow, after) >= 3 and load.served(where, after) >= 3,
                       30, interval_s=0.1, what="the load served after the replacement")
        eventually(lambda: doomed_proxy not in serve.status().proxy_addresses, 30,
                   interval_s=0.1, what="the removed node's proxy leaving the proxy set")
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

    eventually(replaced, 60, interval_s=0.1, what="a replacement replica")
    for _ in range(10):
        assert httpx.get(f"{surge.url}/where", timeout=30).status_code == 200


def test_a_controller_restart_keeps_replicas_serving(surge: Running) -> None:
    serve.run(Where.bind(), name="where", route_prefix="/where")
    before = {str(r["replica_id"]): r["pid"] for r in replicas()}
    instance = current()
    assert instance is not None and instance.supervisor is not None
    controller = instance.supervisor.process.pid
    url = f"{surge.url}/where"
    load = Load([url], clients=2)
    with load.running():
        eventually(lambda: load.served(url) >= 4, 30, interval_s=0.1, what="the load served")
        os.kill(controller, signal.SIGKILL)
        eventually(lambda: instance.supervisor.process.pid != controller, 60, interval_s=0.1,
                   what="the supervisor restarting the controller")
        eventually(lambda: {str(r["replica_id"]): r["pid"] for r in replicas()} == before, 60,
                   interval_s=0.1, what="the replicas re-attached")
        after = time.monotonic()
        eventually(lambda: load.served(url, after) >= 4, 30, interval_s=0.1,
                   what="the load served after the re-attachment")
    assert load.results and all(code == 200 for _, code, _, _ in load.results), \
        [r for r in load.results if r[1] != 200][:3]
