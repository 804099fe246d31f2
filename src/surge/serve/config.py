"""`surge.serve.config`, as `ray.serve.config`."""

from surge.config import (
    AuthConfig,
    AutoscalingConfig,
    DeploymentConfig,
    HTTPOptions,
    ProxyLocation,
)

__all__ = ["AuthConfig", "AutoscalingConfig", "DeploymentConfig", "HTTPOptions",
           "ProxyLocation"]
