"""From a validated config to running applications, and from code back to a config.

`import_application` resolves an `import_path` ("module:attr" or "module.attr") to a
bound `Application`, calling it with `args` when it is a builder function, as Ray
does. `application_with_overrides` rewrites the bound graph so each deployment named
in the config gets its options (Ray's rule: YAML wins over the decorator, key by key;
an int `num_replicas` drops the code's autoscaling and vice versa), and the app's
`runtime_env.env_vars` reach every replica. `apply_config` builds every AppSpec first
(a bad config changes nothing), then deploys them, deletes the applications the file
no longer has, and waits, reporting progress. `build_config` is `surge build`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from surge.api.auth import resolve_auth
from surge.api.config_file import AppConfig, ServeConfig
from surge.api.deployment import Application, Deployment, build_app_spec
from surge.api.instance import Instance, StartOptions, connect_or_start, user_sys_path
from surge.backends.choice import BackendChoice, caller_ray_address
from surge.clock import SYSTEM
from surge.config import AppSpec, AutoscalingConfig
from surge.errors import ConfigError, DeployFailedError, users_traceback
from surge.model import ApplicationStatus, ApplicationStatusOverview
from surge.observability.config import LEVEL_ENV, LoggingConfig
from surge.transport.grpc_methods import check_servicer_functions

log = logging.getLogger("surge")

__all__ = [
    "application_with_overrides",
    "apply_config",
    "build_config",
    "import_application",
    "import_attribute",
    "walk_deployments",
]

DEPLOY_TIMEOUT_S = 300.0


# Ray's own builders that surge implements: a Ray config file naming them runs on surge's,
# without importing Ray (whose LLM extras would pull vLLM's CUDA build).
RAY_BUILDERS = {"ray.serve.llm": "surge.serve.llm"}
_said: set[str] = set()


def import_attribute(import_path: str, search: tuple[str, ...] = ()) -> Any:
    """`module:attr` or `module.attr`, importing from `search` and the cwd first."""
    separator = ":" if ":" in import_path else "."
    module_name, _, attr = import_path.rpartition(separator)
    if module_name in RAY_BUILDERS:
        module_name = RAY_BUILDERS[module_name]
        if import_path not in _said:
            _said.add(import_path)
            log.info("import_path %s: using surge's %s:%s (Ray is not imported)",
                     import_path, module_name, attr)
    for entry in reversed((*search, os.getcwd())):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from None
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    return found


def import_application(import_path: str, args: Mapping[str, Any] | None = None,
                       search: tuple[str, ...] = ()) -> Application:
    """A bound Application, or what a builder function returns for `args`."""
    target = import_attribute(import_path, search)
    if isinstance(target, Application):
        if args:
            raise ConfigError(f"{import_path} is a bound application; args are only passed "
                              "to application builders (a function returning an "
                              "Application)")
        return target
    if isinstance(target, Deployment):
        raise ConfigError(f"{import_path} is a deployment, not an application: bind it "
                          f"(app = {target.name}.bind()) and point import_path at that")
    if callable(target):
        built = target(_builder_args(import_path, target, dict(args or {})))
        if not isinstance(built, Application):
            raise ConfigError(f"the builder {import_path} returned "
                              f"{type(built).__name__}, not a bound Application")
        return built
    raise ConfigError(f"{import_path} is a {type(target).__name__}, not an Application "
                      "or a builder function")


def _builder_args(import_path: str, builder: Any, args: dict[str, Any]) -> Any:
    """What a builder is called with, as in Ray: the args dict, or the pydantic model its
    one parameter is annotated with, validated from it."""
    import inspect

    try:
        parameters = list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError):
        return args
    if len(parameters) != 1:
        raise ConfigError(f"the application builder {import_path} takes "
                          f"{len(parameters)} parameters; it must take exactly one, the "
                          "dictionary of arguments (or a pydantic model of them)")
    annotation = parameters[0].annotation
    if isinstance(annotation, str):  # `from __future__ import annotations`
        try:
            annotation = inspect.get_annotations(builder, eval_str=True).get(
                parameters[0].name, annotation)
        except Exception:
            return args
    model = _pydantic_model(annotation)
    if model is None:
        return args
    try:
        if hasattr(model, "model_validate"):
            return model.model_validate(args)
        return model.parse_obj(args)  # a pydantic.v1 model, which Ray takes too
    except Exception as exc:  # pydantic.ValidationError: which argument is wrong
        raise ConfigError(f"the arguments of {import_path} do not fit "
                          f"{model.__name__}: {exc}") from None


def _pydantic_model(annotation: Any) -> Any:
    if not isinstance(annotation, type):
        return None
    try:
        from pydantic import BaseModel
        from pydantic.v1 import BaseModel as BaseModelV1
    except ImportError:
        return None
    return annotation if issubclass(annotation, BaseModel | BaseModelV1) else None


@contextlib.contextmanager
def _environment(env_vars: Mapping[str, str]) -> Iterator[None]:
    """Module-level code sees the app's env_vars while it is imported, as under Ray."""
    saved = {k: os.environ.get(k) for k in env_vars}
    os.environ.update(env_vars)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def walk_deployments(root: Application) -> list[Application]:
    """Every bound deployment in the graph, each once, the ingress first."""
    seen: dict[int, Application] = {}

    def visit(value: Any) -> None:
        if isinstance(value, Application):
            if id(value) in seen:
                return
            seen[id(value)] = value
            for arg in (*value.args, *value.kwargs.values()):
                visit(arg)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    visit(root)
    return list(seen.values())


