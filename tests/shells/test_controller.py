"""The real controller on a FakeBackend and a FakeClock: exact actions, states and times.

Nothing here starts a process or opens a socket: members are FakePeers that call the
controller's RPCs as real proxies and replicas do, the backend records what it is
asked, and time moves only when a test moves it (one `tick` = the control loop's 0.1 s).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from surge.backends.base import Placement
from surge.config import (
    AppSpec,
    AutoscalingConfig,
    DeploymentConfig,
    DeploymentSpec,
    HTTPOptions,
)
from surge.controller.checkpoint import Checkpoint
from surge.controller.controller import Controller
from surge.controller.publish import UNAVAILABLE_FAILED
from surge.controller.recovery import RECOVERY_TIMEOUT_S
from surge.errors import ConfigError
from surge.model import (
    ApplicationStatus,
    DeploymentId,
    DeploymentStatus,
    LoadReport,
    ReplicaSet,
    RouteTable,
)
from surge.observability.recorder import TelemetryReport
from surge.policy.autoscaling import DecisionKind
from surge.testing import FakeBackend, FakeClock, FakePeer

DID = DeploymentId("app", "Model")
TICK_S = 0.1


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def turn() -> None:
    """One turn of the event loop: pushes gathered by the publisher go out."""
    await asyncio.sleep(0)


def app(*configs: DeploymentConfig, code: bytes = b"v1", name: str = "app",
        route_prefix: str = "/") -> AppSpec:
    specs = tuple(DeploymentSpec(config=c, target_blob=code, init_blob=b"()") for c in configs)
    return AppSpec(name=name, route_prefix=route_prefix, ingress=configs[0].name,
                   deployments=specs)


class Harness:
    """A controller, its fake backend and clock, and the members that talk to it."""

    def __init__(self, tmp_path: Path | None = None, *,
                 backend: FakeBackend | None = None, clock: FakeClock | None = None,
                 first_id: int = 1) -> None:
        self.clock = clock or FakeClock(monotonic=1000.0)
        self.backend = backend or FakeBackend()
        ids = itertools.count(first_id)
        self.controller = Controller(
            "127.0.0.1:52800", HTTPOptions(proxy_workers=1), self.backend,
            Checkpoint(str(tmp_path)) if tmp_path else None, clock=self.clock,
            new_replica_id=lambda name: f"{name}-{next(ids)}")
        self.api = self.controller.api
        self.state = self.controller.state
        self.peers: dict[str, FakePeer] = {}

    async def deploy(self, spec: AppSpec) -> None:
        await self.api.rpc_deploy(FakePeer("driver"), app=spec)

    async def tick(self, seconds: float = TICK_S) -> None:
        self.clock.advance(seconds)
        self.controller.tick()
        await self.controller.settle()

    async def ready(self, replica_id: str, own_health_check: bool = True) -> FakePeer:
        """The replica process built its object and listens: it says so."""
        peer = self.peers[replica_id] = FakePeer("replica", replica_id=replica_id)
        pid = self.backend.processes[replica_id].pid
        wanted = await self.api.rpc_replica_started(peer, replica_id=replica_id,
                                                    address=f"unix:/s/{replica_id}.sock", pid=pid,
                                                    own_health_check=own_health_check)
        assert wanted
        await turn()
        return peer

    async def watcher(self, did: DeploymentId = DID) -> FakePeer:
        """A router (a proxy's) that watches the deployment."""
        peer = FakePeer("proxy", proxy_id="proxy-0")
        await self.api.rpc_hello(peer, role="proxy", pid=1)
        await self.api.rpc_watch(peer, deployment=did)
        await turn()
        return peer

    def states(self) -> dict[str, str]:
        return {r.replica_id: r.state.value for r in self.state.replicas.values()}

    def status(self, name: str = "app") -> ApplicationStatus:
        return self.state.app_status(name).status


def routable(peer: FakePeer) -> list[list[str]]:
    """Each replica set pushed to `peer`: the ids it may route to."""
    return [[info.replica_id for info in s.replicas] for s in peer.pushed("replica_set")]


# -- deploy ----------------------------------------------------------------------------------


def test_deploy_starts_the_replicas_and_publishes_each_as_it_becomes_ready() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2,
                                            max_queued_requests=10)))
        proxy = await h.watcher()
        assert proxy.pushed("routes")[-1] == RouteTable(h.api.publisher.routes().targets)
        assert [t.app for t in proxy.pushed("routes")[-1].targets] == ["app"]
        assert h.status() is ApplicationStatus.DEPLOYING
        await h.tick()
        assert h.backend.calls == [("start_replica", "Model-1"), ("start_replica", "Model-2")]
        assert h.states() == {"Model-1": "STARTING", "Model-2": "STARTING"}
        await h.ready("Model-1")
        assert h.status() is ApplicationStatus.DEPLOYING
        await h.ready("Model-2")
        assert h.status() is ApplicationStatus.RUNNING
        assert routable(proxy) == [[], ["Model-1"], ["Model-1", "Model-2"]]
        last: ReplicaSet = proxy.pushed("replica_set")[-1]
        assert (last.max_ongoing_requests, last.queue_limit, last.unavailable) == (5, 10, "")
        await h.tick()  # nothing to do: no start, no push
        assert len(h.backend.calls) == 2 and len(proxy.pushed("replica_set")) == 3
        overview = await h.api.rpc_wait_app(FakePeer(), name="app", timeout_s=0)
        assert overview is not None and overview.status is ApplicationStatus.RUNNING

    run(main)


