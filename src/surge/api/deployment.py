"""`@serve.deployment`, `Deployment.options()`, `.bind()` and the application graph.

Decorating validates the options at once (bad input fails where it is written).
`bind` returns an `Application`; bound applications passed as arguments become
`DeploymentHandle`s in the replica's constructor.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import sys
from collections.abc import Mapping
from typing import Any

from surge.api.pickling import SerializationError, pickle_by_value, serialize
from surge.config import (
    AppSpec,
    DeploymentConfig,
    DeploymentSpec,
    build_deployment_config,
    runtime_env_uploads,
)
from surge.config.placement import placement_group_problem
from surge.config.schema import FieldError, suggestion
from surge.errors import ConfigError, DeployFailedError
from surge.model import AccessTokens, ImportedTarget, ModelRoutes
from surge.replica.ingress import INGRESS_ATTRIBUTE
from surge.router.handle import DeploymentHandle

__all__ = ["MODEL_ROUTES_ATTRIBUTE", "Application", "Deployment", "build_app_spec",
           "deployment"]

log = logging.getLogger("surge")

# Ray Serve 2.60's options that surge implements (route_prefix on a deployment is Ray's
# deprecated spelling of serve.run's), and those it accepts, with one warning, and ignores.
_OPTION_KEYS = {
    "name", "num_replicas", "max_ongoing_requests", "max_queued_requests",
    "autoscaling_config", "user_config", "ray_actor_options", "health_check_period_s",
    "health_check_timeout_s", "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s",
    "route_prefix", "max_concurrent_queries", "backpressure_config",
    "max_constructor_retry_count", "rolling_update_percentage", "max_surge_percent",
    "request_router_config", "max_queue_wait_s",
}
_IGNORED = {"placement_group_bundles", "placement_group_strategy",
            "placement_group_bundle_label_selector", "max_replicas_per_node", "logging_config",
            "gang_scheduling_config", "deployment_actors"}
_warned: set[str] = set()
# Set on an ingress class (OpenAiIngress) to the name of its bind argument that maps model
# ids to the applications serving them: the proxy then routes by the body's `model`.
MODEL_ROUTES_ATTRIBUTE = "__surge_model_routes__"


class Deployment:
    def __init__(self, func_or_class: Any, options: dict[str, Any]) -> None:
        if "version" in options:
            raise ConfigError("`version` in `@serve.deployment` has been removed. Serve "
                              "manages deployment versions internally.")
        unknown = set(options) - _OPTION_KEYS - _IGNORED
        if unknown:
            key = sorted(unknown)[0]
            raise FieldError(f"unknown deployment option {key!r}."
                             f"{suggestion(key, sorted(_OPTION_KEYS))}", (key,))
        if (options.get("max_replicas_per_node") is not None
                and options.get("placement_group_bundles") is not None):
            raise ConfigError("Setting max_replicas_per_node is not allowed when "
                              "placement_group_bundles is provided.")
        for key in sorted(set(options) & _IGNORED - _warned):
            _warned.add(key)
            log.warning("deployment option %r is Ray Serve's; surge accepts it and does not "
                        "use it", key)
        if "max_concurrent_queries" in options:  # Ray's pre-2.10 name
            options = dict(options)
            options.setdefault("max_ongoing_requests", options.pop("max_concurrent_queries"))
        self.func_or_class = func_or_class
        self._options = options
        name = options.get("name") or func_or_class.__name__
        config_options = {k: v for k, v in options.items()
                          if k not in _IGNORED and k not in ("name", "route_prefix")}
        self.config: DeploymentConfig = build_deployment_config(
            name, config_options, f"deployment {name!r}")
        problem = placement_group_problem(options)  # after ray_actor_options' own checks
        if problem is not None:
            raise ConfigError(problem)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def route_prefix(self) -> str | None:
        value = self._options.get("route_prefix")
        return value if isinstance(value, str) else None

    def __repr__(self) -> str:
        return f"Deployment(name={self.name!r})"

    def options(self, **options: Any) -> Deployment:
        return Deployment(self.func_or_class, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        return Application(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(f"deployment {self.name!r} cannot be called or constructed "
                          f"directly; use {self.name}.bind(...) and serve.run(...)")


class Application:
    """A bound deployment (and, through its arguments, the graph below it)."""

    def __init__(self, deployment: Deployment, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.deployment = deployment
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Application(ingress={self.deployment.name!r})"


def deployment(_func_or_class: Any = None, **options: Any) -> Any:
    """`@serve.deployment` with or without options, on a class or a function.

    As Ray's, a first argument that is not callable (`@serve.deployment("name")`) is
    ignored: the call returns the decorator."""
    def decorate(target: Any) -> Deployment:
        if not (inspect.isclass(target) or callable(target)):
            raise ConfigError("@serve.deployment decorates a class or a function")
        if _travels_by_value(target):  # as Ray: what cannot travel fails where it is written
            serialize(target, f"the deployment {target!r}", fresh_locks=_is_ingress(target))
        return Deployment(target, options)

    return decorate(_func_or_class) if callable(_func_or_class) else decorate


def _travels_by_value(target: Any) -> bool:
    """Whether `target` cannot travel by import path: it lives in `__main__` or a function,
    or its module was not imported."""
    module_name = getattr(target, "__module__", None) or ""
    qualname = getattr(target, "__qualname__", None) or "<locals>"  # an instance: by value
    return module_name == "__main__" or module_name not in sys.modules or "<locals>" in qualname


def _is_ingress(target: Any) -> bool:
    """A `serve.ingress` class: its ASGI app's thread locks travel as fresh ones."""
    return hasattr(target, INGRESS_ATTRIBUTE)


