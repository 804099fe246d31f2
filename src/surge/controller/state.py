"""The controller's state: applications, deployments, replicas and proxies, in one place.

`ControllerState` holds one index of each: `apps` by name, `deployments` by id,
`replicas` by replica id, `proxies` by proxy id. Each deployment's replicas are also
indexed by state and counted by (state, version) in a `ReplicaGroup`
(controller/groups.py), kept up to date by `add_replica`, `remove_replica` and
`ReplicaRecord.move`, the only ways a replica appears, leaves or changes state; health
checks due are kept in order in a `HealthSchedule`. So questions the loop asks every
tick (how many run, has it failed, what changed) cost what changed, not a pass over
every replica. The plan (controller/plan.py) and
recovery read it and return actions. It is written by the executor (what actions do),
the desired-state changes (controller/desired.py), the RPC handlers for what members
report about themselves, the autoscaling step's target, and the loop's own flags
(serving HTTP, stopping).

Status is computed from the state without changing it. The one thing status needs from
the past, whether an application has ever been RUNNING (a failure after that is
UNHEALTHY, before it DEPLOY_FAILED), is recorded by the control loop
(`note_running_apps`), never by whoever asks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from surge.backends.base import Placement
from surge.config import DeploymentConfig, DeploymentSpec, HTTPOptions, gRPCOptions
from surge.controller.groups import Changes, HealthSchedule, ReplicaGroup
from surge.model import (
    AccessTokens,
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentId,
    DeploymentStatus,
    DeploymentStatusOverview,
    ModelRoutes,
    ReplicaInfo,
)
from surge.policy.lifecycle import ALIVE, ReplicaState, transition

__all__ = [
    "HEALTH_CHECK_FAILURE_THRESHOLD",
    "HEALTH_FAILED_MESSAGE",
    "AppRecord",
    "ControllerState",
    "DeploymentRecord",
    "NodeProxy",
    "Peer",
    "ProxyRecord",
    "ReplicaRecord",
]

# Consecutive failed health checks before a replica is replaced (Ray Serve's threshold).
HEALTH_CHECK_FAILURE_THRESHOLD = 3
# A deployment's status message after a running replica failed its health checks (Ray's).
HEALTH_FAILED_MESSAGE = ("A replica's health check failed. This deployment will be UNHEALTHY "
                         "until the replica recovers or a new deploy happens.")
START_BACKOFF_S = 0.5  # after a replica failed to start; doubles per failure in a row
START_BACKOFF_MAX_S = 30.0


class Peer(Protocol):
    """The controller's end of a control connection (transport.rpc.RpcPeer, or a fake)."""

    info: dict[str, Any]

    @property
    def is_closed(self) -> bool: ...

    async def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any: ...

    def push(self, topic: str, value: Any) -> None: ...

    def close(self) -> None: ...


