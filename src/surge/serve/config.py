"""`surge.serve.config`, as `ray.serve.config`."""

from surge.config import (
    AuthConfig,
    AutoscalingConfig,
    BackpressureConfig,
    DeploymentConfig,
    HTTPOptions,
    ProxyLocation,
)

__all__ = ["AuthConfig", "AutoscalingConfig", "BackpressureConfig", "DeploymentConfig",
           "HTTPOptions", "ProxyLocation"]
