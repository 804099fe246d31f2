"""`surge.serve.config`, as `ray.serve.config`."""

from surge.config import AutoscalingConfig, DeploymentConfig, HTTPOptions, ProxyLocation

__all__ = ["AutoscalingConfig", "DeploymentConfig", "HTTPOptions", "ProxyLocation"]
