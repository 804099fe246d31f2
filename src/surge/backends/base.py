"""The backend protocol: place surge processes, report where they run and which exited.

The controller decides (controller/plan.py); a backend only carries out starts and
signals, and reports membership (`placements`, `alive`) and exits. What differs between
backends is said by attributes, never by their names: `head` (the node the controller
runs on) and `deaths_visible_at_once` (a member that died is gone from `alive` at once on
one machine; on a cluster a lost node is noticed only after a health-check period).
Each file in this package implements the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from surge.config import ReplicaResources
from surge.errors import RayServeException
from surge.launch import LOCAL_NODE
from surge.model import DeploymentId

__all__ = ["LOCAL_PLACEMENT", "Backend", "Exit", "Placement", "PlacementError", "ProxyLaunch",
           "ReplicaLaunch"]


class PlacementError(RayServeException):
    """The backend cannot place a replica now (e.g. not enough GPUs)."""


@dataclass(frozen=True)
class ReplicaLaunch:
    replica_id: str
    deployment: DeploymentId
    resources: ReplicaResources
    sys_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProxyLaunch:
    proxy_id: str
    node_id: str  # the node it must run on
    port: int | None = None  # its own HTTP port (nodes sharing an IP); None: the configured


@dataclass(frozen=True)
class Placement:
    """Where a process runs."""

    node_id: str
    node_ip: str


LOCAL_PLACEMENT = Placement(LOCAL_NODE, "127.0.0.1")  # everything on a one-machine backend


@dataclass(frozen=True)
class Exit:
    process_id: str
    returncode: int | None


class Backend(Protocol):
    name: str  # for logs and status only
    head: Placement
    deaths_visible_at_once: bool

    def start_replica(self, launch: ReplicaLaunch) -> int:
        """Start a replica process; returns its pid (0 if not known yet). Raises
        PlacementError if it can't."""
        ...

    def start_proxy(self, launch: ProxyLaunch) -> int: ...

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0, resources: ReplicaResources | None = None) -> None:
        """Take over a live process a previous controller started (after a restart);
        `resources`: a replica's (its deployment's), None for any other process."""
        ...

    def terminate(self, process_id: str) -> None:
        """Ask the process to stop (SIGTERM: drain, then exit)."""
        ...

    def kill(self, process_id: str) -> None: ...

    def poll_exits(self) -> list[Exit]:
        """Processes that exited since the last call."""
        ...

    def alive(self) -> list[str]:
        """Processes started or adopted that have not exited (starting ones included)."""
        ...

    def placements(self) -> Mapping[str, Placement]:
        """Where each live process runs, once known (empty on a one-machine backend)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (after every process exited)."""
        ...