def merged_options(code: Mapping[str, Any], override: Mapping[str, Any],
                   env_vars: Mapping[str, str]) -> dict[str, Any]:
    """The options a deployment runs with: the decorator's, then the config's on top."""
    options = {**code, **override}
    if "num_replicas" in override and override["num_replicas"] != "auto" \
            and "autoscaling_config" not in override:
        options.pop("autoscaling_config", None)
    if "autoscaling_config" in override and "num_replicas" not in override \
            and options.get("num_replicas") != "auto":
        options.pop("num_replicas", None)
    if env_vars:
        actor = dict(options.get("ray_actor_options") or {})
        runtime_env = dict(actor.get("runtime_env") or {})
        runtime_env["env_vars"] = {**env_vars, **(runtime_env.get("env_vars") or {})}
        actor["runtime_env"] = runtime_env
        options["ray_actor_options"] = actor
    return options


def application_with_overrides(root: Application, app: AppConfig,
                               where: Callable[[tuple[Any, ...]], str]) -> Application:
    """A copy of the graph with the config's options applied, names checked."""
    nodes = walk_deployments(root)
    names = {node.deployment.name for node in nodes}
    for override in app.deployments:
        if override.name not in names:
            raise ConfigError(f"{where((*override.path, 'name'))}: application {app.name!r} "
                              f"has no deployment {override.name!r}; it has "
                              f"{', '.join(sorted(names))}")
    by_name = {o.name: o for o in app.deployments}
    copies: dict[int, Application] = {}

    def rewrite(value: Any) -> Any:
        if isinstance(value, Application):
            return copy(value)
        if isinstance(value, list | tuple):
            return type(value)(rewrite(v) for v in value)
        if isinstance(value, dict):
            return {k: rewrite(v) for k, v in value.items()}
        return value

    def copy(node: Application) -> Application:
        if id(node) in copies:
            return copies[id(node)]
        deployment = node.deployment
        override = by_name.get(deployment.name)
        if override is not None or app.env_vars:
            options = merged_options(deployment._options,
                                     override.options if override else {}, app.env_vars)
            try:
                deployment = Deployment(deployment.func_or_class, options)
            except ConfigError as exc:
                path = override.path if override else app.path
                raise ConfigError(f"{where(path)}: {exc}") from None
        result = Application(deployment, (), {})
        copies[id(node)] = result
        result.args = tuple(rewrite(a) for a in node.args)
        result.kwargs = {k: rewrite(v) for k, v in node.kwargs.items()}
        return result

    return copy(root)


def search_path(config: ServeConfig) -> tuple[str, ...]:
    """Where user modules are imported from: the config's folder, then the cwd."""
    folder = str(Path(config.source).resolve().parent) if config.source else os.getcwd()
    return tuple(dict.fromkeys((folder, os.getcwd())))


def build_specs(config: ServeConfig) -> list[AppSpec]:
    """Every application of the file, built (imported); the first failure raises."""
    return [build_app(config, app) for app in config.applications]


def build_app(config: ServeConfig, app: AppConfig) -> AppSpec:
    """One application of the file: imported, its overrides applied, ready to deploy.
    Raises ConfigError naming the file's place for what the user must fix."""
    search = search_path(config)
    try:
        with _environment(app.env_vars):
            root = import_application(app.import_path, app.args, search)
    except ConfigError as exc:
        raise ConfigError(f"{config.where((*app.path, 'import_path'))}: {exc}") from None
    except Exception:  # the user's module raised while it was imported or built
        raise ConfigError(f"{config.where((*app.path, 'import_path'))}: importing "
                          f"{app.import_path} raised:\n{users_traceback()}") from None
    bound = application_with_overrides(root, app, config.where)
    try:
        auth = resolve_auth(app.auth, "auth")
    except ConfigError as exc:
        raise ConfigError(f"{config.where((*app.path, 'auth'))}: {exc}") from None
    try:
        spec = build_app_spec(bound, app.name, app.route_prefix,
                              (*search, *user_sys_path()), auth)
    except ConfigError as exc:
        raise ConfigError(f"{config.where(app.path)}: {exc}") from None
    return dataclasses.replace(spec, source_config=entry_of(config, app))


def entry_of(config: ServeConfig, app: AppConfig) -> dict[str, Any]:
    """The application's entry in the file, as written (for `serve config`)."""
    node: Any = config.raw
    for key in app.path:
        node = node[key]
    return dict(node) if isinstance(node, Mapping) else {}


