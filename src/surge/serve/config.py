"""`surge.serve.config`, as `ray.serve.config`."""

from surge.config import (
    AuthConfig,
    AutoscalingConfig,
    AutoscalingPolicy,
    BackpressureConfig,
    DeploymentConfig,
    HTTPOptions,
    ProxyLocation,
    RequestRouterConfig,
    gRPCOptions,
)

__all__ = ["AuthConfig", "AutoscalingConfig", "AutoscalingPolicy", "BackpressureConfig",
           "DeploymentConfig", "HTTPOptions", "ProxyLocation", "RequestRouterConfig",
           "gRPCOptions"]