def test_a_replica_that_fails_its_constructor_three_times_fails_the_deploy() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model")))
        proxy = await h.watcher()
        for attempt in (1, 2, 3):
            await h.tick(TICK_S if attempt == 1 else 1.5)  # past the backoff (0.5 s, 1 s)
            replica_id = f"Model-{attempt}"
            assert h.backend.started() == [f"Model-{i}" for i in range(1, attempt + 1)]
            await h.api.rpc_replica_started(FakePeer(), replica_id=replica_id,
                                            error=f"RuntimeError: attempt {attempt}")
            assert h.states()[replica_id] == "FAILED"
            h.backend.exit(replica_id, 1)
        await h.tick()  # the third exit is seen; no fourth start
        await h.tick()
        assert h.backend.started() == ["Model-1", "Model-2", "Model-3"]
        overview = h.state.app_status("app")
        assert overview.status is ApplicationStatus.DEPLOY_FAILED
        assert "deployment 'Model' failed to start:\nRuntimeError: attempt 3" in overview.message
        assert proxy.pushed("replica_set")[-1].unavailable == UNAVAILABLE_FAILED
        # Status is computed, not kept: asking again changes nothing.
        assert h.state.app_status("app") == overview

    run(main)


def test_a_failure_after_running_is_unhealthy_whoever_asked_before() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model")))
        await h.tick()
        await h.ready("Model-1")  # RUNNING now; nobody asks for the status
        h.backend.exit("Model-1", -9)
        for attempt in (2, 3, 4):
            await h.tick(1.5)  # past the backoff after the last failed start
            assert h.states()[f"Model-{attempt}"] == "STARTING"
            await h.api.rpc_replica_started(FakePeer(), replica_id=f"Model-{attempt}",
                                            error="boom")
            h.backend.exit(f"Model-{attempt}", 1)
        await h.tick()
        assert h.status() is ApplicationStatus.UNHEALTHY

    run(main)


def test_a_replica_that_exits_before_it_reaches_the_controller_is_no_failed_start() -> None:
    """One that never asked for its spec (it could not get in, as in a herd) is replaced
    at once, neither counted against the deploy nor backed off; one that did is."""
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", max_constructor_retry_count=1)))
        await h.tick()
        h.backend.exit("Model-1", 1)
        await h.tick()
        assert h.backend.started() == ["Model-1", "Model-2"]
        assert h.state.deployments[DID].constructor_failures == 0
        await h.api.rpc_replica_spec(FakePeer(), replica_id="Model-2")
        h.backend.exit("Model-2", 1)
        await h.tick()
        await h.tick(1.0)
        assert h.backend.started() == ["Model-1", "Model-2"]
        assert h.status() is ApplicationStatus.DEPLOY_FAILED

    run(main)


def test_a_deployment_retrying_its_start_shows_the_last_error() -> None:
    # As Ray's `serve status` while it retries: UPDATING, with the constructor's error.
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model")))
        await h.tick()
        await h.api.rpc_replica_started(FakePeer(), replica_id="Model-1",
                                        error="ZeroDivisionError: division by zero")
        h.backend.exit("Model-1", 1)
        await h.tick()
        overview = h.state.app_status("app")
        assert overview.status is ApplicationStatus.DEPLOYING
        deployment = overview.deployments["Model"]
        assert deployment.status is DeploymentStatus.UPDATING
        assert deployment.message == (
            "0 of 1 replicas running; a replica failed to start 1 time(s) in a row (its "
            "constructor or first health check), retrying. Error:\n"
            "ZeroDivisionError: division by zero")

    run(main)


def test_a_failed_start_backs_off_before_the_next() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", max_constructor_retry_count=10)))
        await h.tick()
        for attempt, backoff in ((1, 0.5), (2, 1.0), (3, 2.0)):
            await h.api.rpc_replica_started(FakePeer(), replica_id=f"Model-{attempt}",
                                            error="boom")
            h.backend.exit(f"Model-{attempt}", 1)
            await h.tick(backoff - 0.2)
            assert len(h.backend.started()) == attempt  # still backing off
            await h.tick(0.3)
            assert len(h.backend.started()) == attempt + 1

    run(main)


def test_an_update_whose_replicas_never_start_fails_and_the_old_version_serves() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", max_constructor_retry_count=2)))
        await h.tick()
        await h.ready("Model-1")
        assert h.status() is ApplicationStatus.RUNNING
        await h.deploy(app(DeploymentConfig(name="Model", max_constructor_retry_count=2),
                           code=b"version 2"))
        for attempt in (2, 3):
            await h.tick(1.5)
            assert h.states()[f"Model-{attempt}"] == "STARTING"
            await h.api.rpc_replica_started(FakePeer(), replica_id=f"Model-{attempt}",
                                            error="ImportError: v2 is broken")
            h.backend.exit(f"Model-{attempt}", 1)
        for _ in range(3):
            await h.tick(5.0)
        assert len(h.backend.started()) == 3  # the update stopped: no more starts
        assert h.states()["Model-1"] == "RUNNING"  # the old version serves on
        overview = h.state.app_status("app")
        assert overview.status is ApplicationStatus.DEPLOY_FAILED
        assert "ImportError: v2 is broken" in overview.message
        deployment = overview.deployments["Model"]
        assert deployment.status.value == "DEPLOY_FAILED"

    run(main)


# -- health checks ---------------------------------------------------------------------------


def test_three_failed_health_checks_replace_the_replica_on_the_period() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", health_check_period_s=1.0,
                                            health_check_timeout_s=0.5)))
        proxy = await h.watcher()
        await h.tick()
        ready_at = h.clock.monotonic()
        replica = await h.ready("Model-1")
        replica.answers["check_health"] = TimeoutError()
        checks = []
        while h.states().get("Model-1") == "RUNNING":
            await h.tick()
            if len(replica.called("check_health")) > len(checks):
                checks.append(round(h.clock.monotonic() - ready_at, 3))
        assert checks == [1.0, 2.0, 3.0]  # one per period, from the moment it was ready
        assert round(h.clock.monotonic() - ready_at, 3) == 3.0  # failed by the third
        assert h.states()["Model-1"] == "FAILED"
        assert ("kill", "Model-1") in h.backend.calls
        assert routable(proxy)[-1] == []
        h.backend.exit("Model-1", -9)
        await h.tick()
        assert h.backend.started() == ["Model-1", "Model-2"]

    run(main)


