"""`surge.serve.handle`, as `ray.serve.handle`."""

from surge.router.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator"]