def apply_config(config: ServeConfig, *, start: bool,
                 progress: Callable[[str], None] = print, wait: bool = True,
                 detached: bool = False) -> Instance:
    """Deploy the file's applications (starting surge if `start`, `detached` if asked) and
    delete the others; with `wait`, until they run and the others are gone."""
    specs = build_specs(config)
    check_servicer_functions(config.grpc_options.grpc_servicer_functions)
    ray_address = config.ray_address or (
        caller_ray_address() if config.backend == "ray" else None)
    logging_config = config.logging or LoggingConfig()
    level = logging_config.log_level or os.environ.get(LEVEL_ENV) or config.log_level
    options = StartOptions(http=config.http_options,
                           grpc=config.grpc_options,
                           backend=BackendChoice(config.backend, ray_address),
                           logging=dataclasses.replace(logging_config, log_level=level))
    instance = connect_or_start(options, start=start, detached=detached)
    removed = deploy_specs(instance, specs, {spec.name for spec in specs}, progress)
    if not wait:
        return instance
    for spec in specs:
        _wait(instance, spec.name, progress)
    for name in removed:
        instance.call("delete", timeout=DEPLOY_TIMEOUT_S + 5, name=name,
                      timeout_s=DEPLOY_TIMEOUT_S)
        progress(f"application {name!r} deleted")
    return instance


def deploy_specs(instance: Instance, specs: list[AppSpec], wanted: set[str],
                 progress: Callable[[str], None]) -> list[str]:
    """Deploy `specs`; start deleting the applications a config deployed earlier that
    are not `wanted` (as Ray: those a script's serve.run made stay). Returns those."""
    applications = instance.call("details", timeout=10)["applications"]
    removed = [name for name, app in applications.items()
               if name not in wanted and app.get("source") == "declarative"]
    for name in removed:  # first, so their route prefixes are free for the new apps
        progress(f"deleting application {name!r}")
        instance.call("delete", timeout=10, name=name, timeout_s=0.0)
    for spec in specs:
        verb = "updating" if spec.name in applications else "deploying"
        progress(f"{verb} application {spec.name!r} "
                 f"({len(spec.deployments)} deployment(s), route {spec.route_prefix})")
        instance.call("deploy", timeout=30, app=spec)
    return removed


def _wait(instance: Instance, name: str, progress: Callable[[str], None]) -> None:
    start = SYSTEM.monotonic()
    last = ""
    while SYSTEM.monotonic() - start < DEPLOY_TIMEOUT_S:
        overview: ApplicationStatusOverview | None = instance.call(
            "wait_app", timeout=10, name=name, timeout_s=1.0)
        if overview is None:
            raise DeployFailedError(f"application {name!r} was deleted while deploying")
        if overview.status is ApplicationStatus.DEPLOY_FAILED:
            raise DeployFailedError(f"application {name!r} failed to deploy: "
                                    f"{overview.message}")
        line = "  ".join(f"{d} {_replicas(s.replica_states)}/{s.target_replicas}"
                         for d, s in overview.deployments.items())
        if overview.status is ApplicationStatus.RUNNING and not _rolling(overview):
            progress(f"application {name!r} RUNNING in {SYSTEM.monotonic() - start:.1f}s: "
                     f"{line}")
            return
        if line != last:
            progress(f"  {name}: {overview.status.value}  {line}")
            last = line
    raise DeployFailedError(f"application {name!r} is not running after "
                            f"{DEPLOY_TIMEOUT_S:.0f}s; see `surge status`")


def _replicas(states: Mapping[str, int]) -> int:
    return int(states.get("RUNNING", 0))


def _rolling(overview: ApplicationStatusOverview) -> bool:
    """Replicas of an old version still serving or draining: the update is not done."""
    return any(s.replica_states.get("DRAINING", 0) or
               s.replica_states.get("RUNNING", 0) > s.target_replicas
               for s in overview.deployments.values())


# -- surge build ----------------------------------------------------------------------------


def build_config(import_paths: list[str]) -> dict[str, Any]:
    """The config file of the given applications, in `serve deploy`'s format."""
    apps = []
    for index, import_path in enumerate(import_paths):
        root = import_application(import_path)
        name = "app1" if len(import_paths) == 1 else f"app{index + 1}"
        prefix = root.deployment.route_prefix or ("/" if len(import_paths) == 1
                                                   else f"/{name}")
        apps.append({"name": name, "route_prefix": prefix, "import_path": import_path,
                     "runtime_env": {},
                     "deployments": [_deployment_entry(n) for n in walk_deployments(root)]})
    return {"proxy_location": "EveryNode",
            # As Ray writes it: every interface (a container's port must be reachable).
            "http_options": {"host": "0.0.0.0", "port": 8000},
            "logging_config": {"encoding": "TEXT", "log_level": "INFO", "logs_dir": None,
                               "enable_access_log": True,
                               "additional_log_standard_attrs": []},
            "applications": apps}


def _deployment_entry(node: Application) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": node.deployment.name}
    for key, value in node.deployment._options.items():
        if key in ("name", "route_prefix"):
            continue
        if isinstance(value, AutoscalingConfig):
            default = AutoscalingConfig()
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                     if getattr(value, f.name) != getattr(default, f.name)}
            value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
        entry["max_ongoing_requests" if key == "max_concurrent_queries" else key] = value
    return entry