def test_a_failed_health_check_is_unhealthy_until_a_replacement_runs() -> None:
    """As Ray's test_deploy_2 test_deploy_application_unhealthy: a running replica that
    fails its health checks makes the application UNHEALTHY, and it stays so while its
    replacements fail to start (their first health check fails: replica/main.py)."""
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", health_check_period_s=1.0)))
        await h.tick()
        replica = await h.ready("Model-1")
        assert h.status() is ApplicationStatus.RUNNING
        replica.answers["check_health"] = RuntimeError("Intentionally failing.")
        while h.states()["Model-1"] == "RUNNING":
            await h.tick()
        overview = h.state.app_status("app")
        assert overview.status is ApplicationStatus.UNHEALTHY
        assert overview.message == "The deployments ['Model'] are UNHEALTHY."
        assert overview.deployments["Model"].message.startswith(
            "A replica's health check failed.")
        h.backend.exit("Model-1", -9)
        await h.tick()
        await h.api.rpc_replica_started(FakePeer(), replica_id="Model-2",
                                        error="RuntimeError: Intentionally failing.")
        h.backend.exit("Model-2", 1)
        await h.tick(1.0)  # past the backoff after the failed start
        assert h.status() is ApplicationStatus.UNHEALTHY
        assert h.states()["Model-3"] == "STARTING"
        await h.ready("Model-3")
        assert h.status() is ApplicationStatus.RUNNING

    run(main)


@pytest.mark.parametrize("own_health_check", [False, True])
def test_telemetry_stands_for_the_default_health_check_only(own_health_check: bool) -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", health_check_period_s=2.0)))
        await h.tick()
        replica = await h.ready("Model-1", own_health_check=own_health_check)
        report = TelemetryReport("replica", "Model-1", "app", "Model")
        for step in range(95):  # 9.5 s, a report every 1.5 s: checks due at 2, 4, 6, 8 s
            if step % 15 == 0:
                h.controller.on_push(replica, "telemetry", report)
            await h.tick()
        # A class with its own check_health is called each period whatever it reports;
        # without one, its fresh telemetry proves what the call would.
        assert len(replica.called("check_health")) == (4 if own_health_check else 0)
        called = len(replica.called("check_health"))
        for _ in range(50):  # silent from 9 s: checks at 10 (heard 1 s ago), 12 and 14 s
            await h.tick()
        assert len(replica.called("check_health")) - called == (3 if own_health_check else 2)
        assert h.states()["Model-1"] == "RUNNING"

    run(main)


def test_a_replica_that_stops_reporting_fails_its_calls_as_before() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", health_check_period_s=1.0,
                                            health_check_timeout_s=0.5)))
        await h.tick()
        replica = await h.ready("Model-1", own_health_check=False)
        await h.tick()
        h.controller.on_push(replica, "telemetry", TelemetryReport("replica", "Model-1"))
        replica.answers["check_health"] = TimeoutError()  # its loop hangs from now on
        ticks = 1
        while h.states()["Model-1"] == "RUNNING":
            await h.tick()
            ticks += 1
        # The first check (1 s after ready) passes on the report heard 0.9 s before;
        # the three after it are calls that time out.
        assert len(replica.called("check_health")) == 3
        assert round(ticks * TICK_S, 3) == 4.0
        assert h.states()["Model-1"] == "FAILED"

    run(main)


def test_many_members_are_told_to_send_telemetry_less_often() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model")))
        await h.tick()
        building = FakePeer("replica", replica_id="Model-1")  # said hello, not ready yet
        await h.api.rpc_hello(building, role="replica", pid=2, replica_id="Model-1")
        proxies = [FakePeer("proxy", proxy_id=f"proxy-{i}") for i in range(1000)]
        for peer in proxies:
            await h.api.rpc_hello(peer, role="proxy", pid=1)
        await h.tick(1.0)  # reviewed once a second: 1,001 members, every 2 s
        assert building.pushed("telemetry_interval") == [2.0]
        assert all(p.pushed("telemetry_interval") == [2.0] for p in proxies)
        late = FakePeer("proxy", proxy_id="proxy-late")
        await h.api.rpc_hello(late, role="proxy", pid=1)
        assert late.pushed("telemetry_interval") == [2.0]  # told at once
        for peer in proxies[:500]:
            h.controller.on_disconnect(peer)
        await h.tick(1.0)
        assert late.pushed("telemetry_interval") == [2.0, 1.0]
        assert building.pushed("telemetry_interval") == [2.0, 1.0]

    run(main)


def test_only_the_replicas_own_connection_proves_it_alive() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model")))
        await h.tick()
        replica = await h.ready("Model-1", own_health_check=False)
        record = h.state.replicas["Model-1"]
        h.controller.on_push(FakePeer("proxy"), "telemetry",
                             TelemetryReport("replica", "Model-1"))  # not its connection
        assert record.heard_at == -math.inf
        h.controller.on_push(replica, "telemetry", TelemetryReport("replica", "Model-1"))
        assert record.heard_at == h.clock.monotonic()

    run(main)


def test_a_replicas_spec_carries_its_deployments_objectives() -> None:
    """What an LLM replica sheds against is what its controller sizes for: the
    deployment's own `autoscaling_config.objectives`, wherever they were set."""
    async def main() -> None:
        h = Harness()
        scaling = AutoscalingConfig(min_replicas=1, max_replicas=2,
                                    objectives={"ttft_ms": 500, "shed": True})
        await h.deploy(app(DeploymentConfig(name="Model", autoscaling_config=scaling)))
        await h.tick()
        spec = await h.api.rpc_replica_spec(FakePeer(), replica_id="Model-1")
        assert spec.objectives == {"ttft_ms": 500, "shed": True}
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=1)))
        await h.tick()
        replica = next(iter(h.state.replicas))
        assert (await h.api.rpc_replica_spec(FakePeer(), replica_id=replica)).objectives \
            is None

    run(main)


# -- autoscaling -----------------------------------------------------------------------------


