"""The control loop's decisions, as pure functions of the state: state + observations -> actions.

Each tick the controller (1) asks the backend what exited and turns that into actions
(`absorb_exits`), applies them, then (2) asks `plan` what to do next and applies that:

* per deployment: policy.reconcile turns target, version and replicas into starts,
  activations and drains (nothing while the deployment has failed to start);
* health checks that are due, and replicas that failed three in a row;
* replicas still alive past their drain deadline are killed;
* proxies (policy.placement): the head's workers, the first one before the others (they
  join the port it bound), restarted when they exit; with EveryNode on a multi-node
  backend, one proxy per other node that hosts a replica, stopped when it hosts none;
* deleted deployments whose last replica is gone are forgotten.

Nothing here reads the clock or does I/O; tests feed states and assert the actions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from surge.backends.base import Exit, Placement
from surge.controller.actions import (
    Action,
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
from surge.controller.state import (
    HEALTH_CHECK_FAILURE_THRESHOLD,
    ControllerState,
    ReplicaRecord,
)
from surge.model import DeploymentId
from surge.policy import reconcile as policy
from surge.policy.lifecycle import ReplicaState
from surge.policy.placement import proxy_nodes, proxy_port

__all__ = ["NODE_PROXY_PREFIX", "PROXY_PREFIX", "Observed", "absorb_exits", "is_proxy",
           "plan", "reconcile_deployment"]

PROXY_PREFIX = "proxy-"
NODE_PROXY_PREFIX = "proxy-node-"
_SERVING = (ReplicaState.RUNNING, ReplicaState.STANDBY)


def is_proxy(process_id: str) -> bool:
    return process_id.startswith(PROXY_PREFIX)


@dataclass(frozen=True)
class Observed:
    """What the backend says this tick."""

    alive: frozenset[str] = frozenset()  # process ids it runs (still starting included)
    placements: Mapping[str, Placement] = field(default_factory=dict)  # where they run


def absorb_exits(state: ControllerState, exits: Iterable[Exit]) -> list[Action]:
    actions: list[Action] = []
    for exit_ in exits:
        replica = state.replicas.get(exit_.process_id)  # first: a replica may be "proxy-..."
        if replica is not None:
            actions.append(ReplicaExited(replica.replica_id, exit_.returncode,
                                         before_ready=replica.state is ReplicaState.STARTING))
        elif is_proxy(exit_.process_id):
            actions.append(ProxyExited(exit_.process_id, exit_.returncode))
    return actions


def plan(state: ControllerState, observed: Observed, now: float) -> list[Action]:
    actions: list[Action] = []
    groups = state.by_deployment()
    for did in state.deployments:
        replicas = groups.get(did, [])
        changes = reconcile_deployment(state, did, now, replicas)
        stopping = {a.replica_id for a in changes if isinstance(a, StopReplica)}
        actions += changes
        actions += _health([r for r in replicas if r.replica_id not in stopping], now)
        if state.deployments[did].deleting and not replicas:
            actions.append(ForgetDeployment(did))
    actions += [KillProcess(r.replica_id, "still alive after its drain deadline")
                for r in state.replicas.values()
                if r.stop_deadline is not None and now > r.stop_deadline]
    actions += _proxies(state, observed, now)
    return actions


def reconcile_deployment(state: ControllerState, did: DeploymentId, now: float,
                         replicas: Sequence[ReplicaRecord] | None = None) -> list[Action]:
    """Starts, activations and drains that bring the deployment to its target (no
    starts while it backs off after a failed one)."""
    record = state.deployments[did]
    group = state.replicas_of(did) if replicas is None else replicas
    if state.failed(did, group):
        return []
    observed = [policy.ObservedReplica(r.replica_id, r.state, r.version, r.started_at)
                for r in group]
    config = record.config
    rollout = policy.Rollout.of(record.target, config.rolling_update_percentage,
                                config.max_surge_percent)
    actions: list[Action] = []
    for action in policy.reconcile(record.target, record.version, observed,
                                   record.standby_wanted, rollout):
        if isinstance(action, policy.StartReplicas):
            if now >= record.start_not_before:
                actions.append(StartReplicas(did, action.count, action.reason))
        else:
            actions.append(action)
    return actions


def _health(replicas: Iterable[ReplicaRecord], now: float) -> list[Action]:
    actions: list[Action] = []
    for replica in replicas:
        if replica.state not in _SERVING or replica.peer is None:
            continue
        if replica.health_failures >= HEALTH_CHECK_FAILURE_THRESHOLD:
            actions.append(FailReplica(replica.replica_id, "failed its health checks"))
        elif not replica.health_check_running and now >= replica.next_health_check:
            actions.append(CheckHealth(replica.replica_id))
    return actions


def _proxies(state: ControllerState, observed: Observed, now: float) -> list[Action]:
    if not state.serve_http or state.stopping:
        return []
    if state.proxy_error and not state.proxy_address:  # the first one could not serve
        return []
    present = (set(observed.alive) | set(state.proxies)) - set(state.replicas)
    # The first worker binds the port; the others join it once it has.
    workers = state.proxy_count if state.proxy_address else 1
    actions: list[Action] = [
        StartProxy(f"{PROXY_PREFIX}{i}", state.head.node_id, state.head.node_ip, None,
                   "a proxy worker of the head node is not running")
        for i in range(workers)
        if f"{PROXY_PREFIX}{i}" not in present and _may_start(state, f"{PROXY_PREFIX}{i}", now)]
    nodes = _replica_nodes(state, observed)
    wanted = proxy_nodes(state.http.location, state.head.node_id, nodes or ())
    wanted -= {state.head.node_id}
    running = {pid[len(NODE_PROXY_PREFIX):]: pid for pid in present
               if pid.startswith(NODE_PROXY_PREFIX)}
    if nodes is not None:  # every live replica's node is known: stop proxies of none
        actions += [StopProxy(pid, f"node {node[:12]} hosts no replica now")
                    for node, pid in sorted(running.items())
                    if node not in wanted and pid not in state.stopping_proxies]
    taken = _ports_by_ip(state, observed, present)
    for node in sorted(wanted - set(running)):
        proxy_id = f"{NODE_PROXY_PREFIX}{node}"
        if not _may_start(state, proxy_id, now):
            continue
        ip = next((p.node_ip for p in observed.placements.values() if p.node_id == node),
                  state.head.node_ip)
        port = proxy_port(state.http.port, taken.setdefault(ip, []))
        taken[ip].append(port)
        actions.append(StartProxy(proxy_id, node, ip, port, f"node {node[:12]} hosts replicas"))
    return actions


def _may_start(state: ControllerState, proxy_id: str, now: float) -> bool:
    """Not while a proxy that keeps exiting waits out its restart backoff."""
    return state.proxy_backoff.get(proxy_id, (0, float("-inf")))[1] <= now


def _replica_nodes(state: ControllerState, observed: Observed) -> set[str] | None:
    """The nodes hosting live replicas, from the backend's placements or (after a
    restart, before those are known again) the replicas' own reports; None while a live
    replica's node is not known at all."""
    nodes = set()
    for replica_id, replica in state.replicas.items():
        if not replica.alive:
            continue
        placed = observed.placements.get(replica_id)
        if placed is not None:
            nodes.add(placed.node_id)
        elif replica.info is not None:
            nodes.add(replica.info.node_id)
        elif replica.state is not ReplicaState.STARTING:
            return None
    return nodes


def _ports_by_ip(state: ControllerState, observed: Observed,
                 proxies: Iterable[str]) -> dict[str, list[int]]:
    """The ports surge's proxies hold, per IP (nodes sharing an IP need distinct ports)."""
    taken: dict[str, list[int]] = {}
    for proxy_id in proxies:
        if not is_proxy(proxy_id):
            continue
        asked = state.node_proxies.get(proxy_id)
        placed = observed.placements.get(proxy_id)
        ip = placed.node_ip if placed else asked.node_ip if asked else state.head.node_ip
        port = asked.port if asked is not None and asked.port is not None else state.http.port
        taken.setdefault(ip, []).append(port)
    return taken
