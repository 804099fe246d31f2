"""What a replica knows about itself and about the request it is serving.

`serve.get_replica_context()` returns the replica's `ReplicaContext`; inside a request,
`serve.context._get_serve_request_context()` returns its `RequestContext` (Ray's
`_RequestContext`: route, request id, application, multiplexed model id, ...), which the
replica's frame server sets for each request's task. Outside a request it is empty.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from surge.errors import RayServeException
from surge.model import LOCAL_NODE

__all__ = ["ReplicaContext", "ReplicaID", "ReplicaRank", "RequestContext",
           "deployment_objectives", "get_replica_context", "get_request_context",
           "replica_context_or_none", "request_context_var", "set_replica_context"]


@dataclass(frozen=True)
class ReplicaID:
    unique_id: str
    deployment_name: str
    app_name: str

    def to_full_id_str(self) -> str:
        return f"{self.app_name}#{self.deployment_name}#{self.unique_id}"


@dataclass(frozen=True)
class ReplicaRank:
    """A replica's place among its deployment's replicas, as Ray's: `rank` is unique
    among the live replicas (0, 1, ...; a stopped replica's is given to the next one).
    surge counts ranks across its nodes as on one: `node_rank` 0, `local_rank` = `rank`."""

    rank: int
    node_rank: int = 0
    local_rank: int = 0


@dataclass(frozen=True)
class ReplicaContext:
    replica_id: ReplicaID
    servable_object: Any
    node_id: str = LOCAL_NODE  # surge: the node it runs on (a Ray node id on the ray backend)
    rank: ReplicaRank | None = None  # None only while the constructor has not been given one
    world_size: int = 1  # the deployment's target number of replicas when this one started

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
_objectives: Mapping[str, Any] | None = None


def set_replica_context(context: ReplicaContext | None,
                        objectives: Mapping[str, Any] | None = None) -> None:
    """(`objectives`: surge's, the deployment's autoscaling objectives from its spec.)"""
    global _context, _objectives
    _context, _objectives = context, objectives


def deployment_objectives() -> Mapping[str, Any] | None:
    """surge: this replica's deployment's `autoscaling_config.objectives` as its controller
    sizes for them (None: it states none, or this is no replica): what an LLM replica
    sheds against, wherever they were set (the LLMConfig, a config file's override,
    `override_serve_options`)."""
    return _objectives


def replica_context_or_none() -> ReplicaContext | None:
    return _context


def get_replica_context() -> ReplicaContext:
    if _context is None:
        raise RayServeException("get_replica_context() may only be called from within a "
                                "deployment replica")
    return _context


class RequestContext:
    """Ray Serve's `_RequestContext`, with its field names (read-only by convention)."""

    __slots__ = ("_client", "app_name", "cancel_on_parent_request_cancel", "grpc_context",
                 "is_http_request", "multiplexed_model_id", "request_id", "route",
                 "session_id")

    def __init__(self, route: str = "", request_id: str = "", app_name: str = "",
                 multiplexed_model_id: str = "", *, is_http_request: bool = False,
                 client: str = "", session_id: str = "") -> None:
        self.route = route
        self.request_id = request_id
        self.app_name = app_name
        self.multiplexed_model_id = multiplexed_model_id
        self.session_id = session_id
        self.grpc_context: Any = None
        self.is_http_request = is_http_request
        self.cancel_on_parent_request_cancel = False
        self._client = client

    def __repr__(self) -> str:
        return (f"RequestContext(route={self.route!r}, request_id={self.request_id!r}, "
                f"app_name={self.app_name!r}, "
                f"multiplexed_model_id={self.multiplexed_model_id!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestContext) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


_EMPTY = RequestContext()
request_context_var: contextvars.ContextVar[RequestContext] = contextvars.ContextVar(
    "surge_request_context", default=_EMPTY)


def get_request_context() -> RequestContext:
    return request_context_var.get()