def test_load_scales_up_at_once_and_down_after_the_delay_on_virtual_time() -> None:
    async def main() -> None:
        h = Harness()
        scaling = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=0.0,
                                    downscale_delay_s=2.0, target_ongoing_requests=2)
        await h.deploy(app(DeploymentConfig(name="Model", autoscaling_config=scaling)))
        proxy = await h.watcher()
        await h.tick()
        await h.ready("Model-1")
        h.controller.on_push(proxy, "load", [LoadReport(DID, 30, 0, 0, 0, 6)])
        await h.tick()  # 6 in flight / 2 per replica: 3 replicas, at once
        up_at = h.clock.monotonic()
        assert h.state.deployments[DID].target == 3
        assert h.backend.started() == ["Model-1", "Model-2", "Model-3"]
        for replica_id in ("Model-2", "Model-3"):
            await h.ready(replica_id)
        h.controller.on_push(proxy, "load", [LoadReport(DID, 0, 30, 0, 0, 0)])
        decisions = h.controller.autoscaler.decisions
        while h.state.deployments[DID].target == 3:
            await h.tick()
        assert [(d.at - up_at, d.previous, d.target, d.kind) for d in decisions] == [
            (0.0, 1, 3, DecisionKind.UP),
            (pytest.approx(2.1), 3, 2, DecisionKind.DOWN)]  # 2 s below the band from t+0.1
        # Scale-down drains the newest running replica (of two started together, the
        # first) through its control connection.
        assert h.states() == {"Model-1": "RUNNING", "Model-2": "DRAINING",
                              "Model-3": "RUNNING"}
        assert h.peers["Model-2"].called("drain") == [{"timeout_s": 20.0}]
        assert routable(proxy)[-1] == ["Model-1", "Model-3"]

    run(main)


def test_the_engines_waiting_sequences_scale_up_what_the_routers_load_does_not() -> None:
    async def main() -> None:
        from surge.policy.engine_load import EngineReport

        h = Harness()
        scaling = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=0.0,
                                    target_ongoing_requests=16)
        await h.deploy(app(DeploymentConfig(name="Model", autoscaling_config=scaling)))
        proxy = await h.watcher()
        await h.tick()
        replica = await h.ready("Model-1")
        h.controller.on_push(proxy, "load", [LoadReport(DID, 1, 1, 0, 0, 12)])
        await h.tick()  # 12 in flight of a target of 16: one replica is enough
        assert h.state.deployments[DID].target == 1
        # ... but the engine runs 6 of them (KV cache full) and 6 wait: two replicas
        h.controller.on_push(replica, "engine_load", EngineReport("Model-1", 6, 6, 1.0, 0.25))
        await h.tick()
        assert h.state.deployments[DID].target == 2
        decision = h.controller.autoscaler.last[DID]
        assert decision.signals["engine_demand"] == pytest.approx(2.0)
        # A report of a replica the controller does not know is dropped; once the last
        # report is two periods old it no longer counts.
        h.controller.on_push(replica, "engine_load", EngineReport("Gone-9", 99, 1, 1.0, 0.25))
        await h.tick(0.5)
        assert h.controller.engines.load(DID, h.clock.monotonic()) is None

    run(main)


def test_a_schedule_floor_raises_the_target_at_its_start_to_the_tick() -> None:
    async def main() -> None:
        clock = FakeClock(monotonic=1000.0)
        clock.set_time_of_day(9, 59, 59.75)
        h = Harness(clock=clock)
        scaling = AutoscalingConfig(min_replicas=1, max_replicas=10, downscale_delay_s=1.0,
                                    schedule=({"start": "10:00", "end": "10:01",
                                               "min_replicas": 3},))
        await h.deploy(app(DeploymentConfig(name="Model", autoscaling_config=scaling)))
        targets = []
        for _ in range(4):
            await h.tick()
            targets.append((round(clock.second_of_day() - 36000, 2),
                            h.state.deployments[DID].target))
        assert targets == [(-0.15, 1), (-0.05, 1), (0.05, 3), (0.15, 3)]
        assert h.backend.started() == ["Model-1", "Model-2", "Model-3"]
        decision = h.controller.autoscaler.decisions[-1]
        assert (decision.at, decision.previous, decision.target) == (pytest.approx(1000.3), 1,
                                                                     3)
        for replica_id in h.backend.started():
            await h.ready(replica_id)
        clock.advance(60.0 - 0.15 - TICK_S)  # to 10:01:00.0, the window's end
        await h.tick()  # the floor is gone; no load: down after downscale_delay_s
        while h.state.deployments[DID].target == 3:
            await h.tick()
        assert round(clock.second_of_day() - 36060, 2) == 1.1  # 10:01 + 0.1 + 1 s delay

    run(main)


def test_the_controller_and_the_simulator_take_the_same_decision() -> None:
    """Both run policy.autoscale_step: the same load, replicas, target and time of day
    give the same decision through the controller's loop and the simulator's."""
    from surge.policy.autoscaling import LoadSample
    from surge.sim.engine import Simulation
    from surge.sim.scenario import Scenario

    scaling = {"min_replicas": 1, "max_replicas": 20, "upscale_delay_s": 0.0}
    ramp = [LoadSample(t=9.0 + i / 10, arrivals=10.0 * i, completions=9.0 * i, rejections=0,
                       queued=float(i), ongoing=2.0 * i) for i in range(1, 11)]
    sim = Simulation(Scenario.from_mapping({
        "name": "same", "cluster": {"nodes": 1, "replicas_per_node": 20, "startup_s": 1},
        "service": {"service_time_ms": 20}, "traffic": {"schedule": [{"rps": 1, "for_s": 1}]},
        "deployment": {"name": "Model",
                       "autoscaling_config": {**scaling, "initial_replicas": 2}},
        "control": {"report_interval_s": 0, "urgent_decisions": False, "clock_offset_s": 0}}))
    sim.cluster.warm(0.0, 2, 0)
    sim.samples.extend(ramp)
    sim._decide(10.0, None)

    async def controller_decision() -> Any:
        clock = FakeClock(monotonic=10.0)
        clock.set_time_of_day(0, 0, 10.0)  # the simulator's day starts at midnight
        h = Harness(clock=clock)
        config = DeploymentConfig(name="Model", autoscaling_config=AutoscalingConfig(
            **scaling, initial_replicas=2))
        await h.deploy(app(config))
        await h.tick(0.0)
        for replica_id in h.backend.started():
            await h.ready(replica_id)
        record = h.state.deployments[DID]
        record.startup_lead_s = sim.cluster.startup_lead_s
        series = h.controller.load.series[DID]
        series.clear()  # the tick's empty bucket: the ramp is all it has seen
        series.extend(ramp)
        h.controller.decide_now(DID)  # an urgent decision: exactly these samples
        return h.controller.autoscaler.last[DID]

    decision = asyncio.run(controller_decision())
    assert sim.decisions and sim.target == decision.target > 2
    assert (sim.decisions[-1].target, sim.decisions[-1].reason) == (decision.target,
                                                                    decision.reason)


