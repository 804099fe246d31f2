"""`surge.serve.api`, as `ray.serve.api`: the module Ray Serve defines `serve.*` in, which
some applications import from (`from ray.serve.api import get_replica_context`)."""

from typing import TYPE_CHECKING

from surge.api.lazy_serve import serve_attribute as __getattr__  # noqa: F401 (PEP 562)
from surge.serve import (
    _run,
    delete,
    deployment,
    get_app_handle,
    get_deployment_handle,
    get_replica_context,
    ingress,
    run,
    shutdown,
    start,
    status,
)

if TYPE_CHECKING:
    from surge.replica.multiplex import get_multiplexed_model_id, multiplexed

__all__ = ["_run", "delete", "deployment", "get_app_handle", "get_deployment_handle",
           "get_multiplexed_model_id", "get_replica_context", "ingress", "multiplexed", "run",
           "shutdown", "start", "status"]
