"""Ray Serve's module-level functions: start, run, status, delete, shutdown, handles."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from surge.api.auth import resolve_auth
from surge.api.deployment import Application, build_app_spec
from surge.api.instance import StartOptions, connect_or_start, current, disconnect, user_sys_path
from surge.backends.choice import BackendChoice, caller_ray_address
from surge.config import AuthConfig, HTTPOptions, from_mapping, gRPCOptions
from surge.config.weights import WeightStoreOptions
from surge.errors import (
    ControllerUnavailableError,
    DeployFailedError,
    DeploymentNotFoundError,
    RayServeException,
)
from surge.model import ApplicationStatus, ServeStatus
from surge.observability.config import DashboardOptions, LoggingConfig
from surge.proxy.tls import check_tls_files
from surge.router.handle import DeploymentHandle
from surge.router.runtime import current_runtime
from surge.transport.blocking_rpc import blocking_call
from surge.transport.grpc_methods import check_servicer_functions

__all__ = ["delete", "get_app_handle", "get_deployment_handle", "run", "shutdown", "start",
           "status"]

log = logging.getLogger("surge")

DEFAULT_APP_NAME = "default"


def start(*, http_options: HTTPOptions | Mapping[str, Any] | None = None,
          proxy_location: str | None = None, detached: bool = False,
          logging_config: LoggingConfig | Mapping[str, Any] | None = None,
          dashboard_host: str | None = None, dashboard_port: int | None = None,
          backend: str = "local", ray_address: str | None = None,
          weight_store: WeightStoreOptions | Mapping[str, Any] | bool | None = None,
          grpc_options: gRPCOptions | Mapping[str, Any] | None = None,
          **_ray_only: Any) -> None:
    """Start surge on this machine, or connect to the instance already running.

    `backend="ray"` places replicas and proxies on the Ray cluster at `ray_address`
    (default: the cluster this process joined with ray.init, else "auto"); the
    controller stays a process on this machine.

    `logging_config` is Ray's (encoding, log_level, logs_dir, enable_access_log, ...);
    the dashboard and /metrics listen on `dashboard_host:dashboard_port` (default
    SURGE_DASHBOARD, else 127.0.0.1:52801; port 0: any free port; serve.status() shows
    it). `weight_store` (surge's own: `WeightStoreOptions`, a dict of its fields, or
    False for none) configures each node's shared-memory weight store (surge.weights).
    These apply when this call starts surge; a running instance keeps its own.

    `detached=True` starts an instance that outlives this process (as `surge start`):
    deploy and exit, the applications keep serving; `surge shutdown` or serve.shutdown()
    stops it. Otherwise an instance this call starts stops when this process exits.

    `grpc_options` (Ray's `gRPCOptions`, or a dict of its fields) serves gRPC beside HTTP
    on every proxy (docs/grpc.md); its servicer functions must import here.

    Ray's other arguments (tracing_config, controller_options, ...) land in `_ray_only`:
    accepted, named in a warning when set, and not used.
    """
    for key in sorted(k for k, v in _ray_only.items() if v is not None):
        log.warning("serve.start(%s=...) is Ray Serve's; surge accepts it and does not use "
                    "it", key)
    grpc = grpc_options_from(grpc_options)
    dashboard = DashboardOptions.from_env()
    if dashboard_host is not None or dashboard_port is not None:
        dashboard = DashboardOptions(host=dashboard_host or dashboard.host,
                                     port=dashboard.port if dashboard_port is None
                                     else dashboard_port, required=True)
    choice = BackendChoice(backend, (ray_address or caller_ray_address())
                           if backend == "ray" else ray_address)
    connect_or_start(StartOptions(http=_http_options(http_options, proxy_location),
                                  backend=choice, logging=LoggingConfig.from_any(logging_config),
                                  dashboard=dashboard,
                                  weights=WeightStoreOptions.from_any(weight_store),
                                  grpc=grpc),
                     detached=detached)


def grpc_options_from(options: gRPCOptions | Mapping[str, Any] | None) -> gRPCOptions:
    """Ray's gRPCOptions, checked: each servicer function imports and declares methods
    (ConfigError with Ray's message otherwise)."""
    if options is None:
        return gRPCOptions()
    if not isinstance(options, gRPCOptions):
        options = from_mapping(gRPCOptions, dict(options), "grpc_options")
    check_servicer_functions(options.grpc_servicer_functions)
    return options


def _http_options(http_options: HTTPOptions | Mapping[str, Any] | None,
                  proxy_location: str | None) -> HTTPOptions:
    if http_options is None:
        options = HTTPOptions()
    elif isinstance(http_options, HTTPOptions):
        options = http_options
    else:
        options = from_mapping(HTTPOptions, dict(http_options), "http_options")
    if proxy_location is not None:
        import dataclasses

        options = dataclasses.replace(options, location=str(proxy_location))
    check_tls_files(options)
    return options


def run(target: Application, *, name: str = DEFAULT_APP_NAME, route_prefix: str | None = "/",
        blocking: bool = False, _local_testing_mode: bool = False,
        auth: AuthConfig | Mapping[str, Any] | None = None, _wait: bool = True,
        **_ray_only: Any) -> DeploymentHandle:
    """Deploy an application and wait until it runs; returns a handle to its ingress.

    `auth` (surge's addition) makes its HTTP route (and its gRPC calls, as `authorization:
    Bearer <token>` metadata) require a bearer token, e.g.
    `auth={"tokens_env": "APP_TOKENS"}` or `AuthConfig(tokens=[...])`; handles are not
    affected (they are for trusted code).
    """
    if isinstance(target, Application) and route_prefix == "/" and \
            target.deployment.route_prefix is not None:
        route_prefix = target.deployment.route_prefix
    spec = build_app_spec(target, name, route_prefix, user_sys_path(),
                          resolve_auth(auth, "serve.run(auth=...)"), uuid.uuid4().hex)
    instance = connect_or_start()
    instance.call("deploy", app=spec)
    if not _wait:
        return DeploymentHandle(spec.ingress, name)
    overview = instance.call("wait_app", name=name, timeout_s=None)
    if overview is None:
        raise RayServeException(f"application {name!r} was deleted while deploying")
    if overview.status is ApplicationStatus.DEPLOY_FAILED:
        raise DeployFailedError(f"application {name!r} failed to deploy: {overview.message}")
    handle = DeploymentHandle(spec.ingress, name)
    if blocking:
        _block_until_interrupted()
    return handle


def _run(target: Application, *, _blocking: bool = True, **options: Any) -> DeploymentHandle:
    """Ray's `serve._run`: `serve.run` that, with `_blocking=False`, returns as soon as
    the application is deployed, without waiting for it to run."""
    return run(target, _wait=_blocking, **options)


def _block_until_interrupted() -> None:
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        log.info("interrupted; shutting down")
        shutdown()


def status() -> ServeStatus:
    """The instance's status; an empty one when no instance is running (as Ray)."""
    try:
        result: ServeStatus = _call("status")
    except ControllerUnavailableError:
        return ServeStatus()
    return result


def delete(name: str, _blocking: bool = True) -> None:
    _call("delete", name=name, timeout_s=60.0 if _blocking else 0.0)


def shutdown() -> None:
    """Stop every application, replica and proxy of the instance."""
    if current() is None:
        try:
            connect_or_start(start=False)
        except Exception:
            return  # nothing running: nothing to do, as in Ray Serve
    disconnect(shutdown=True)


def get_app_handle(name: str) -> DeploymentHandle:
    ingress = _call("handle_target", app=name)
    if ingress is None:
        raise RayServeException(f"Application '{name}' does not exist.")
    return _handle(ingress, name)


def get_deployment_handle(deployment_name: str, app_name: str | None = None,
                          **_ray_only: Any) -> DeploymentHandle:
    if app_name is None:
        try:
            from surge.replica.context import get_replica_context

            app_name = get_replica_context().app_name
        except RayServeException:
            app_name = DEFAULT_APP_NAME
    if _call("handle_target", app=app_name, deployment=deployment_name) is None:
        raise DeploymentNotFoundError(f"Deployment '{deployment_name}' does not exist in "
                                      f"application '{app_name}'.")
    return _handle(deployment_name, app_name)


# get_app_handle / get_deployment_handle give one handle per deployment, as Ray caches
# them; the cache belongs to the runtime (a driver's connection, a replica) that made them.
_handles: dict[tuple[str, str], DeploymentHandle] = {}
_handles_runtime: list[object] = []


def _handle(deployment_name: str, app_name: str) -> DeploymentHandle:
    runtime = current_runtime()
    if _handles_runtime != [runtime]:
        _handles.clear()
        _handles_runtime[:] = [runtime]
    key = (app_name, deployment_name)
    if key not in _handles:
        _handles[key] = DeploymentHandle(deployment_name, app_name)
    return _handles[key]


def _in_runtime_loop() -> bool:
    try:
        return asyncio.get_running_loop() is current_runtime().loop
    except RuntimeError:
        return False


def _call(method: str, **kwargs: Any) -> Any:
    runtime = current_runtime()
    if _in_runtime_loop():  # async code on the runtime's own loop: it cannot answer us
        return blocking_call(runtime.address, method, runtime.token, **kwargs)
    future = asyncio.run_coroutine_threadsafe(runtime.call(method, **kwargs), runtime.loop)
    return future.result()