def test_the_controller_and_the_simulator_size_for_the_same_llm_objectives() -> None:
    """Latency objectives go through the one step too: the same engine reports (summed by
    the controller's EngineTracker, handed whole to the simulator) and the same load give
    the same prefill-bound decision through both callers."""
    from surge.policy.autoscaling import DecisionKind, LoadSample
    from surge.policy.engine_load import EngineReport, fresh_load
    from surge.sim.engine import Simulation
    from surge.sim.scenario import Scenario

    scaling = {"min_replicas": 1, "max_replicas": 20, "upscale_delay_s": 30.0,
               "target_ongoing_requests": 256, "objectives": {"ttft_ms": 500, "tpot_ms": 50}}
    flat = [LoadSample(t=9.0 + i / 10, arrivals=2.0, completions=2.0, rejections=0,
                       queued=0.0, ongoing=10.0) for i in range(1, 11)]
    reports = [EngineReport(f"Model-{i}", 0, 20, 0.3, 0.25, prefill_backlog_tokens=30_000,
                            prefill_tokens_per_s=20_000, prompt_tokens=2_000,
                            decode_step_s=0.01, decode_s_per_seq=0.0002) for i in (1, 2)]
    engines = fresh_load(reports, 0.0)
    sim = Simulation(Scenario.from_mapping({
        "name": "same", "cluster": {"nodes": 1, "replicas_per_node": 20, "startup_s": 1},
        "service": {"service_time_ms": 20}, "traffic": {"schedule": [{"rps": 1, "for_s": 1}]},
        "deployment": {"name": "Model",
                       "autoscaling_config": {**scaling, "initial_replicas": 2}},
        "control": {"report_interval_s": 0, "urgent_decisions": False, "clock_offset_s": 0}}),
        engine_load=lambda now: engines)
    sim.cluster.warm(0.0, 2, 0)
    sim.samples.extend(flat)
    sim._decide(10.0, None)

    async def controller_decision() -> Any:
        clock = FakeClock(monotonic=10.0)
        clock.set_time_of_day(0, 0, 10.0)
        h = Harness(clock=clock)
        config = DeploymentConfig(name="Model", autoscaling_config=AutoscalingConfig(
            **scaling, initial_replicas=2))
        await h.deploy(app(config))
        await h.tick(0.0)
        peers = {replica_id: await h.ready(replica_id) for replica_id in h.backend.started()}
        for report in reports:
            h.controller.on_push(peers[report.replica_id], "engine_load", report)
        record = h.state.deployments[DID]
        record.startup_lead_s = sim.cluster.startup_lead_s
        series = h.controller.load.series[DID]
        series.clear()
        series.extend(flat)
        h.controller.decide_now(DID)
        return h.controller.autoscaler.last[DID]

    decision = asyncio.run(controller_decision())
    # 60,000 prompt tokens waiting, drained at 20,000 tokens/s a replica within 0.5 s: 6
    assert decision.kind is DecisionKind.UP_PREFILL and decision.target == 6
    assert (sim.decisions[-1].target, sim.decisions[-1].kind, sim.decisions[-1].reason) == (
        decision.target, decision.kind.value, decision.reason)


def test_an_urgent_decision_only_scales_up_the_tick_decides_the_rest() -> None:
    """Between ticks (`decide_now`: a router's queue started to grow, or an LLM router's
    arrivals jumped) only a scale-up is decided: on a load that wants fewer replicas the
    target and the policy's state stay as they were; the next tick starts the wait
    before the scale-down."""
    from surge.policy.autoscaling import DecisionKind, LoadSample

    async def main() -> None:
        h = Harness(clock=FakeClock(monotonic=10.0))
        config = DeploymentConfig(name="Model", autoscaling_config=AutoscalingConfig(
            min_replicas=1, max_replicas=20, initial_replicas=4, downscale_delay_s=60.0))
        await h.deploy(app(config))
        await h.tick(0.0)
        for replica_id in h.backend.started():
            await h.ready(replica_id)
        quiet = [LoadSample(t=9.0 + i / 10, arrivals=1.0, completions=1.0, rejections=0,
                            queued=0.0, ongoing=0.1) for i in range(1, 11)]
        series = h.controller.load.series[DID]
        series.clear()
        series.extend(quiet)
        before = h.controller.autoscaler.states[DID]  # the deploy's tick: waiting to go down
        assert before.down_since == 10.0
        h.controller.clock.advance(0.05)
        h.controller.decide_now(DID)
        last = h.controller.autoscaler.last[DID]
        assert (last.kind, last.target) == (DecisionKind.HOLD, 4)
        assert last.reason.startswith("hold (between ticks only a scale-up is decided)")
        assert h.controller.autoscaler.states[DID] is before  # its demand not kept either
        await h.tick()
        after = h.controller.autoscaler.states[DID]
        assert h.state.deployments[DID].target == 4 and after is not before
        assert after.down_since == 10.0 and after.down_peak == pytest.approx(
            h.controller.autoscaler.last[DID].signals["demand_replicas"])

    run(main)


# -- rolling update and delete ---------------------------------------------------------------


