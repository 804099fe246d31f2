"""The controller's records of applications, deployments and replicas, and their status."""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.config import DeploymentConfig, DeploymentSpec
from surge.model import (
    AccessTokens,
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentId,
    DeploymentStatus,
    DeploymentStatusOverview,
    ReplicaInfo,
)
from surge.policy.lifecycle import ALIVE, ReplicaState, transition
from surge.transport.rpc import RpcPeer

__all__ = ["AppRecord", "DeploymentRecord", "ReplicaRecord"]

# Constructor failures in a row, with no replica running, before a deploy is failed.
# Ray retries 20 times; each retry here costs a process start, so fail fast and say why.
MAX_CONSTRUCTOR_FAILURES = 3
# Consecutive failed health checks before a replica is replaced (Ray Serve's threshold).
HEALTH_CHECK_FAILURE_THRESHOLD = 3


@dataclass
class ReplicaRecord:
    replica_id: str
    deployment: DeploymentId
    version: int
    started_at: float
    state: ReplicaState = ReplicaState.STARTING
    pid: int = 0
    info: ReplicaInfo | None = None
    peer: RpcPeer | None = None
    next_health_check: float = 0.0
    health_check_running: bool = False
    health_failures: int = 0
    stop_deadline: float | None = None

    def move(self, new: ReplicaState) -> None:
        self.state = transition(self.state, new)

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
    replicas: dict[str, ReplicaRecord] = field(default_factory=dict)
    constructor_failures: int = 0
    last_error: str = ""
    deleting: bool = False
    startup_lead_s: float = 1.0  # measured: asking for a replica -> it serves (EWMA)
    standby_floor: int = 0  # from the autoscaling schedule in force now
    last_urgent_decision: float = 0.0
    startups_seen: int = 0

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

    @property
    def failed(self) -> bool:
        return self.constructor_failures >= MAX_CONSTRUCTOR_FAILURES and not self.running

    @property
    def running_current(self) -> list[ReplicaRecord]:
        """RUNNING replicas of the deployment's current version."""
        return [r for r in self.running if r.version == self.version]

    @property
    def running(self) -> list[ReplicaRecord]:
        return [r for r in self.replicas.values() if r.state is ReplicaState.RUNNING]

    def status(self) -> DeploymentStatusOverview:
        counts: dict[str, int] = {}
        for replica in self.replicas.values():
            counts[replica.state.value] = counts.get(replica.state.value, 0) + 1
        current = self.running_current
        outdated = [r for r in self.replicas.values() if r.version != self.version and r.alive]
        if self.failed:
            status, message = DeploymentStatus.UNHEALTHY, self.last_error
        elif len(current) == self.target and not outdated:
            status, message = DeploymentStatus.HEALTHY, ""
        elif len(current) > self.target:
            status, message = DeploymentStatus.DOWNSCALING, ""
        else:
            status = DeploymentStatus.UPDATING
            message = f"{len(current)} of {self.target} replicas running"
        return DeploymentStatusOverview(status=status, replica_states=counts, message=message,
                                        target_replicas=self.target)


@dataclass
class AppRecord:
    name: str
    route_prefix: str | None
    ingress: str
    deployments: dict[str, DeploymentRecord]
    deployed_at: float
    was_running: bool = False
    auth: AccessTokens | None = None  # token digests its HTTP route requires

    def status(self) -> ApplicationStatusOverview:
        deployments = {name: d.status() for name, d in self.deployments.items()}
        states = {d.status for d in deployments.values()}
        failed = [d for d in self.deployments.values() if d.failed]
        if failed and not self.was_running:
            status = ApplicationStatus.DEPLOY_FAILED
            message = "; ".join(f"deployment {d.id.name!r} failed to start:\n{d.last_error}"
                                for d in failed)
        elif failed or DeploymentStatus.UNHEALTHY in states:
            status, message = ApplicationStatus.UNHEALTHY, "; ".join(d.last_error for d in failed)
        elif states <= {DeploymentStatus.HEALTHY}:
            status, message = ApplicationStatus.RUNNING, ""
            self.was_running = True
        elif self.was_running and DeploymentStatus.UPDATING not in states:
            status, message = ApplicationStatus.RUNNING, ""
        else:
            status, message = ApplicationStatus.DEPLOYING, ""
        return ApplicationStatusOverview(status=status, message=message,
                                         route_prefix=self.route_prefix, deployments=deployments,
                                         last_deployed_time_s=self.deployed_at)
