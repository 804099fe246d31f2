"""Frozen, validated configs with Ray Serve's field names and defaults.

Every default is a named constant with the reason it has that value (defaults.py).
Configs are built from keyword arguments or from dicts (YAML); unknown keys are rejected
with a suggestion, and every error names the field and what to do. One module per
concept: http.py (HTTPOptions, proxy locations), autoscaling.py (AutoscalingConfig,
schedules), deployment.py (DeploymentConfig and its parts, DeploymentSpec), app.py
(AppSpec, AuthConfig); schema.py is the one mechanism they (and every other
config-like input: scenarios, pulse options, LLM configs) check their input with.
"""

from surge.config.app import AppSpec, AuthConfig, route_prefix_problem
from surge.config.autoscaling import (
    AutoscalingConfig,
    AutoscalingPolicy,
    Objectives,
    ScheduleWindow,
    parse_objectives,
    parse_schedule,
)
from surge.config.defaults import (
    AUTO_MAX_REPLICAS,
    DEFAULT_CONTROL_PORT,
    DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S,
    DEFAULT_HEALTH_CHECK_PERIOD_S,
    DEFAULT_HEALTH_CHECK_TIMEOUT_S,
    DEFAULT_HTTP_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT,
    DEFAULT_MAX_ONGOING_REQUESTS,
    DEFAULT_MAX_QUEUE_WAIT_S,
    DEFAULT_MAX_QUEUED_REQUESTS,
    QUEUE_SAFETY_LIMIT,
)
from surge.config.deployment import (
    RAY_ACTOR_OPTION_KEYS_ACCEPTED,
    RAY_ACTOR_OPTION_KEYS_IMPLEMENTED,
    BackpressureConfig,
    DeploymentConfig,
    DeploymentSpec,
    ReplicaResources,
    RequestRouterConfig,
    build_deployment_config,
    runtime_env_uploads,
)
from surge.config.http import (
    DEFAULT_GRPC_PORT,
    PROXY_LOCATIONS,
    HTTPOptions,
    ProxyLocation,
    default_proxy_workers,
    gRPCOptions,
)
from surge.config.schema import from_mapping, unreadable

# Ray Serve's classes that surge provides only so that code using them loads: where Ray
# takes one surge accepts it with a warning and does not use it; and the fields of the
# classes surge uses of which it uses only some. docs/ray-compat.md
# (scripts/ray_compat.py) reads both.
RAY_CLASSES_ACCEPTED: tuple[type, ...] = ()
RAY_FIELDS_ACCEPTED: dict[type, tuple[str, ...]] = {
    RequestRouterConfig: ("request_router_class", "request_router_kwargs",
                          "initial_backoff_s", "backoff_multiplier", "max_backoff_s"),
}

__all__ = [
    "AUTO_MAX_REPLICAS",
    "DEFAULT_CONTROL_PORT",
    "DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HEALTH_CHECK_PERIOD_S",
    "DEFAULT_HEALTH_CHECK_TIMEOUT_S",
    "DEFAULT_HTTP_HOST",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT",
    "DEFAULT_MAX_ONGOING_REQUESTS",
    "DEFAULT_MAX_QUEUED_REQUESTS",
    "DEFAULT_MAX_QUEUE_WAIT_S",
    "PROXY_LOCATIONS",
    "QUEUE_SAFETY_LIMIT",
    "RAY_ACTOR_OPTION_KEYS_ACCEPTED",
    "RAY_ACTOR_OPTION_KEYS_IMPLEMENTED",
    "RAY_CLASSES_ACCEPTED",
    "AppSpec",
    "AuthConfig",
    "AutoscalingConfig",
    "AutoscalingPolicy",
    "BackpressureConfig",
    "DeploymentConfig",
    "DeploymentSpec",
    "HTTPOptions",
    "Objectives",
    "ProxyLocation",
    "ReplicaResources",
    "RequestRouterConfig",
    "ScheduleWindow",
    "build_deployment_config",
    "default_proxy_workers",
    "from_mapping",
    "gRPCOptions",
    "parse_objectives",
    "parse_schedule",
    "route_prefix_problem",
    "runtime_env_uploads",
    "unreadable",
]