def test_a_new_version_rolls_replica_by_replica_without_losing_capacity() -> None:
    async def main() -> None:
        h = Harness()
        config = DeploymentConfig(name="Model", num_replicas=2)
        await h.deploy(app(config, code=b"v1"))
        proxy = await h.watcher()
        await h.tick()
        for replica_id in ("Model-1", "Model-2"):
            await h.ready(replica_id)
        await h.deploy(app(config, code=b"v2"))
        assert h.state.deployments[DID].version == 2
        await h.tick()
        assert h.backend.started()[2:] == ["Model-3", "Model-4"]
        assert h.status() is ApplicationStatus.DEPLOYING
        await h.ready("Model-3")
        await h.tick()  # one new one serves: the oldest old one drains
        assert h.states() == {"Model-1": "DRAINING", "Model-2": "RUNNING",
                              "Model-3": "RUNNING", "Model-4": "STARTING"}
        await h.ready("Model-4")
        await h.tick()
        assert h.states()["Model-2"] == "DRAINING"
        for replica_id in ("Model-1", "Model-2"):
            h.backend.exit(replica_id)
        await h.tick()
        assert h.status() is ApplicationStatus.RUNNING
        assert [len(ids) >= 2 for ids in routable(proxy)[2:]] == [True] * len(
            routable(proxy)[2:])  # from the first full set on, never below two
        assert routable(proxy)[-1] == ["Model-3", "Model-4"]

    run(main)


def test_delete_drains_every_replica_and_forgets_the_app_when_the_last_exits() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2,
                                            graceful_shutdown_timeout_s=5.0)))
        proxy = await h.watcher()
        await h.tick()
        for replica_id in ("Model-1", "Model-2"):
            await h.ready(replica_id)
        deleting = asyncio.ensure_future(h.api.rpc_delete(FakePeer(), name="app",
                                                          timeout_s=None))
        await asyncio.sleep(0)  # the RPC has run up to its wait
        assert proxy.pushed("routes")[-1] == RouteTable(())
        assert h.status() is ApplicationStatus.DELETING
        await h.tick()
        assert h.states() == {"Model-1": "DRAINING", "Model-2": "DRAINING"}
        assert [h.peers[r].called("drain") for r in ("Model-1", "Model-2")] == [
            [{"timeout_s": 5.0}], [{"timeout_s": 5.0}]]
        h.backend.exit("Model-1")
        await h.tick()
        assert "app" in h.state.apps and not deleting.done()
        h.clock.advance(5.0 + 2.0)  # Model-2 overstays its drain: killed every tick
        await h.tick()
        assert h.backend.calls[-1] == ("kill", "Model-2")
        h.backend.exit("Model-2", -9)
        await h.tick()
        await h.api.notify()
        assert await deleting is True
        assert h.state.apps == {} and h.state.deployments == {}

    run(main)


# -- restart -----------------------------------------------------------------------------------


async def first_controller(tmp_path: Path) -> tuple[Harness, dict[str, int]]:
    """A controller with two running replicas and a proxy, checkpointed to tmp_path."""
    h = Harness(tmp_path, backend=FakeBackend(deaths_visible_at_once=False))
    await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2)))
    h.controller.serve_http()
    await h.api.rpc_proxy_started(FakePeer("proxy", proxy_id="proxy-0"),
                                  address="127.0.0.1:8000", pid=h.backend.processes["proxy-0"].pid)
    await h.tick()
    for replica_id in ("Model-1", "Model-2"):
        await h.ready(replica_id)
    await h.tick()
    await h.tick()  # members checkpointed: the first tick in which none changed
    pids = {p: proc.pid for p, proc in h.backend.processes.items()}
    return h, pids


async def restarted(tmp_path: Path) -> Harness:
    h = Harness(tmp_path, backend=FakeBackend(deaths_visible_at_once=False, first_pid=5000),
                clock=FakeClock(monotonic=2000.0), first_id=100)
    h.controller.restore()
    return h


async def restarted_with_its_proxy(tmp_path: Path) -> tuple[Harness, dict[str, int]]:
    """first_controller's state restored by a new controller, whose proxy is back."""
    _, pids = await first_controller(tmp_path)
    h = await restarted(tmp_path)
    await h.api.rpc_hello(FakePeer("proxy", proxy_id="proxy-0"), role="proxy",
                          pid=pids["proxy-0"], proxy_id="proxy-0", address="127.0.0.1:8000")
    return h, pids


async def rejoin(h: Harness, replica_id: str, pid: int, **info: Any) -> FakePeer:
    peer = FakePeer("replica", replica_id=replica_id)
    await h.api.rpc_hello(peer, role="replica", pid=pid, replica_id=replica_id, app="app",
                          deployment="Model", version=1, address=f"unix:/s/{replica_id}.sock",
                          **info)
    await turn()
    return peer


def test_a_restarted_controller_adopts_every_member_and_starts_none(tmp_path: Path) -> None:
    async def main() -> None:
        _, pids = await first_controller(tmp_path)
        h = await restarted(tmp_path)
        assert h.controller.recovery.active
        proxy = FakePeer("proxy", proxy_id="proxy-0")
        await h.api.rpc_hello(proxy, role="proxy", pid=pids["proxy-0"], proxy_id="proxy-0",
                              address="127.0.0.1:8000")
        await h.api.rpc_watch(proxy, deployment=DID)
        await rejoin(h, "Model-1", pids["Model-1"])
        assert proxy.pushed("replica_set") == []  # nothing is pushed while re-attaching
        await rejoin(h, "Model-2", pids["Model-2"])  # the last one: recovery ends at once
        assert not h.controller.recovery.active
        assert routable(proxy) == [["Model-1", "Model-2"]]
        await h.tick()
        assert h.backend.calls == [("adopt", "proxy-0"), ("adopt", "Model-1"),
                                   ("adopt", "Model-2")]
        assert h.states() == {"Model-1": "RUNNING", "Model-2": "RUNNING"}
        assert h.state.proxy_address == "127.0.0.1:8000"
        assert h.status() is ApplicationStatus.RUNNING

    run(main)


