"""The instance as Ray Serve's REST API describes it: `ServeInstanceDetails`, as JSON.

What `GET /api/serve/applications/` answers (controller/rest.py), in the shape of Ray
Serve 2.60's `ray.serve.schema.ServeInstanceDetails`, so that Ray's own `serve status`,
`serve config` and KubeRay's RayService controller read it: applications with their
status, message, route, last deployed config; deployments with status, trigger, config,
target and replicas; proxies; HTTP options. Computed from the controller's state, read
only. surge's own states are mapped onto Ray's names (a standby replica is STARTING to
Ray: started, not yet taking traffic; a draining one is STOPPING).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from surge.clock import Clock
from surge.config import AutoscalingConfig, DeploymentConfig
from surge.controller.state import ControllerState, ReplicaRecord
from surge.model import ApplicationStatus, DeploymentId, DeploymentStatus
from surge.policy.lifecycle import ReplicaState

__all__ = ["RAY_VERSION", "empty_details", "instance_details"]

RAY_VERSION = "2.60.0"  # the Ray Serve whose API and schema surge answers with

_REPLICA_STATES = {ReplicaState.STARTING: "STARTING", ReplicaState.STANDBY: "STARTING",
                   ReplicaState.RUNNING: "RUNNING", ReplicaState.DRAINING: "STOPPING",
                   ReplicaState.STOPPED: "STOPPED", ReplicaState.FAILED: "STOPPING"}
_TRIGGERS = {DeploymentStatus.HEALTHY: "CONFIG_UPDATE_COMPLETED",
             DeploymentStatus.UPDATING: "CONFIG_UPDATE_STARTED",
             DeploymentStatus.UPSCALING: "AUTOSCALING",
             DeploymentStatus.DOWNSCALING: "AUTOSCALING",
             DeploymentStatus.UNHEALTHY: "HEALTH_CHECK_FAILED",
             DeploymentStatus.DEPLOY_FAILED: "REPLICA_STARTUP_FAILED"}
_RAY_AUTOSCALING = ("min_replicas", "initial_replicas", "max_replicas",
                    "target_ongoing_requests", "metrics_interval_s", "look_back_period_s",
                    "smoothing_factor", "upscale_smoothing_factor",
                    "downscale_smoothing_factor", "upscaling_factor", "downscaling_factor",
                    "downscale_delay_s", "downscale_to_zero_delay_s", "upscale_delay_s",
                    "aggregation_function")


def empty_details() -> dict[str, Any]:
    """What Ray answers when no Serve instance runs."""
    return {"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": None}


def instance_details(state: ControllerState, clock: Clock, controller_pid: int,
                     source: str | None = None) -> dict[str, Any]:
    """The details now; `clock` turns the state's monotonic times into wall seconds;
    `source` ("declarative" or "imperative") keeps only the applications deployed so."""
    offset = clock.wall() - clock.monotonic()

    def wall_of(monotonic: float) -> float:
        return monotonic + offset

    head = state.head
    http = state.http
    groups = state.by_deployment()
    return {
        "controller_info": {"node_id": head.node_id, "node_ip": head.node_ip,
                            "actor_id": None, "actor_name": "SERVE_CONTROLLER_ACTOR",
                            "worker_id": str(controller_pid), "log_file_path": None},
        "proxy_location": "Disabled" if http.location == "NoServer" else http.location,
        "http_options": {"host": http.host, "port": http.port, "root_path": http.root_path,
                         "request_timeout_s": http.request_timeout_s,
                         "keep_alive_timeout_s": http.keep_alive_timeout_s},
        "grpc_options": {"port": state.grpc.port,
                         "grpc_servicer_functions": list(state.grpc.grpc_servicer_functions),
                         "request_timeout_s": state.grpc.request_timeout_s,
                         "enable_reflection": state.grpc.enable_reflection},
        "proxies": {p.proxy_id: {"node_id": state.proxy_node(p.proxy_id),
                                 "node_ip": p.address.rpartition(":")[0],
                                 "actor_id": None, "actor_name": p.proxy_id,
                                 "worker_id": str(p.pid), "log_file_path": None,
                                 "status": "HEALTHY"}
                    for p in state.proxies.values()},
        "applications": {name: _application(state, name, groups, wall_of)
                         for name in state.apps
                         if source is None or _source(state, name) == source},
        "target_capacity": None,
        "target_groups": [],
    }


def _application(state: ControllerState, name: str,
                 groups: Mapping[DeploymentId, list[ReplicaRecord]],
                 wall_of: Callable[[float], float]) -> dict[str, Any]:
    app = state.apps[name]
    overview = state.app_status(name)
    status = overview.status
    if status is ApplicationStatus.DEPLOYING and app.deleting:
        status = ApplicationStatus.DELETING
    deployments = {}
    for did in app.ids():
        if did not in state.deployments:
            continue
        record = state.deployments[did]
        summary = overview.deployments[did.name]
        trigger = "DELETING" if record.deleting else _TRIGGERS.get(summary.status, "UNSPECIFIED")
        resources = record.config.resources
        deployments[did.name] = {
            "name": did.name, "status": summary.status.value, "status_trigger": trigger,
            "message": summary.message, "deployment_config": deployment_schema(record.config),
            "target_num_replicas": record.target,
            "required_resources": {"CPU": resources.num_cpus, "GPU": resources.num_gpus,
                                   **dict(resources.resources)},
            "replicas": [{"replica_id": r.replica_id, "state": _REPLICA_STATES[r.state],
                          "pid": r.pid or None, "start_time_s": wall_of(r.started_at),
                          "node_id": r.info.node_id if r.info else None,
                          "node_ip": None, "actor_name": r.replica_id}
                         for r in groups.get(did, [])],
        }
    return {"name": name, "route_prefix": app.route_prefix, "docs_path": None,
            "status": status.value, "message": overview.message,
            "last_deployed_time_s": app.deployed_at,
            # Ray clears a deleted application's config at once: it is no longer deployed.
            "deployed_app_config": (dict(app.source_config)
                                    if app.source_config and not app.deleting else None),
            "source": _source(state, name),
            "deployments": deployments, "external_scaler_enabled": False}


def _source(state: ControllerState, name: str) -> str:
    """Ray's APIType: a config (surge deploy, a REST PUT) is declarative, serve.run not."""
    return "declarative" if state.apps[name].source_config else "imperative"