def pickle_target(target: Any) -> bytes:
    """By import path when the module is importable, else by value (cloudpickle)."""
    if not _travels_by_value(target):
        module = sys.modules[target.__module__]
        found: Any = module
        for part in target.__qualname__.split("."):
            found = getattr(found, part, None)
        if isinstance(found, Deployment):
            found = found.func_or_class
        if found is target:
            return pickle_by_value(ImportedTarget(
                target.__module__, target.__qualname__, _source_digest(module)))
    return serialize(target, f"the deployment {target!r}", fresh_locks=_is_ingress(target))


def _source_digest(module: Any) -> str:
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    try:
        with open(path, "rb") as source:
            return hashlib.sha256(source.read()).hexdigest()[:16]
    except OSError:
        return ""


def source_digest(target: Any) -> str:
    """A digest of the source file that defines `target` ("" when it has none)."""
    import hashlib
    import inspect

    try:
        path = inspect.getsourcefile(target)
        if path is None:
            return ""
        with open(path, "rb") as source:
            return hashlib.sha256(source.read()).hexdigest()[:16]
    except (TypeError, OSError):
        return ""


class _Builder:
    def __init__(self, app_name: str, deploy_id: str) -> None:
        self.app_name = app_name
        self.deploy_id = deploy_id
        self.specs: dict[str, DeploymentSpec] = {}
        self.seen: dict[int, str] = {}
        self.asgi: list[str] = []  # the deployments that serve an ASGI app (serve.ingress)

    def visit(self, app: Application) -> str:
        if id(app) in self.seen:
            return self.seen[id(app)]
        name = self._unique(app.deployment.name)
        self.seen[id(app)] = name
        config = app.deployment.config
        if name != config.name:
            import dataclasses

            config = dataclasses.replace(config, name=name)
        uploads = runtime_env_uploads(app.deployment._options.get("ray_actor_options"))
        if uploads:
            raise DeployFailedError(
                f"Deploying application {self.app_name!r} failed: deployment {name!r}: "
                f"{'; '.join(uploads)}. A deployment's ray_actor_options cannot upload a "
                "directory or module from this machine (as in Ray Serve): give it to the "
                "whole job instead (`surge run --working-dir`), or drop it.")
        target = app.deployment.func_or_class
        if _is_ingress(target):
            self.asgi.append(name)
        self.specs[name] = DeploymentSpec(
            config=config, target_blob=pickle_target(target),
            init_blob=self._init_blob(app, _is_ingress(target)),
            source_digest=source_digest(target), deploy_id=self.deploy_id)
        return name

    def _init_blob(self, app: Application, fresh_locks: bool) -> bytes:
        arguments = (app.args, app.kwargs)
        try:
            return serialize(arguments, "the deployment init arguments", self._handle_for,
                             fresh_locks=fresh_locks)
        except SerializationError:
            # Ray's words name the part that failed, the positional or the keyword ones
            # (a bound deployment's own failure is raised by neither: it is visited once).
            serialize(app.args, "the deployment init args", self._handle_for,
                      fresh_locks=fresh_locks)
            serialize(app.kwargs, "the deployment init kwargs", self._handle_for,
                      fresh_locks=fresh_locks)
            raise

    def _unique(self, name: str) -> str:
        if name not in self.specs and name not in self.seen.values():
            return name
        suffix = 1
        while f"{name}_{suffix}" in self.specs or f"{name}_{suffix}" in self.seen.values():
            suffix += 1
        return f"{name}_{suffix}"

    def _handle_for(self, value: Any) -> DeploymentHandle | None:
        """A bound deployment anywhere in the arguments (in a list, in a user's object)
        reaches the constructor as a handle to it, as in Ray."""
        if isinstance(value, Application):
            return DeploymentHandle(self.visit(value), self.app_name)
        return None