def test_a_readopted_replica_keeps_what_it_said_of_its_health_check(tmp_path: Path) -> None:
    async def main() -> None:
        _, pids = await first_controller(tmp_path)
        h = await restarted(tmp_path)
        await rejoin(h, "Model-1", pids["Model-1"], own_health_check=False)
        await rejoin(h, "Model-2", pids["Model-2"])  # an older replica says nothing
        assert not h.state.replicas["Model-1"].own_health_check
        assert h.state.replicas["Model-2"].own_health_check  # called, as before

    run(main)


def test_a_readopted_replica_keeps_its_rank_and_a_new_one_does_not_take_it(
        tmp_path: Path) -> None:
    async def main() -> None:
        h, pids = await restarted_with_its_proxy(tmp_path)
        await rejoin(h, "Model-1", pids["Model-1"], rank=0)  # Model-2 (rank 1) is gone
        assert h.state.replicas["Model-1"].rank == 0
        while h.controller.recovery.active:
            await h.tick(0.125)
        await h.tick()  # a new replica for the missing one
        assert h.backend.started() == ["Model-100"]
        spec = await h.api.rpc_replica_spec(FakePeer("replica", replica_id="Model-100"),
                                            "Model-100")
        assert (spec.rank, spec.world_size) == (1, 2)

    run(main)


def test_a_member_that_never_comes_back_is_killed_and_replaced_at_the_deadline(
        tmp_path: Path) -> None:
    async def main() -> None:
        h, pids = await restarted_with_its_proxy(tmp_path)
        await rejoin(h, "Model-1", pids["Model-1"])
        started = h.clock.monotonic()
        while h.controller.recovery.active:
            await h.tick(0.125)  # exact in binary: the deadline falls on a tick
        assert h.clock.monotonic() - started == RECOVERY_TIMEOUT_S
        assert h.backend.calls[-2:] == [("adopt", "Model-2"), ("kill", "Model-2")]
        await h.tick()  # the deployment wants two: a new replica for the missing one
        assert h.backend.started() == ["Model-100"]
        assert h.states() == {"Model-1": "RUNNING", "Model-100": "STARTING"}

    run(main)


def test_a_replica_of_a_deployment_that_is_gone_is_drained_not_adopted(tmp_path: Path) -> None:
    async def main() -> None:
        h = Harness(tmp_path)
        await h.deploy(app(DeploymentConfig(name="Other")))
        stranger = await rejoin(h, "Model-7", 4242)
        await h.controller.settle()
        assert stranger.called("drain") == [{"timeout_s": 30.0}]
        assert "Model-7" not in h.state.replicas

    run(main)


# -- proxies -----------------------------------------------------------------------------------


def test_proxies_start_one_first_then_the_rest_and_restart_when_they_exit() -> None:
    async def main() -> None:
        h = Harness()
        h.state.proxy_count = 3
        h.controller.serve_http()
        assert h.backend.started("proxy") == ["proxy-0"]
        await h.tick()
        assert h.backend.started("proxy") == ["proxy-0"]  # the others wait for its port
        await h.api.rpc_proxy_started(FakePeer("proxy", proxy_id="proxy-0"),
                                      address="127.0.0.1:8000", pid=1)
        # the others join the port it bound at once
        assert h.backend.started("proxy") == ["proxy-0", "proxy-1", "proxy-2"]
        restarts = []
        for _ in range(3):  # one that keeps exiting: a backoff of 0.2, 0.4, 0.8 s
            h.backend.exit("proxy-1", 1)
            exited, starts = h.clock.monotonic(), h.backend.started("proxy").count("proxy-1")
            while h.backend.started("proxy").count("proxy-1") == starts:
                await h.tick()
            restarts.append(round(h.clock.monotonic() - exited, 3))
        assert restarts == [0.3, 0.5, 0.9]  # seen at the next tick, then the backoff
        await h.api.rpc_proxy_started(FakePeer("proxy", proxy_id="proxy-1"),
                                      address="127.0.0.1:8000", pid=7)
        assert "proxy-1" not in h.state.proxy_backoff  # it served: the backoff starts over

    run(main)


def test_a_proxy_that_cannot_serve_first_fails_the_start_but_a_later_one_does_not(
        ) -> None:
    async def main() -> None:
        h = Harness()
        h.state.proxy_count = 2
        h.controller.serve_http()
        await h.api.rpc_proxy_started(FakePeer("proxy", proxy_id="proxy-0"), pid=1,
                                      error="cannot listen on 0.0.0.0:8000: in use")
        assert h.controller.proxy_ready.is_set()  # main reports it and stops
        assert (h.state.proxy_error, h.state.proxy_address) == (
            "cannot listen on 0.0.0.0:8000: in use", "")
        assert h.backend.started("proxy") == ["proxy-0"]  # no one joins a port never bound

        h = Harness()
        h.state.proxy_count = 2
        h.controller.serve_http()
        await h.api.rpc_proxy_started(FakePeer("proxy", proxy_id="proxy-0"), pid=1,
                                      address="127.0.0.1:8000")
        await h.api.rpc_proxy_started(FakePeer("proxy", proxy_id="proxy-1"), pid=2,
                                      error="cannot serve TLS: no key")
        assert (h.state.proxy_error, h.state.proxy_address) == ("", "127.0.0.1:8000")

    run(main)


def test_a_handle_targets_the_apps_ingress_or_one_of_its_deployments() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Ingress"), DeploymentConfig(name="Model")))
        target = h.api.rpc_handle_target
        assert await target(FakePeer("driver"), app="app") == "Ingress"
        assert await target(FakePeer("driver"), app="app", deployment="Model") == "Model"
        assert await target(FakePeer("driver"), app="app", deployment="Other") is None
        assert await target(FakePeer("driver"), app="other") is None
        assert await target(FakePeer("driver"), app="other", deployment="Model") is None

    run(main)


