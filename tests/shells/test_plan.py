"""controller.plan: states in, actions out, as tables (no loop, no backend, no clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from surge.backends.base import Exit, Placement
from surge.config import AppSpec, DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller import desired
from surge.controller.actions import (
    Action,
    ActivateReplica,
    CheckHealth,
    FailReplica,
    ForgetDeployment,
    KillProcess,
    ProxyExited,
    ReplicaExited,
    StartProxy,
    StartReplicas,
    StopProxy,
    StopReplica,
)
from surge.controller.plan import (
    HEALTH_CHECKS_PER_TICK_MIN,
    MAX_CONNECTING,
    Observed,
    absorb_exits,
    health_budget,
    needs_reconcile,
    plan,
    settled,
    start_room,
)
from surge.controller.state import ControllerState, ReplicaRecord
from surge.model import DeploymentId, ReplicaInfo
from surge.policy.lifecycle import ReplicaState

DID = DeploymentId("app", "Model")
HEAD = Placement("head", "10.0.0.1")
S = ReplicaState
NOW = 100.0


def state_with(*replicas: tuple[str, ReplicaState, int], target: int = 2,
               proxies: int = 1, **config: object) -> ControllerState:
    """One deployment (version 2) at `target`, with (id, state, version) replicas."""
    state = ControllerState("127.0.0.1:1", HTTPOptions(), proxies, head=HEAD)
    spec = DeploymentSpec(config=DeploymentConfig(name="Model", num_replicas=target,
                                                  **config),  # type: ignore[arg-type]
                          target_blob=b"v", init_blob=b"")
    desired.deploy(state, AppSpec(name="app", route_prefix="/", ingress="Model",
                                  deployments=(spec,)), wall=0.0)
    state.deployments[DID].version = 2
    for index, (replica_id, replica_state, version) in enumerate(replicas):
        state.add_replica(ReplicaRecord(replica_id, DID, version, float(index),
                                        replica_state, pid=index + 1, peer=object(),  # type: ignore[arg-type]
                                        next_health_check=NOW + 1))
    return state


@pytest.mark.parametrize(("replicas", "target", "expected"), [
    ((), 2, [StartReplicas(DID, 2, "0 of 2 live")]),
    ((("a", S.RUNNING, 2), ("b", S.STARTING, 2)), 2, []),
    ((("a", S.RUNNING, 2), ("b", S.RUNNING, 2)), 1, [StopReplica("b", "scale down to 1")]),
    # a rolling update: the old one stops only once a new one runs
    ((("o", S.RUNNING, 1), ("n", S.STARTING, 2)), 1, []),
    ((("o", S.RUNNING, 1), ("n", S.RUNNING, 2)), 1, [StopReplica("o", "replaced by new version")]),
    ((("o", S.STARTING, 1),), 1, [StopReplica("o", "outdated version, not yet serving"),
                                  StartReplicas(DID, 1, "0 of 1 live")]),
    # draining and failed replicas are not live: replaced
    ((("d", S.DRAINING, 2), ("f", S.FAILED, 2)), 1, [StartReplicas(DID, 1, "0 of 1 live")]),
])
def test_reconcile(replicas: tuple[tuple[str, ReplicaState, int], ...], target: int,
                   expected: list[Action]) -> None:
    assert plan(state_with(*replicas, target=target), Observed(), NOW) == expected


def test_a_standby_is_activated_before_anything_starts() -> None:
    state = state_with(("s", S.STANDBY, 2), target=1)
    assert plan(state, Observed(), NOW) == [ActivateReplica("s", "0 of 1 running")]


def test_a_failed_deployment_starts_nothing_more() -> None:
    state = state_with(target=1)
    state.deployments[DID].constructor_failures = 3
    assert plan(state, Observed(), NOW) == []
    state.deployments[DID].constructor_failures = 2
    assert plan(state, Observed(), NOW) == [StartReplicas(DID, 1, "0 of 1 live")]


@pytest.mark.parametrize(("due", "running", "failures", "expected"), [
    (NOW + 1, False, 0, []),  # not due yet
    (NOW, False, 0, [CheckHealth("a")]),  # due now
    (NOW, True, 0, []),  # the last one is still running
    (NOW, False, 3, [FailReplica("a", "failed its health checks", health=True)]),
    (NOW + 1, False, 3, []),  # (the executor fails it at its third failure already)
    (NOW, False, 2, [CheckHealth("a")]),
])
def test_health_checks(due: float, running: bool, failures: int,
                       expected: list[Action]) -> None:
    state = state_with(("a", S.RUNNING, 2), target=1)
    replica = state.replicas["a"]
    state.health.schedule(replica, due)
    replica.health_check_running, replica.health_failures = running, failures
    assert plan(state, Observed(), NOW) == expected


def test_health_checks_that_come_due_together_are_spread_over_ticks() -> None:
    """600 replicas with a 5 s period are checked 12 per tick on average; a herd that
    came due together (a restarted controller adopting them all) starts at most twice
    that per tick, the longest due first, instead of 600 calls in one tick."""
    state = state_with(*((f"r{i:03}", S.RUNNING, 2) for i in range(600)), target=600,
                       health_check_period_s=5.0)
    for i, replica in enumerate(state.replicas.values()):
        state.health.schedule(replica, NOW - 1 + i / 1000)
    assert health_budget(state) == 12 * 2
    checks = [a.replica_id for a in plan(state, Observed(), NOW) if isinstance(a, CheckHealth)]
    assert checks == [f"r{i:03}" for i in range(24)]
    assert health_budget(state_with(("a", S.RUNNING, 2), target=1)) == \
        HEALTH_CHECKS_PER_TICK_MIN


def test_only_what_changed_is_reconciled_once_settled() -> None:
    state = state_with(("a", S.RUNNING, 2), ("b", S.RUNNING, 2), target=2)
    assert needs_reconcile(state, state.deployments[DID])  # never reconciled yet
    settled(state, plan(state, Observed(), NOW), NOW)
    assert not needs_reconcile(state, state.deployments[DID])
    state.replicas["a"].move(S.FAILED)  # a replica changed: its deployment is looked at
    assert needs_reconcile(state, state.deployments[DID])
    actions = plan(state, Observed(), NOW)
    assert actions == [StartReplicas(DID, 1, "1 of 2 live")]
    settled(state, actions, NOW)  # it asked for a start: unsettled until that is seen done
    assert needs_reconcile(state, state.deployments[DID])
    state.remove_replica("a")
    state.add_replica(ReplicaRecord("c", DID, 2, 5.0, S.STARTING))
    settled(state, plan(state, Observed(), NOW), NOW)
    assert not needs_reconcile(state, state.deployments[DID])
    state.deployments[DID].target = 3  # its own inputs changed
    assert needs_reconcile(state, state.deployments[DID])


def test_a_deployment_backing_off_stays_unsettled_until_its_start_is_due() -> None:
    """No start while it backs off after a failed one, and nothing else changes when
    the backoff ends: it is reconciled each tick until then."""
    state = state_with(("a", S.RUNNING, 2), target=2)
    state.start_failed(state.deployments[DID], "boom", NOW)  # backs off 0.5 s
    actions = plan(state, Observed(), NOW)
    assert actions == []
    settled(state, actions, NOW)
    assert needs_reconcile(state, state.deployments[DID])
    assert plan(state, Observed(), NOW + 0.5) == [StartReplicas(DID, 1, "1 of 2 live")]


def test_a_replica_past_its_drain_deadline_is_killed_every_tick() -> None:
    state = state_with(("a", S.RUNNING, 2), ("d", S.DRAINING, 2), target=1)
    state.replicas["d"].stop_deadline = NOW - 0.01
    assert plan(state, Observed(), NOW) == [KillProcess("d", "still alive after its drain "
                                                             "deadline")]
    state.replicas["d"].stop_deadline = NOW
    assert plan(state, Observed(), NOW) == []


def test_a_deleted_deployment_is_forgotten_once_its_last_replica_is_gone() -> None:
    state = state_with(("d", S.DRAINING, 2), target=1)
    desired.delete(state, "app")
    assert plan(state, Observed(), NOW) == []
    state.remove_replica("d")
    assert plan(state, Observed(), NOW) == [ForgetDeployment(DID)]


def test_exits_become_actions_that_say_whether_the_replica_ever_served() -> None:
    state = state_with(("s", S.STARTING, 2), ("r", S.RUNNING, 2))
    exits = [Exit("s", 1), Exit("r", -9), Exit("proxy-0", 0), Exit("gone", 0)]
    assert absorb_exits(state, exits) == [ReplicaExited("s", 1, before_ready=True),
                                          ReplicaExited("r", -9, before_ready=False),
                                          ProxyExited("proxy-0", 0)]


def proxies(state: ControllerState, alive: set[str] = frozenset(),  # type: ignore[assignment]
            placements: dict[str, Placement] | None = None) -> list[Action]:
    actions = plan(state, Observed(frozenset(alive), placements or {}), NOW)
    return [a for a in actions if isinstance(a, StartProxy | StopProxy)]


def test_head_proxies_start_one_first_and_are_restarted() -> None:
    state = state_with(("a", S.RUNNING, 2), target=1, proxies=2)
    assert proxies(state) == []  # not serving HTTP yet
    state.serve_http = True
    why = "a proxy worker of the head node is not running"
    assert proxies(state) == [StartProxy("proxy-0", "head", "10.0.0.1", None, why)]
    assert proxies(state, {"proxy-0"}) == []  # starting: asked once
    state.proxy_error = "cannot bind"  # the first one could not serve: nothing more
    assert proxies(state) == []
    state.proxy_error = ""
    state.proxy_address = "10.0.0.1:8000"  # it bound the port: the other worker joins it
    assert proxies(state, {"proxy-0"}) == [StartProxy("proxy-1", "head", "10.0.0.1", None,
                                                      why)]
    state.proxy_error = "a later failure"  # once one served, failures are restarted
    assert len(proxies(state)) == 2
    state.proxy_backoff["proxy-1"] = (2, NOW + 0.4)  # it keeps exiting: it waits
    assert [a.proxy_id for a in proxies(state)] == ["proxy-0"]
    state.stopping = True
    assert proxies(state) == []


def test_node_proxies_follow_replica_placement_per_proxy_location() -> None:
    state = state_with(("a", S.RUNNING, 2), ("b", S.RUNNING, 2))
    state.serve_http, state.proxy_address = True, "10.0.0.1:8000"
    placed = {"a": Placement("n1", "10.0.0.2"), "b": Placement("head", "10.0.0.1")}
    assert proxies(state, {"proxy-0"}, placed) == [
        StartProxy("proxy-node-n1", "n1", "10.0.0.2", 8000, "node n1 hosts replicas")]
    state.http = replace(state.http, location="HeadOnly")
    assert proxies(state, {"proxy-0"}, placed) == []
    state.http = replace(state.http, location="EveryNode")
    # the replica left n1: its proxy is asked to stop, once
    state.remove_replica("a")
    placed = {"b": Placement("head", "10.0.0.1")}
    stop = StopProxy("proxy-node-n1", "node n1 hosts no replica now")
    assert proxies(state, {"proxy-0", "proxy-node-n1"}, placed) == [stop]
    state.stopping_proxies.add("proxy-node-n1")
    assert proxies(state, {"proxy-0", "proxy-node-n1"}, placed) == []


def test_no_node_proxy_stops_while_a_live_replica_is_nowhere_known() -> None:
    state = state_with(("a", S.RUNNING, 2))  # no placement yet, no address reported
    state.serve_http, state.proxy_address = True, "10.0.0.1:8000"
    assert proxies(state, {"proxy-0", "proxy-node-n1"}) == []
    state.replicas["a"].info = ReplicaInfo("a", DID, "10.0.0.2:1", 1, node_id="n1")
    assert proxies(state, {"proxy-0", "proxy-node-n1"}) == []  # it reported n1: n1 stays


def test_nodes_sharing_an_ip_get_distinct_ports() -> None:
    state = state_with(("a", S.RUNNING, 2), ("b", S.RUNNING, 2))
    state.serve_http, state.proxy_address = True, "10.0.0.1:8000"
    placed = {"a": Placement("n1", "10.0.0.1"), "b": Placement("n2", "10.0.0.1"),
              "proxy-0": Placement("head", "10.0.0.1")}
    assert [(a.proxy_id, a.port) for a in proxies(state, {"proxy-0"}, placed)
            if isinstance(a, StartProxy)] == [("proxy-node-n1", 8001), ("proxy-node-n2", 8002)]


def test_a_herd_starts_in_waves_of_replicas_on_their_way_in() -> None:
    # STARTING replicas with spec_sent False (no peer): still connecting.
    state = state_with(target=MAX_CONNECTING + 500)
    first = plan(state, Observed(), NOW)
    assert first == [StartReplicas(DID, MAX_CONNECTING, f"0 of {MAX_CONNECTING + 500} live",
                                   deferred=500)]
    settled(state, first, NOW)  # starts were asked for: not settled, planned again
    for index in range(MAX_CONNECTING):
        state.add_replica(ReplicaRecord(f"r{index}", DID, 2, NOW))
    assert start_room(state) == 0
    assert plan(state, Observed(), NOW) == [
        StartReplicas(DID, 0, f"{MAX_CONNECTING} of {MAX_CONNECTING + 500} live", deferred=500)]
    for index in range(300):  # 300 of the first wave got in
        state.spec_sent(state.replicas[f"r{index}"])
    assert plan(state, Observed(), NOW) == [
        StartReplicas(DID, 300, f"{MAX_CONNECTING} of {MAX_CONNECTING + 500} live",
                      deferred=200)]
    state.remove_replica("r400")  # one that exited before it got in makes room too
    assert start_room(state) == 301