@dataclass
class ReplicaRecord:
    replica_id: str
    deployment: DeploymentId
    version: int
    started_at: float
    state: ReplicaState = ReplicaState.STARTING
    pid: int = 0
    info: ReplicaInfo | None = None  # where it listens, once ready
    peer: Peer | None = None
    next_health_check: float = 0.0
    health_check_running: bool = False
    health_failures: int = 0
    # Its class defines check_health (or it did not say): checked by a call. Otherwise
    # its telemetry, heard at `heard_at`, stands for the check when recent enough
    # (policy.cadence.heard_lately).
    own_health_check: bool = True
    heard_at: float = -math.inf
    stop_deadline: float | None = None  # killed if still alive after this
    reconfiguring: bool = False  # a new user_config is on its way to it (UPDATING)
    spec_sent: bool = False  # it asked for its spec: the user's code ran (or runs) in it
    rank: int = -1  # its ReplicaContext.rank, given with its spec (-1: none yet)
    # The index it is counted in (set by ControllerState.add_replica), told of each move.
    group: ReplicaGroup | None = field(default=None, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        return (f"<Replica {self.replica_id} {self.state.value} v{self.version} "
                f"pid={self.pid}>")

    def move(self, new: ReplicaState) -> None:
        old = self.state
        self.state = transition(old, new)
        if self.group is not None:
            self.group.moved(self, old)

    def set_reconfiguring(self, on: bool) -> None:
        """A new user_config is on its way to it (on) or has arrived or failed (off)."""
        self.reconfiguring = on
        if self.group is not None:
            self.group.set_reconfiguring(self, on)

    @property
    def alive(self) -> bool:
        return self.state in ALIVE


@dataclass
class DeploymentRecord:
    id: DeploymentId
    spec: DeploymentSpec
    version: int
    code_version: str
    target: int
    sys_path: tuple[str, ...] = ()
    constructor_failures: int = 0
    last_error: str = ""
    deleting: bool = False
    startup_lead_s: float = 1.0  # measured: asking for a replica -> it serves (EWMA)
    standby_floor: int = 0  # from the autoscaling schedule in force now
    last_urgent_decision: float = float("-inf")
    startups_seen: int = 0
    # A replica of the current version has served: a failure then is UNHEALTHY, not a
    # failed deploy (or update).
    version_ran: bool = False
    # A running replica of the current version failed its health checks (this message):
    # UNHEALTHY until as many as its target run again, or a new deploy (as Ray).
    health_failed: str = ""
    start_not_before: float = float("-inf")  # monotonic: backoff after a failed start
    # Busy share of its node's CPU (all its replicas on the head node), else None; and
    # why that node counts as saturated now ("": it does not; policy/saturation.py).
    node_cpu: float | None = None
    node_saturated: str = ""

    def __repr__(self) -> str:
        return (f"<Deployment {self.id} v{self.version} target={self.target}"
                f"{' deleting' if self.deleting else ''}>")

    @property
    def config(self) -> DeploymentConfig:
        return self.spec.config

    @property
    def standby_wanted(self) -> int:
        scaling = self.config.autoscaling_config
        if scaling is None or self.deleting:
            return 0
        return max(scaling.standby_replicas, self.standby_floor)

    def observe_startup(self, seconds: float) -> None:
        self.startups_seen += 1
        weight = 1.0 if self.startups_seen == 1 else 0.3
        self.startup_lead_s += weight * (seconds - self.startup_lead_s)


@dataclass
class AppRecord:
    name: str
    route_prefix: str | None
    ingress: str
    deployments: tuple[str, ...]  # names of its current deployments
    deployed_at: float  # wall seconds
    auth: AccessTokens | None = None  # token digests its HTTP route requires
    source_config: Mapping[str, Any] | None = None  # its config entry, if deployed from one
    # The last config for it failed to build (import error, bad args): DEPLOY_FAILED with
    # this message, while what it had keeps serving. Cleared by the next deploy.
    build_error: str = ""
    model_routes: ModelRoutes | None = None  # published in its RouteTarget
    deleting: bool = False
    ever_running: bool = False  # set by the control loop: a later failure is UNHEALTHY

    def ids(self) -> list[DeploymentId]:
        return [DeploymentId(self.name, name) for name in self.deployments]


@dataclass
class ProxyRecord:
    proxy_id: str
    pid: int
    address: str  # host:port clients reach it at


@dataclass(frozen=True)
class NodeProxy:
    """A proxy the controller asked for on a node other than the head."""

    node_id: str
    node_ip: str
    port: int | None


@dataclass
class ControllerState:
    address: str  # the control address
    http: HTTPOptions
    proxy_count: int  # proxy workers on the head node
    head: Placement  # the node the controller (and the head's proxies) run on
    apps: dict[str, AppRecord] = field(default_factory=dict)
    deployments: dict[DeploymentId, DeploymentRecord] = field(default_factory=dict)
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    proxies: dict[str, ProxyRecord] = field(default_factory=dict)  # ready proxies
    proxy_address: str = ""  # host:port the head's proxy workers share, once bound
    proxy_error: str = ""  # why the first proxy could not serve
    serve_http: bool = False  # proxies wanted (set once the instance starts them)
    node_proxies: dict[str, NodeProxy] = field(default_factory=dict)  # started, not exited
    stopping_proxies: set[str] = field(default_factory=set)  # asked to stop, not yet gone
    # Proxies that keep exiting: (exits in a row, monotonic time before which none starts).
    proxy_backoff: dict[str, tuple[int, float]] = field(default_factory=dict)
    stopping: bool = False  # shutting down: start nothing
    daemon_pid: int = 0  # a detached instance's supervising daemon (gone last at shutdown)
    grpc: gRPCOptions = field(default_factory=gRPCOptions)  # what each proxy serves over gRPC
    groups: dict[DeploymentId, ReplicaGroup] = field(default_factory=dict)  # by deployment
    # Replicas started that have not asked for their spec yet: their control connection is
    # still on its way in (plan.start_room bounds how many, so a herd comes in waves).
    connecting: set[str] = field(default_factory=set)
    health: HealthSchedule = field(default_factory=HealthSchedule)
    changes: Changes = field(default_factory=Changes)  # replicas that came, went, moved
    node_cpu: float | None = None  # busy share of the head node's CPU; None: not read

    def __repr__(self) -> str:
        return (f"<ControllerState apps={len(self.apps)} deployments={len(self.deployments)} "
                f"replicas={len(self.replicas)} proxies={len(self.proxies)}>")

    # -- queries --------------------------------------------------------------------------

    @staticmethod
    def start_failed(record: DeploymentRecord, error: str, now: float) -> None:
        """A replica of its current version failed to start: count it, and wait before
        the next start (0.5 s, doubling up to 30 s), so a constructor that keeps failing
        is not restarted every tick."""
        record.constructor_failures += 1
        record.last_error = error
        record.start_not_before = now + min(START_BACKOFF_MAX_S, START_BACKOFF_S * 2 ** min(
            record.constructor_failures - 1, 16))

    def proxy_node(self, proxy_id: str) -> str:
        """The node a proxy runs on: a node proxy's, else the head's."""
        node = self.node_proxies.get(proxy_id)
        return node.node_id if node is not None else self.head.node_id

    def group(self, did: DeploymentId) -> ReplicaGroup:
        """The deployment's replicas, indexed (an empty group for one without any)."""
        group = self.groups.get(did)
        if group is None:
            group = self.groups[did] = ReplicaGroup(did, self.health, self.changes)
        return group

    def replicas_of(self, did: DeploymentId) -> list[ReplicaRecord]:
        group = self.groups.get(did)
        return list(group.members.values()) if group is not None else []

    def by_deployment(self) -> dict[DeploymentId, list[ReplicaRecord]]:
        """Every deployment's replicas (a copy: for status pages, not for the loop)."""
        groups: dict[DeploymentId, list[ReplicaRecord]] = {did: [] for did in self.deployments}
        for did, group in self.groups.items():
            if group.members:
                groups[did] = list(group.members.values())
        return groups

    def running(self, did: DeploymentId) -> list[ReplicaRecord]:
        return list(self.group(did).by_state[ReplicaState.RUNNING].values())

    def count_running_current(self, did: DeploymentId) -> int:
        """RUNNING replicas of the deployment's current version."""
        return self.group(did).count(ReplicaState.RUNNING, self.deployments[did].version)

    def failed(self, did: DeploymentId) -> bool:
        """Its replicas failed to start max_constructor_retry_count times in a row, and
        either its current version never ran (the deploy or the update failed, as Ray
        stops it: the old version's replicas keep serving) or none runs now."""
        record = self.deployments[did]
        if record.constructor_failures < record.config.max_constructor_retry_count:
            return False
        if not record.version_ran:
            return True
        return not self.group(did).count(ReplicaState.RUNNING)

    # -- status (no side effects) ------------------------------------------------------

    def deployment_status(self, did: DeploymentId) -> DeploymentStatusOverview:
        record = self.deployments[did]
        group = self.group(did)
        counts = {state.value: len(members) for state, members in group.by_state.items()
                  if members}
        current = group.count(ReplicaState.RUNNING, record.version)
        outdated = group.alive_outdated(record.version) or group.alive_reconfiguring()
        if self.failed(did):  # as Ray: DEPLOY_FAILED until its version ever ran
            status = (DeploymentStatus.UNHEALTHY if record.version_ran
                      else DeploymentStatus.DEPLOY_FAILED)
            message = record.last_error
        elif record.health_failed:
            status, message = DeploymentStatus.UNHEALTHY, record.health_failed
        elif current == record.target and not outdated:
            status, message = DeploymentStatus.HEALTHY, ""
        elif current > record.target:
            status, message = DeploymentStatus.DOWNSCALING, ""
        else:
            status = DeploymentStatus.UPDATING
            message = f"{current} of {record.target} replicas running"
            if record.constructor_failures:  # as Ray: the error while it retries
                message += (f"; a replica failed to start {record.constructor_failures} "
                            "time(s) in a row (its constructor or first health check), "
                            f"retrying. Error:\n{record.last_error}")
        if record.node_saturated and not self.failed(did):
            saturated = f"node CPU saturated, not adding replicas: {record.node_saturated}"
            message = f"{message}; {saturated}" if message else saturated
        return DeploymentStatusOverview(status=status, replica_states=counts, message=message,
                                        target_replicas=record.target)

    def app_status(self, name: str) -> ApplicationStatusOverview:
        """The application's status."""
        app = self.apps[name]
        present = [did for did in app.ids() if did in self.deployments]
        deployments = {did.name: self.deployment_status(did) for did in present}
        states = {d.status for d in deployments.values()}
        failed = [self.deployments[did] for did in present if self.failed(did)]
        if app.deleting:
            status, message = ApplicationStatus.DELETING, ""
        elif app.build_error:
            status, message = ApplicationStatus.DEPLOY_FAILED, app.build_error
        elif any(not d.version_ran for d in failed):  # the deploy or the update failed
            status = ApplicationStatus.DEPLOY_FAILED
            message = "; ".join(f"deployment {d.id.name!r} failed to start:\n{d.last_error}"
                                for d in failed)
        elif failed or states & {DeploymentStatus.UNHEALTHY, DeploymentStatus.DEPLOY_FAILED}:
            unhealthy = [name for name, d in deployments.items()
                         if d.status is DeploymentStatus.UNHEALTHY]
            status = ApplicationStatus.UNHEALTHY
            message = ("; ".join(d.last_error for d in failed)
                       or f"The deployments {unhealthy} are UNHEALTHY.")
        elif states <= {DeploymentStatus.HEALTHY} or (
                app.ever_running and DeploymentStatus.UPDATING not in states):
            status, message = ApplicationStatus.RUNNING, ""
        else:
            status, message = ApplicationStatus.DEPLOYING, ""
        return ApplicationStatusOverview(status=status, message=message,
                                         route_prefix=app.route_prefix, deployments=deployments,
                                         last_deployed_time_s=app.deployed_at)

    def note_running_apps(self) -> None:
        """Remember which applications have reached RUNNING (the control loop calls it)."""
        for name in [name for name, app in self.apps.items() if not app.ever_running]:
            if self.app_status(name).status is ApplicationStatus.RUNNING:
                self.apps[name].ever_running = True

    # -- changes the executor and the RPC handlers make ----------------------------------

    def add_replica(self, replica: ReplicaRecord) -> None:
        """A new replica (the executor's start, an adoption); with `next_health_check`
        set, a serving one is scheduled for it."""
        self.replicas[replica.replica_id] = replica
        replica.group = self.group(replica.deployment)
        replica.group.add(replica)
        if replica.state is ReplicaState.STARTING and not replica.spec_sent:
            self.connecting.add(replica.replica_id)

    def spec_sent(self, replica: ReplicaRecord) -> None:
        """The replica asked for its spec: it is in (connected, proved, said hello). It gets
        its rank: the lowest its deployment's other replicas do not hold."""
        replica.spec_sent = True
        self.connecting.discard(replica.replica_id)
        if replica.rank < 0:
            taken = {r.rank for r in self.replicas_of(replica.deployment)}
            replica.rank = next(rank for rank in range(len(taken) + 1) if rank not in taken)

    def remove_replica(self, replica_id: str) -> ReplicaRecord | None:
        replica = self.replicas.pop(replica_id, None)
        self.connecting.discard(replica_id)
        if replica is not None and replica.group is not None:
            replica.group.remove(replica)
            if not replica.group.members and replica.deployment not in self.deployments:
                self.groups.pop(replica.deployment, None)
        return replica

    def forget_deployment(self, did: DeploymentId) -> None:
        """A deleted deployment whose last replica is gone."""
        del self.deployments[did]
        group = self.groups.get(did)
        if group is not None and not group.members:
            del self.groups[did]