def test_node_proxies_follow_the_replicas_with_distinct_ports_on_a_shared_ip() -> None:
    async def main() -> None:
        backend = FakeBackend(Placement("head", "10.0.0.1"), deaths_visible_at_once=False)
        h = Harness(backend=backend)
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2)))
        h.controller.serve_http()
        await h.tick()
        backend.place("Model-1", "node-a", "10.0.0.2")
        backend.place("Model-2", "node-b", "10.0.0.2")  # two raylets on one host
        await h.tick()
        assert h.backend.started("proxy") == ["proxy-0", "proxy-node-node-a",
                                              "proxy-node-node-b"]
        ports = {p: n.port for p, n in h.state.node_proxies.items()}
        assert ports == {"proxy-node-node-a": 8000, "proxy-node-node-b": 8001}
        backend.exit("Model-2")  # node-b hosts no replica now: its proxy is asked to stop
        await h.tick()
        assert ("term", "proxy-node-node-b") in backend.calls
        await h.tick()  # asked once
        assert backend.calls.count(("term", "proxy-node-node-b")) == 1

    run(main)


def test_max_constructor_retry_count_is_the_deployments_own() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(DeploymentConfig(name="Model", max_constructor_retry_count=1)))
        await h.tick()
        await h.api.rpc_replica_started(FakePeer(), replica_id="Model-1", error="boom")
        h.backend.exit("Model-1", 1)
        await h.tick()
        await h.tick()
        assert h.backend.started() == ["Model-1"]
        assert h.status() is ApplicationStatus.DEPLOY_FAILED

    run(main)


def test_without_surge_room_a_rolling_update_stops_an_old_replica_first() -> None:
    async def main() -> None:
        h = Harness()
        config = DeploymentConfig(name="Model", num_replicas=2, max_surge_percent=0,
                                  rolling_update_percentage=0.5)
        await h.deploy(app(config, code=b"v1"))
        await h.tick()
        for replica_id in ("Model-1", "Model-2"):
            await h.ready(replica_id)
        await h.deploy(app(config, code=b"v2"))  # planned at once, not at the next tick
        assert h.states() == {"Model-1": "DRAINING", "Model-2": "RUNNING"}
        assert h.backend.started() == ["Model-1", "Model-2"]  # no room: nothing starts yet
        await h.tick()  # the draining one left the live set (policy/reconcile.py): room
        assert h.backend.started()[2:] == ["Model-3"]
        h.backend.exit("Model-1")
        await h.tick()
        assert h.backend.started()[2:] == ["Model-3"]  # one at a time (50% of 2)

    run(main)


def test_shutdown_stops_the_proxies_first_then_drains_every_replica() -> None:
    async def main() -> None:
        h = Harness(backend=FakeBackend(exit_on_signal=True))
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2)))
        h.controller.serve_http()
        await h.tick()
        for replica_id in ("Model-1", "Model-2"):
            peer = await h.ready(replica_id)
            peer.answers["drain"] = lambda timeout_s, rid=replica_id: h.backend.exit(rid)
        await h.controller.shutdown()
        await h.controller.settle()
        signals = [(call, pid) for call, pid in h.backend.calls if call in ("term", "kill")]
        assert signals == [("term", "proxy-0")]  # the replicas drained through their link
        assert [h.peers[r].called("drain") for r in ("Model-1", "Model-2")] == [
            [{"timeout_s": 20.0}], [{"timeout_s": 20.0}]]
        assert h.backend.processes == {} and h.backend.closed
        assert h.controller.stopped.is_set()
        with pytest.raises(ConfigError, match="shutting down"):
            await h.deploy(app(DeploymentConfig(name="Late")))

    run(main)


def test_a_delete_during_shutdown_starts_no_replacements() -> None:
    async def main() -> None:
        h = Harness()  # replicas do not exit on their own: the shutdown stays draining
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2)))
        await h.deploy(app(DeploymentConfig(name="Other"), name="other", route_prefix="/o"))
        for replica_id in h.backend.started():
            await h.ready(replica_id)
        shutdown = asyncio.ensure_future(h.controller.shutdown())
        await turn()
        assert set(h.states().values()) == {"DRAINING"}
        before = h.backend.started()
        await h.api.rpc_delete(FakePeer("driver"), name="other", timeout_s=0.0)
        await turn()
        assert h.backend.started() == before  # the plan does not replace the draining
        for replica_id in before:
            h.backend.exit(replica_id)
        await shutdown

    run(main)


def test_delete_during_a_rolling_update_drains_old_and_new_alike() -> None:
    async def main() -> None:
        h = Harness()
        config = DeploymentConfig(name="Model", num_replicas=2)
        await h.deploy(app(config, code=b"v1"))
        await h.tick()
        for replica_id in ("Model-1", "Model-2"):
            await h.ready(replica_id)
        await h.deploy(app(config, code=b"v2"))
        await h.tick()
        await h.ready("Model-3")
        await h.tick()  # Model-1 drains for the new version; Model-4 still starts
        assert h.states() == {"Model-1": "DRAINING", "Model-2": "RUNNING",
                              "Model-3": "RUNNING", "Model-4": "STARTING"}
        deleting = asyncio.ensure_future(h.api.rpc_delete(FakePeer(), name="app",
                                                          timeout_s=None))
        await asyncio.sleep(0)  # the RPC has run up to its wait
        await h.tick()
        assert set(h.states().values()) == {"DRAINING"}  # the starting one too
        assert ("term", "Model-4") in h.backend.calls  # not ready: no link to drain by
        for replica_id in list(h.state.replicas):
            h.backend.exit(replica_id)
        await h.tick()
        await h.api.notify()
        assert await deleting is True and h.state.apps == {}

    run(main)


def test_an_action_that_fails_does_not_cost_the_others(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        h = Harness()
        broken = h.backend.start_replica

        def start(launch: Any) -> int:
            if launch.deployment.name == "Model":
                raise RuntimeError("the disk is full")
            return broken(launch)

        h.backend.start_replica = start  # type: ignore[method-assign]
        await h.deploy(app(DeploymentConfig(name="Model", num_replicas=2)))
        await h.deploy(app(DeploymentConfig(name="Other"), name="other", route_prefix="/o"))
        await h.tick()
        assert h.backend.started() == ["Other-3"]  # Model-1 and -2 failed to start; Other did
        assert "the disk is full" in caplog.text

    run(main)
