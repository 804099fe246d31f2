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
    WeightBudgetError,
    WeightSourceError,
    WeightStoreError,
    WeightStoreFullError,
    WeightStoreUnavailableError,
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
    "WeightBudgetError",
    "WeightSourceError",
    "WeightStoreError",
    "WeightStoreFullError",
    "WeightStoreUnavailableError",
]
