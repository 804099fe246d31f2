"""The backend protocol: start and stop surge processes, and say which ones exited.

The controller decides; a backend only places processes and reports their exits.
Each file in this package implements the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from surge.config import ReplicaResources
from surge.errors import RayServeException
from surge.model import DeploymentId

__all__ = ["Backend", "Exit", "PlacementError", "ReplicaLaunch"]


class PlacementError(RayServeException):
    """The backend cannot place a replica now (e.g. not enough GPUs)."""


@dataclass(frozen=True)
class ReplicaLaunch:
    replica_id: str
    deployment: DeploymentId
    resources: ReplicaResources
    sys_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exit:
    process_id: str
    returncode: int | None


class Backend(Protocol):
    name: str

    def start_replica(self, launch: ReplicaLaunch) -> int:
        """Start a replica process; returns its pid. Raises PlacementError if it can't."""
        ...

    def start_proxy(self, proxy_id: str) -> int: ...

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0) -> None:
        """Take over a live process a previous controller started (after a restart)."""
        ...

    def terminate(self, process_id: str) -> None:
        """Ask the process to stop (SIGTERM: drain, then exit)."""
        ...

    def kill(self, process_id: str) -> None: ...

    def poll_exits(self) -> list[Exit]:
        """Processes that exited since the last call."""
        ...

    def alive(self) -> list[str]: ...

    def close(self) -> None:
        """Release what the backend holds (after every process exited)."""
        ...
