"""The control loop's decisions, as pure functions of the state: state + observations -> actions.

Each tick the controller (1) asks the backend what exited and turns that into actions
(`absorb_exits`), applies them, then (2) asks `plan` what to do next and applies that:

* per deployment: policy.reconcile turns target, version and replicas into starts,
  activations and drains (nothing while the deployment has failed to start; starts in
  waves of at most MAX_CONNECTING replicas on their way in, `start_room`), for the
  deployments that changed since they were last found settled (`needs_reconcile`: a
  replica of theirs appeared, left or moved, or their target, version, standby count,
  failures or spec changed; the controller marks them settled with `settled`);
* health checks that are due, in the order they came due, at most `health_budget` per
  tick (a herd of replicas that became ready together is spread over the period), and
  due replicas that failed three in a row;
* draining replicas still alive past their drain deadline are killed;
* proxies (policy.placement): the head's workers, the first one before the others (they
  join the port it bound), restarted when they exit; with EveryNode on a multi-node
  backend, one proxy per other node that hosts a replica, stopped when it hosts none;
* deleted deployments whose last replica is gone are forgotten.

Nothing here reads the clock or does I/O; tests feed states and assert the actions.
The indexes it reads (controller/groups.py) make a tick cost what changed: a
deployment with nothing new is not reconciled, only due health checks are looked at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from surge.backends.base import Exit, Placement
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
from surge.controller.groups import SERVING
from surge.controller.state import (
    HEALTH_CHECK_FAILURE_THRESHOLD,
    ControllerState,
    DeploymentRecord,
    ReplicaRecord,
)
from surge.model import DeploymentId
from surge.policy import reconcile as policy
from surge.policy.cadence import TICK_S  # the plan runs once per tick
from surge.policy.lifecycle import ReplicaState
from surge.policy.placement import proxy_nodes, proxy_port

__all__ = [
    "HEALTH_CHECKS_PER_TICK_MIN",
    "MAX_CONNECTING",
    "NODE_PROXY_PREFIX",
    "PROXY_PREFIX",
    "Observed",
    "absorb_exits",
    "health_budget",
    "is_proxy",
    "needs_reconcile",
    "plan",
    "reconcile_deployment",
    "reconcile_inputs",
    "settled",
    "start_room",
]

PROXY_PREFIX = "proxy-"
NODE_PROXY_PREFIX = "proxy-node-"
# Health checks started per tick: at least this many, and twice the steady rate (every
# serving replica once per period), so a herd that came due together is spread over
# half a period instead of hitting the controller in one tick.
HEALTH_CHECKS_PER_TICK_MIN = 16
HEALTH_BUDGET_FACTOR = 2.0
# Replicas started and not yet in (connected, proved, asked for their spec) at once. A
# herd larger than this starts in waves: its control connections wait in the
# controller's handshake queue (transport/gate.py) for less than a member's patience,
# instead of all together, most of them timing out and being started again.
MAX_CONNECTING = 1024


def start_room(state: ControllerState) -> int:
    """How many more replicas may start now (MAX_CONNECTING less those on their way in)."""
    return max(0, MAX_CONNECTING - len(state.connecting))


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
    stopping: set[str] = set()
    room = start_room(state)
    for did, record in state.deployments.items():
        group = state.group(did)
        if needs_reconcile(state, record):
            changes = reconcile_deployment(state, did, now, room=room)
            stopping.update(a.replica_id for a in changes if isinstance(a, StopReplica))
            room -= sum(a.count for a in changes if isinstance(a, StartReplicas))
            actions += changes
        if record.deleting and not group.members:
            actions.append(ForgetDeployment(did))
    actions += _health(state, now, stopping)
    actions += [KillProcess(r.replica_id, "still alive after its drain deadline")
                for group in state.groups.values()
                for stopped in (ReplicaState.DRAINING, ReplicaState.FAILED)
                for r in group.by_state[stopped].values()
                if r.stop_deadline is not None and now > r.stop_deadline]
    actions += _proxies(state, observed, now)
    return actions


def reconcile_inputs(record: DeploymentRecord) -> tuple[object, ...]:
    """What reconcile reads of the deployment itself (its replicas mark their group)."""
    return (record.target, record.version, record.standby_wanted, record.constructor_failures,
            record.deleting, id(record.spec))


def needs_reconcile(state: ControllerState, record: DeploymentRecord) -> bool:
    group = state.group(record.id)
    return group.dirty or group.reconciled_inputs != reconcile_inputs(record)


def settled(state: ControllerState, actions: Sequence[Action], now: float) -> None:
    """After a plan, before its actions are applied: the deployments it reconciled that
    needed nothing are settled (reconciled again only once something changes). One
    that asked for something stays unsettled, so a start that could not be placed is
    asked for again at the next tick, and so does one backing off after a failed start
    (its starts are due when the backoff ends, with nothing else changed)."""
    busy = {a.deployment for a in actions if isinstance(a, StartReplicas)}
    busy.update(did for did, record in state.deployments.items()
                if now < record.start_not_before)
    for action in actions:
        if isinstance(action, StopReplica | ActivateReplica):
            replica = state.replicas.get(action.replica_id)
            if replica is not None:
                busy.add(replica.deployment)
    for did, record in state.deployments.items():
        if did not in busy:
            group = state.group(did)
            group.dirty, group.reconciled_inputs = False, reconcile_inputs(record)


def reconcile_deployment(state: ControllerState, did: DeploymentId, now: float,
                         replicas: Sequence[ReplicaRecord] | None = None,
                         room: int | None = None) -> list[Action]:
    """Starts, activations and drains that bring the deployment to its target (no
    starts while it backs off after a failed one; at most `room` starts, by default
    `start_room`, the rest deferred to a later wave)."""
    record = state.deployments[did]
    if state.failed(did) or (replicas is None and _at_target(state, record)):
        return []
    observed = state.replicas_of(did) if replicas is None else replicas
    config = record.config
    rollout = policy.Rollout.of(record.target, config.rolling_update_percentage,
                                config.max_surge_percent)
    actions: list[Action] = []
    for action in policy.reconcile(record.target, record.version, observed,
                                   record.standby_wanted, rollout):
        if isinstance(action, policy.StartReplicas):
            if now >= record.start_not_before:
                room = start_room(state) if room is None else room
                count = min(action.count, room)
                actions.append(StartReplicas(did, count, action.reason, action.count - count))
        else:
            actions.append(action)
    return actions


def _at_target(state: ControllerState, record: DeploymentRecord) -> bool:
    """Whether policy.reconcile would ask for nothing, from the counts alone: no live
    replica of an old version, as many live ones of this version as wanted, and no
    standby to activate (the common case of a settled deployment, in O(1))."""
    group, version = state.group(record.id), record.version
    if group.alive_outdated(version):
        return False
    running = group.count(ReplicaState.RUNNING, version)
    standby = group.count(ReplicaState.STANDBY, version)
    live = running + standby + group.count(ReplicaState.STARTING, version)
    return (live == record.target + record.standby_wanted
            and (running >= record.target or not standby))


def health_budget(state: ControllerState) -> int:
    """How many health checks one tick may start (HEALTH_CHECKS_PER_TICK_MIN)."""
    steady = 0.0
    for did, group in state.groups.items():
        record = state.deployments.get(did)
        if record is not None:
            serving = group.count(ReplicaState.RUNNING) + group.count(ReplicaState.STANDBY)
            steady += serving * TICK_S / max(record.config.health_check_period_s, TICK_S)
    return max(HEALTH_CHECKS_PER_TICK_MIN, math.ceil(HEALTH_BUDGET_FACTOR * steady))


def _health(state: ControllerState, now: float, skip: set[str]) -> list[Action]:
    actions: list[Action] = []
    budget = health_budget(state)
    for replica_id in state.health.due(now):
        replica = state.replicas.get(replica_id)
        if (replica is None or replica_id in skip or replica.state not in SERVING
                or replica.peer is None):
            continue
        if replica.health_failures >= HEALTH_CHECK_FAILURE_THRESHOLD:
            actions.append(FailReplica(replica.replica_id, "failed its health checks",
                                       health=True))
        elif not replica.health_check_running:
            actions.append(CheckHealth(replica.replica_id))
            budget -= 1
            if budget <= 0:
                break
    return actions


def _proxies(state: ControllerState, observed: Observed, now: float) -> list[Action]:
    if not state.serve_http or state.stopping:
        return []
    if state.proxy_error and not state.proxy_address:  # the first one could not serve
        return []
    present = {p for p in (*observed.alive, *state.proxies)
               if is_proxy(p) and p not in state.replicas}
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
    nodes: set[str] = set()
    unplaced = 0
    for group in state.groups.values():
        nodes.update(group.nodes)
        unplaced += group.unplaced
    for process_id, placed in observed.placements.items():
        replica = state.replicas.get(process_id)
        if replica is None or not replica.alive:
            continue
        nodes.add(placed.node_id)
        if replica.info is None and replica.state is not ReplicaState.STARTING:
            unplaced -= 1  # placed: its node is known after all
    return nodes if not unplaced else None


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