def deployment_schema(config: DeploymentConfig) -> dict[str, Any]:
    """A deployment's options in Ray's `DeploymentSchema` spelling."""
    resources = config.resources
    schema: dict[str, Any] = {
        "name": config.name, "max_ongoing_requests": config.max_ongoing_requests,
        "max_queued_requests": config.max_queued_requests, "user_config": config.user_config,
        "graceful_shutdown_wait_loop_s": config.graceful_shutdown_wait_loop_s,
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "health_check_period_s": config.health_check_period_s,
        "health_check_timeout_s": config.health_check_timeout_s,
        "ray_actor_options": {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus,
                              "resources": dict(resources.resources),
                              "runtime_env": {"env_vars": dict(resources.env_vars)}},
    }
    if config.autoscaling_config is not None:
        schema["autoscaling_config"] = _autoscaling(config.autoscaling_config)
    else:
        schema["num_replicas"] = config.initial_replicas
    return schema


def _autoscaling(config: AutoscalingConfig) -> dict[str, Any]:
    values = dataclasses.asdict(config)
    out = {key: values[key] for key in _RAY_AUTOSCALING}
    policy: Mapping[str, Any] = config.policy or {}
    function = policy.get("policy_function")
    if isinstance(function, str) and function:
        out["policy"] = {"policy_function": function,
                         "policy_kwargs": dict(policy.get("policy_kwargs") or {})}
    return out
