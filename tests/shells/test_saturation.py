"""A saturated node on the real controller, FakeBackend and FakeClock: replicas added did
not raise throughput, the node's CPU is busy, so the autoscaler holds (NODE_SATURATED)
and says so in status, metrics, the dashboard's data and the log; /proc/stat parsing.

The node's CPU reading is a plain callable the test sets (the process reads
/proc/stat: controller/node_cpu.py); the controller reads it once a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from pathlib import Path

import pytest

from surge.config import AppSpec, AutoscalingConfig, DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller.controller import Controller
from surge.controller.metrics import render
from surge.controller.node_cpu import ProcStatCpu, busy_share, parse_cpu_line
from surge.model import DeploymentId, LoadReport
from surge.policy.autoscaling import DecisionKind
from surge.testing import FakeBackend, FakeClock, FakePeer

DID = DeploymentId("app", "Model")
TICK_S = 0.1
# Per 0.1 s tick: 100 offered, 50 completed (1,000/s offered, 500/s served), 6 in flight;
# then as much, with a queue that asks for more replicas than run.
BUSY = LoadReport(DID, 100, 50, 0, 0, 6)
QUEUED = LoadReport(DID, 100, 50, 0, 40, 6)


class Node:
    """The node's CPU busy share, as the test sets it."""

    def __init__(self, busy: float | None) -> None:
        self.busy = busy

    def __call__(self) -> float | None:
        return self.busy


class Harness:
    def __init__(self, node: Node, backend: FakeBackend | None = None) -> None:
        self.clock = FakeClock(monotonic=1000.0)
        self.backend = backend or FakeBackend()
        ids = itertools.count(1)
        self.controller = Controller("127.0.0.1:52800", HTTPOptions(proxy_workers=1),
                                     self.backend, clock=self.clock, node_cpu=node,
                                     new_replica_id=lambda name: f"{name}-{next(ids)}")
        self.api = self.controller.api
        self.state = self.controller.state

    async def deploy(self) -> FakePeer:
        scaling = AutoscalingConfig(min_replicas=1, max_replicas=40, upscale_delay_s=0.0,
                                    target_ongoing_requests=2)
        spec = DeploymentSpec(config=DeploymentConfig(name="Model", autoscaling_config=scaling),
                              target_blob=b"v1", init_blob=b"()")
        await self.api.rpc_deploy(FakePeer("driver"), app=AppSpec(
            name="app", route_prefix="/", ingress="Model", deployments=(spec,)))
        proxy = FakePeer("proxy", proxy_id="proxy-0")
        await self.api.rpc_hello(proxy, role="proxy", pid=1)
        await self.api.rpc_watch(proxy, deployment=DID)
        await self.tick()
        return proxy

    async def tick(self, load: LoadReport | None = None, peer: FakePeer | None = None) -> None:
        if load is not None and peer is not None:
            self.controller.on_push(peer, "load", [load])
        self.clock.advance(TICK_S)
        self.controller.tick()
        await self.controller.settle()

    async def ready(self, replica_id: str) -> None:
        peer = FakePeer("replica", replica_id=replica_id)
        pid = self.backend.processes[replica_id].pid
        assert await self.api.rpc_replica_started(peer, replica_id=replica_id,
                                                  address=f"unix:/s/{replica_id}.sock", pid=pid)
        await asyncio.sleep(0)

    @property
    def target(self) -> int:
        return self.state.deployments[DID].target


async def saturate(h: Harness, proxy: FakePeer) -> int:
    """One replica serves 500 req/s of 1,000; the policy adds replicas; a second after
    they run they serve the same 500 req/s; then a queue asks for more. Returns how
    many replicas ran."""
    await h.ready("Model-1")
    for _ in range(10):  # a second of load on one replica: the policy adds some
        await h.tick(BUSY, proxy)
    running = h.backend.started()
    assert len(running) > 1
    for replica_id in running[1:]:
        await h.ready(replica_id)
    for _ in range(11):  # they served a whole second: the same 500 req/s
        await h.tick(BUSY, proxy)
    assert h.target == len(running)
    for _ in range(5):
        await h.tick(QUEUED, proxy)
    return len(running)


