"""`from surge import serve`: Ray Serve's API, spelled as Ray spells it.

This package only re-exports; the implementations live in surge.api, surge.router,
surge.replica and surge.config. `batch`, the multiplexing pair and `metrics` load on
first use (PEP 562): a driver that uses none of them does not import them.
"""

from typing import TYPE_CHECKING

from surge.api.control import (
    _run as _run,
)
from surge.api.control import (
    delete,
    get_app_handle,
    get_deployment_handle,
    run,
    shutdown,
    start,
    status,
)
from surge.api.deployment import Application, Deployment, deployment
from surge.api.lazy_serve import serve_attribute as __getattr__  # noqa: F401 (PEP 562)
from surge.api.lazy_serve import serve_names as __dir__  # noqa: F401
from surge.config import AutoscalingConfig, HTTPOptions
from surge.replica.context import get_replica_context
from surge.replica.ingress import ingress
from surge.router.handle import DeploymentHandle
from surge.router.responses import DeploymentResponse, DeploymentResponseGenerator
from surge.serve import config, context, exceptions, handle, schema

if TYPE_CHECKING:
    from surge.replica.batching import batch
    from surge.replica.multiplex import get_multiplexed_model_id, multiplexed
    from surge.serve import metrics

__all__ = [
    "Application",
    "AutoscalingConfig",
    "Deployment",
    "DeploymentHandle",
    "DeploymentResponse",
    "DeploymentResponseGenerator",
    "HTTPOptions",
    "batch",
    "config",
    "context",
    "delete",
    "deployment",
    "exceptions",
    "get_app_handle",
    "get_deployment_handle",
    "get_multiplexed_model_id",
    "get_replica_context",
    "handle",
    "ingress",
    "metrics",
    "multiplexed",
    "run",
    "schema",
    "shutdown",
    "start",
    "status",
]

