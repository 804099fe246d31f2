"""`surge.serve.handle`, as `ray.serve.handle`."""

from surge.router.handle import DeploymentHandle
from surge.router.responses import DeploymentResponse, DeploymentResponseGenerator
from surge.router.selection import ReplicaSelection

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator",
           "ReplicaSelection"]
