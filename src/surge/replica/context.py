"""What `serve.get_replica_context()` returns inside a replica."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from surge.errors import RayServeException
from surge.launch import LOCAL_NODE

__all__ = ["ReplicaContext", "ReplicaID", "get_replica_context", "set_replica_context"]


@dataclass(frozen=True)
class ReplicaID:
    unique_id: str
    deployment_name: str
    app_name: str

    def to_full_id_str(self) -> str:
        return f"{self.app_name}#{self.deployment_name}#{self.unique_id}"


@dataclass(frozen=True)
class ReplicaContext:
    replica_id: ReplicaID
    servable_object: Any
    node_id: str = LOCAL_NODE  # surge: the node it runs on (a Ray node id on the ray backend)

    @property
    def app_name(self) -> str:
        return self.replica_id.app_name

    @property
    def deployment(self) -> str:
        return self.replica_id.deployment_name

    @property
    def replica_tag(self) -> str:
        return self.replica_id.unique_id


_context: ReplicaContext | None = None


def set_replica_context(context: ReplicaContext | None) -> None:
    global _context
    _context = context


def get_replica_context() -> ReplicaContext:
    if _context is None:
        raise RayServeException("get_replica_context() may only be called from within a "
                                "deployment replica")
    return _context
