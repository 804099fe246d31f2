"""`surge.serve.exceptions`, as `ray.serve.exceptions`."""

from surge.errors import (
    BackPressureError,
    ConfigError,
    ControlAuthError,
    ControllerUnavailableError,
    DeployFailedError,
    DeploymentUnavailableError,
    GetTimeoutError,
    RayServeException,
    ReplicaDiedError,
    RequestCancelledError,
    UserCodeError,
)

__all__ = [
    "BackPressureError",
    "ConfigError",
    "ControlAuthError",
    "ControllerUnavailableError",
    "DeployFailedError",
    "DeploymentUnavailableError",
    "GetTimeoutError",
    "RayServeException",
    "ReplicaDiedError",
    "RequestCancelledError",
    "UserCodeError",
]