def build_app_spec(app: Application, name: str, route_prefix: str | None,
                   sys_path: tuple[str, ...] = (), auth: AccessTokens | None = None,
                   deploy_id: str = "") -> AppSpec:
    """The application as the controller takes it. `deploy_id` (serve.run's: a new one
    each call) replaces every replica, even of unchanged code, as each `serve.run` in Ray
    does; "" (config-file deploys) replaces only replicas whose code or limits changed."""
    if not isinstance(app, Application):
        hint = (" (call .bind() on it first)" if isinstance(app, Deployment) else "")
        raise ConfigError(f"serve.run expects an Application, got {type(app).__name__}{hint}")
    builder = _Builder(name, deploy_id)
    ingress = builder.visit(app)
    model_routes = _model_routes(app, builder)
    _check_one_asgi_ingress(name, builder.asgi, _model_servers(app, builder))
    prefix = route_prefix if route_prefix is not None else None
    return AppSpec(name=name, route_prefix=prefix, ingress=ingress,
                   deployments=tuple(builder.specs.values()), sys_path=sys_path, auth=auth,
                   model_routes=model_routes)


def _check_one_asgi_ingress(app_name: str, asgi: list[str], model_servers: set[str]) -> None:
    """At most one `serve.ingress` deployment per application, as Ray 2.60 requires:
    HTTP reaches only the ingress, so another ASGI app would never be served. The
    model servers of an OpenAI app are surge's own exception: LLMServer serves HTTP
    (the proxy reaches it directly when it can, see _model_routes) where Ray's does not."""
    if len([name for name in asgi if name not in model_servers]) > 1:
        raise ConfigError(f'Found multiple FastAPI deployments in application "{app_name}". '
                          "Please only include one deployment with @serve.ingress in your "
                          "application to avoid this issue.")


def _model_servers(app: Application, builder: _Builder) -> set[str]:
    """The deployments bound into the model map of the root's class (or a base's)."""
    key = getattr(app.deployment.func_or_class, MODEL_ROUTES_ATTRIBUTE, None)
    servers = app.kwargs.get(key) if isinstance(key, str) else None
    if not isinstance(servers, Mapping):
        return set()
    return {builder.seen[id(server)] for server in servers.values()
            if isinstance(server, Application)}


def _model_routes(app: Application, builder: _Builder) -> ModelRoutes | None:
    """The model -> deployment map an ingress class declares (MODEL_ROUTES_ATTRIBUTE).

    Only the class that sets it, not a subclass (which may route otherwise), and only
    when every model's deployment serves HTTP itself (a `serve.ingress` class, as
    LLMServer): else everything keeps going through the ingress."""
    cls = app.deployment.func_or_class
    key = vars(cls).get(MODEL_ROUTES_ATTRIBUTE) if isinstance(cls, type) else None
    servers = app.kwargs.get(key) if isinstance(key, str) else None
    if not isinstance(servers, Mapping) or not servers:
        return None
    if not all(isinstance(model, str) and isinstance(server, Application)
               and hasattr(server.deployment.func_or_class, INGRESS_ATTRIBUTE)
               for model, server in servers.items()):
        return None
    return ModelRoutes(tuple(sorted((model, builder.visit(server))
                                    for model, server in servers.items())))


