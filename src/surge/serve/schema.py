"""`surge.serve.schema`, as `ray.serve.schema`: the status types and the logging config."""

from surge.model import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatus,
    DeploymentStatusOverview,
    ProxyStatus,
    ServeStatus,
)
from surge.observability.config import LoggingConfig
from surge.replica.context import ReplicaRank

__all__ = ["ApplicationStatus", "ApplicationStatusOverview", "DeploymentStatus",
           "DeploymentStatusOverview", "LoggingConfig", "ProxyStatus", "ReplicaRank", "ServeStatus"]