def test_a_saturated_node_holds_the_target_and_says_so_everywhere(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        node = Node(0.97)
        h = Harness(node)
        proxy = await h.deploy()
        caplog.set_level(logging.INFO, logger="surge.autoscaler")
        n = await saturate(h, proxy)
        for _ in range(20):  # two more seconds of the same: still no more replicas
            await h.tick(QUEUED, proxy)
        assert h.target == n
        assert len(h.backend.started()) == n
        assert h.controller.autoscaler.last[DID].kind is DecisionKind.NODE_SATURATED
        held = [d for d in h.controller.autoscaler.decisions
                if d.kind is DecisionKind.NODE_SATURATED]
        assert len(held) == 1  # once per episode, not every tick
        assert (held[0].previous, held[0].target) == (n, n)
        assert held[0].reason.startswith(
            f"hold: node CPU 97% busy: 1 -> {n} replicas served 500 -> 500 req/s of 1000 "
            "offered; not adding replicas on this node (the policy asked for ")
        assert held[0].signals["node_cpu"] == 0.97
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "saturated" in warnings[0].getMessage()
        # status (serve.status(), surge status), the dashboard's data, /metrics
        status = await h.api.rpc_status(FakePeer("driver"))
        deployment = status.applications["app"].deployments["Model"]
        assert deployment.message.startswith("node CPU saturated, not adding replicas: node "
                                             "CPU 97% busy")
        assert deployment.rates["node_cpu"] == 0.97
        page = h.controller.observer.status()["applications"]["app"]["deployments"]["Model"]
        assert page["node_cpu_pct"] == 97.0 and page["node_saturated"]
        point = h.controller.observer.sample()
        assert point["node_cpu_pct"] == 97.0 and point["deployments"]["app#Model"]["saturated"]
        assert h.controller.observer.decision_log[-1]["kind"] == "node_saturated"
        text = render(h.controller.observer.snapshot()).decode()
        assert 'surge_node_saturated{application="app",deployment="Model"} 1.0' in text
        assert "surge_node_cpu_busy_ratio 0.97" in text
        assert 'reason="node_saturated"} 1.0' in text
        # The node cools: the episode ends (logged once) and replicas are added again.
        node.busy = 0.5
        for _ in range(10):
            await h.tick(QUEUED, proxy)
        assert h.target > n
        assert not h.state.deployments[DID].node_saturated
        assert "saturated" not in (await h.api.rpc_status(FakePeer("d"))).applications[
            "app"].deployments["Model"].message
        assert [r.getMessage() for r in caplog.records if "no longer" in r.getMessage()] == [
            "autoscaling app#Model: the node's CPU is no longer saturated"]

    asyncio.run(main())


@pytest.mark.parametrize("busy", [0.5, None])
def test_replicas_are_added_when_the_node_has_room_or_is_not_read(busy: float | None) -> None:
    async def main() -> None:
        h = Harness(Node(busy))
        proxy = await h.deploy()
        n = await saturate(h, proxy)
        assert h.target > n
        assert not any(d.kind is DecisionKind.NODE_SATURATED
                       for d in h.controller.autoscaler.decisions)

    asyncio.run(main())


def test_a_deployment_with_a_replica_on_another_node_gets_no_verdict() -> None:
    async def main() -> None:
        h = Harness(Node(0.97))
        proxy = await h.deploy()
        h.backend.place("Model-1", "node-2", "10.0.0.2")
        n = await saturate(h, proxy)
        assert h.state.deployments[DID].node_cpu is None
        assert h.state.node_cpu == 0.97  # the head's, still shown on its own
        assert h.target > n

    asyncio.run(main())


# -- /proc/stat -------------------------------------------------------------------------------


def test_the_aggregate_line_gives_total_and_idle_ticks() -> None:
    text = "cpu  100 5 50 800 20 3 2 10 7 0\ncpu0 50 2 25 400 10 1 1 5 3 0\n"
    assert parse_cpu_line(text) == (990, 820)  # guest (7) is inside user already
    assert parse_cpu_line("cpu0 1 2 3 4 5 6 7 8\n") is None
    assert parse_cpu_line("cpu 1 2 3\n") is None
    assert parse_cpu_line("cpu 1 2 3 x 5 6 7 8\n") is None
    assert busy_share((990, 820), (1990, 1070)) == 0.75
    assert busy_share((990, 820), (990, 820)) is None


def test_proc_stat_cpu_reads_the_share_since_its_last_call(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    cpu = ProcStatCpu(str(stat))
    assert cpu() is None  # no file
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    assert cpu() is None  # first reading: nothing to compare with
    stat.write_text("cpu  400 0 200 1100 100 0 0 0 0 0\n")
    assert cpu() == 0.5  # 400 of 800 ticks busy
    assert "ProcStatCpu" in repr(cpu)
    assert ProcStatCpu()() is None  # the real /proc/stat: a first reading is None


def test_a_hold_is_no_longer_shown_once_autoscaling_is_removed() -> None:
    async def main() -> None:
        h = Harness(Node(0.97))
        proxy = await h.deploy()
        await saturate(h, proxy)
        assert h.state.deployments[DID].node_saturated
        record = h.state.deployments[DID]
        record.spec = dataclasses.replace(record.spec, config=dataclasses.replace(
            record.config, autoscaling_config=None, num_replicas=record.target))
        await h.tick(QUEUED, proxy)
        assert not record.node_saturated
        assert DID not in h.controller.autoscaler.saturation
        message = (await h.api.rpc_status(FakePeer("d"))).applications["app"].deployments[
            "Model"].message
        assert "saturated" not in message

    asyncio.run(main())
