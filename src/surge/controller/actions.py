"""What the controller does, as values: the plan returns them, the executor performs them.

Each action names its subject and, where a person may want to know, why. The plan
(controller/plan.py) and recovery (controller/recovery.py) compute them from the state;
`Executor.apply` (controller/executor.py) is the only code that turns them into process
starts, signals, RPCs and pushes. Tests assert on lists of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from surge.controller.state import Peer
from surge.model import DeploymentId, ReplicaInfo
from surge.policy.reconcile import ActivateReplica, StopReplica

__all__ = [
    "Action",
    "ActivateReplica",
    "AdoptReplica",
    "CheckHealth",
    "DrainStranger",
    "EndRecovery",
    "FailReplica",
    "ForgetDeployment",
    "KillProcess",
    "ProxyExited",
    "ProxyReady",
    "Reconfigure",
    "ReplicaExited",
    "StartProxy",
    "StartReplicas",
    "StopProxy",
    "StopReplica",
]


@dataclass(frozen=True)
class StartReplicas:
    deployment: DeploymentId
    count: int
    reason: str
    deferred: int = 0  # more wanted, held for a later wave (plan.start_room); count may be 0


@dataclass(frozen=True)
class FailReplica:
    """Take a replica out of service now and kill its process (it is replaced)."""

    replica_id: str
    reason: str
    # It failed its health checks: a running one of the current version makes its
    # deployment UNHEALTHY until the deployment runs again (Ray's HEALTH_CHECK_FAILED).
    health: bool = False


@dataclass(frozen=True)
class KillProcess:
    """SIGKILL a process (a replica that overstayed its drain, a member nobody adopted)."""

    process_id: str
    reason: str
    pid: int = 0  # set when the backend must first adopt the process to signal it


@dataclass(frozen=True)
class CheckHealth:
    replica_id: str


@dataclass(frozen=True)
class ReplicaExited:
    replica_id: str
    returncode: int | None
    before_ready: bool  # it never became ready: a constructor failure


@dataclass(frozen=True)
class ProxyExited:
    proxy_id: str
    returncode: int | None


@dataclass(frozen=True)
class StartProxy:
    proxy_id: str
    node_id: str
    node_ip: str
    port: int | None  # None: http_options.port
    reason: str


@dataclass(frozen=True)
class StopProxy:
    proxy_id: str
    reason: str


@dataclass(frozen=True)
class Reconfigure:
    """Send a running replica its new user_config."""

    replica_id: str
    user_config: Any


@dataclass(frozen=True)
class ForgetDeployment:
    """A deleted deployment whose last replica is gone."""

    deployment: DeploymentId


@dataclass(frozen=True)
class AdoptReplica:
    """A replica a previous controller started re-registered: take it over as RUNNING."""

    info: ReplicaInfo
    version: int
    peer: Peer  # its control connection
    gpus: tuple[str, ...] = ()
    own_health_check: bool = True  # its class defines check_health (ReplicaRecord)
    rank: int = -1  # the ReplicaContext.rank it was given (-1: it did not say)


@dataclass(frozen=True)
class ProxyReady:
    """A proxy serves (or, after a restart, re-attached): record it, and have the backend
    watch it if another controller started it."""

    proxy_id: str
    pid: int
    address: str
    node_id: str
    reattached: bool = False  # it served for a previous controller


@dataclass(frozen=True)
class DrainStranger:
    """A member re-registered for a deployment that is gone: let it finish and leave
    (killed if it does not drain within the executor's STRANGER_DRAIN_S)."""

    replica_id: str
    pid: int
    peer: Peer
    reason: str


@dataclass(frozen=True)
class EndRecovery:
    """Re-attachment is over: targets start from what was adopted; pushes resume."""

    targets: tuple[tuple[DeploymentId, int], ...]


Action = (StartReplicas | ActivateReplica | StopReplica | FailReplica | KillProcess
          | CheckHealth | ReplicaExited | ProxyExited | StartProxy | StopProxy | Reconfigure
          | ForgetDeployment | AdoptReplica | ProxyReady | DrainStranger | EndRecovery)
