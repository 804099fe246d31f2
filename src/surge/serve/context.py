"""`surge.serve.context`, as `ray.serve.context`: the replica's and the request's context."""

from surge.replica.context import ReplicaContext
from surge.replica.context import RequestContext as _RequestContext
from surge.replica.context import get_request_context as _get_serve_request_context
from surge.replica.context import replica_context_or_none as _get_internal_replica_context

__all__ = ["ReplicaContext", "_RequestContext", "_get_internal_replica_context",
           "_get_serve_request_context"]

