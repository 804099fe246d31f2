"""Ray Serve's `serve deploy` YAML, read and validated with file and line in every error.

The file is read by config/schema.py's `load_yaml`: the data, and each key path
(`("applications", 0, "deployments", 1, "max_replicas")`) mapped to its line.
Validation walks the data with one table of known keys per section: a key surge
implements is used, a Ray key surge does not implement is named in a warning, anything
else is rejected with a "Did you mean" suggestion. All errors are collected and raised
together as one `ConfigError`, one per line, each `FILE:LINE: PATH: what is wrong`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.config import (
    PROXY_LOCATIONS,
    RAY_ACTOR_OPTION_KEYS_ACCEPTED,
    RAY_ACTOR_OPTION_KEYS_IMPLEMENTED,
    AuthConfig,
    AutoscalingConfig,
    BackpressureConfig,
    HTTPOptions,
    RequestRouterConfig,
    build_deployment_config,
    from_mapping,
    gRPCOptions,
    route_prefix_problem,
)
from surge.config.deployment import local_paths
from surge.config.placement import override_problem
from surge.config.schema import FieldError, KeyPath, dotted, line_of, load_yaml, suggestion
from surge.errors import ConfigError
from surge.observability.config import LoggingConfig
from surge.policy.autoscaling import ProactiveSettings
from surge.policy.resolve import DEFAULT_POLICY, policy_target
from surge.proxy.tls import check_tls_files

__all__ = ["AppConfig", "DeploymentOverride", "ServeConfig", "load_config", "parse_config"]

TOP_KEYS = ("proxy_location", "http_options", "grpc_options", "applications", "logging_config",
            "backend")
TOP_RAY_ONLY = ("target_capacity", "controller_options", "tracing_config")
HTTP_KEYS = tuple(f.name for f in dataclasses.fields(HTTPOptions) if f.name != "location")
HTTP_RAY_ONLY = ("ssl_keyfile_password", "middlewares", "num_cpus")
LOGGING_KEYS = tuple(f.name for f in dataclasses.fields(LoggingConfig))
LOGGING_RAY_ONLY: tuple[str, ...] = ()
APP_KEYS = ("name", "route_prefix", "import_path", "args", "runtime_env", "deployments",
            "auth")
AUTH_KEYS = ("tokens_env", "tokens_file")
APP_RAY_ONLY = ("autoscaling_policy", "external_scaler_enabled", "logging_config")
RUNTIME_ENV_KEYS = ("env_vars",)
RUNTIME_ENV_RAY_ONLY = ("working_dir", "py_modules", "py_executable", "pip", "conda", "uv",
                        "container", "image_uri", "config", "excludes", "nsight",
                        "java_jars", "worker_process_setup_hook", "mpi")
DEPLOYMENT_KEYS = ("name", "num_replicas", "max_ongoing_requests", "max_queued_requests",
                   "autoscaling_config", "user_config", "ray_actor_options",
                   "health_check_period_s", "health_check_timeout_s",
                   "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s",
                   "backpressure_config", "max_constructor_retry_count",
                   "rolling_update_percentage", "max_surge_percent", "request_router_config",
                   "max_queue_wait_s")
DEPLOYMENT_RAY_ONLY = ("placement_group_bundles", "placement_group_strategy",
                       "placement_group_bundle_label_selector", "max_replicas_per_node",
                       "logging_config", "gang_scheduling_config",
                       "deployment_actors", "version", "route_prefix")
AUTOSCALING_KEYS = tuple(f.name for f in dataclasses.fields(AutoscalingConfig))
BACKPRESSURE_KEYS = tuple(f.name for f in dataclasses.fields(BackpressureConfig))
ROUTER_KEYS = tuple(f.name for f in dataclasses.fields(RequestRouterConfig))
# Ray's names from before 2.10, still accepted by Ray with a deprecation warning.
RENAMED = {"max_concurrent_queries": "max_ongoing_requests",
           "target_num_ongoing_requests_per_replica": "target_ongoing_requests"}
PLACEMENT_KEYS = ("placement_group_bundles", "placement_group_strategy",
                  "placement_group_bundle_label_selector", "max_replicas_per_node")
# Ray's RayActorOptionsSchema refuses a deployment's local working_dir / py_modules.
LOCAL_PATH = ('runtime_envs in the Serve config support only remote URIs in working_dir and '
              'py_modules, or "local://" URIs for directories that already exist on every '
              "node. Got error when parsing URI:")
BACKENDS = ("local", "ray")  # backends/choice.py (the ray one needs `surge[ray]`)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class DeploymentOverride:
    """The options one `deployments[]` entry sets, in Ray's spelling, keys surge uses."""

    name: str
    options: Mapping[str, Any]
    path: KeyPath


@dataclass(frozen=True)
class AppConfig:
    name: str
    route_prefix: str | None
    import_path: str
    args: Mapping[str, Any]
    env_vars: Mapping[str, str]
    deployments: tuple[DeploymentOverride, ...]
    path: KeyPath
    auth: AuthConfig | None = None  # where its HTTP route's bearer tokens are (surge's key)


@dataclass(frozen=True)
class ServeConfig:
    """A validated config file: what to start and deploy, and where each key was written."""

    source: str
    http_options: HTTPOptions
    backend: str = "local"
    grpc_options: gRPCOptions = field(default_factory=gRPCOptions)
    log_level: str | None = None
    applications: tuple[AppConfig, ...] = ()
    ray_address: str | None = None  # not a key of the file: `surge run --address` sets it
    logging: LoggingConfig | None = None  # the file's logging_config, if it has one
    warnings: tuple[str, ...] = ()
    lines: Mapping[KeyPath, int] = field(default_factory=dict, repr=False)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of `path`, else of its nearest enclosing key that has one."""
        return line_of(self.lines, path)

    def where(self, path: KeyPath) -> str:
        line = self.line_of(path)
        return f"{self.source}:{line}: {dotted(path)}" if line else \
            f"{self.source}: {dotted(path)}"

    def app(self, name: str) -> AppConfig | None:
        return next((a for a in self.applications if a.name == name), None)


def load_config(path: str | Path) -> ServeConfig:
    """Read, parse and validate a config file; raises ConfigError naming file and line."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the config file: {exc.strerror}") from None
    data, lines = load_yaml(text, source)
    return parse_config(data, source=source, lines=lines)


class _Checker:
    """Collects errors and warnings while walking the data; one per bad key."""

    def __init__(self, source: str, lines: Mapping[KeyPath, int]) -> None:
        self.probe = ServeConfig(source=source, http_options=HTTPOptions(), lines=lines)
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: KeyPath, message: str) -> None:
        self.errors.append(f"{self.probe.where(path)}: {message}")

    def warn(self, path: KeyPath, message: str) -> None:
        self.warnings.append(f"{self.probe.where(path)}: {message}")

    def mapping(self, value: Any, path: KeyPath) -> Mapping[str, Any] | None:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, f"expected a mapping, got {type(value).__name__}")
            return None
        return value

    def keys(self, data: Mapping[str, Any], path: KeyPath, known: tuple[str, ...],
             ray_only: tuple[str, ...] = (), what: str = "") -> dict[str, Any]:
        """The entries surge uses; warns on Ray-only keys, rejects unknown ones."""
        used: dict[str, Any] = {}
        for key, value in data.items():
            key = str(key)
            if key in known:
                used[key] = value
            elif key in RENAMED and RENAMED[key] in known:
                self.warn((*path, key), f"{key!r} is Ray's old name; use "
                                        f"{RENAMED[key]!r}")
                used.setdefault(RENAMED[key], value)
            elif key in ray_only:
                self.warn((*path, key), f"Ray Serve's {key!r} is accepted but surge does not "
                                        f"implement it{what}; it is ignored")
            else:
                self.error((*path, key), f"unknown key.{suggestion(key, known + ray_only)}")
        return used

    def failed(self, path: KeyPath, options: Mapping[str, Any], exc: ConfigError,
               where: str) -> None:
        """A section's validation error, at the key it blames."""
        if isinstance(exc, FieldError):
            self.error((*path, *exc.path), _strip(exc.problem, where))
        else:
            self.error(_blame(path, options, str(exc)), _strip(str(exc), where))


def parse_config(data: Any, *, source: str = "<config>",
                 lines: Mapping[KeyPath, int] | None = None) -> ServeConfig:
    """Validate already-parsed YAML data (see `load_config`)."""
    check = _Checker(source, lines or {})
    top = check.mapping(data, ())
    if top is None:
        raise ConfigError("\n".join(check.errors))
    used = check.keys(top, (), TOP_KEYS, TOP_RAY_ONLY, " yet")
    http = _http_options(check, used)
    grpc = _grpc_options(check, used.get("grpc_options"))
    backend = used.get("backend", "local")
    if backend not in BACKENDS:
        check.error(("backend",), f"backend {backend!r} is not available; use one of "
                                  f"{', '.join(BACKENDS)}")
    logging = _logging(check, used.get("logging_config"))
    log_level = logging.log_level if logging is not None else None
    apps = _applications(check, used.get("applications"))
    if check.errors:
        raise ConfigError("\n".join(check.errors))
    return ServeConfig(source=source, http_options=http, grpc_options=grpc,
                       backend=str(backend),
                       log_level=log_level, applications=apps, logging=logging,
                       warnings=tuple(check.warnings), lines=dict(lines or {}), raw=top)


def _http_options(check: _Checker, used: Mapping[str, Any]) -> HTTPOptions:
    path: KeyPath = ("http_options",)
    data = check.mapping(used.get("http_options"), path)
    options = check.keys(data or {}, path, HTTP_KEYS, HTTP_RAY_ONLY)
    location = used.get("proxy_location")
    if location is not None:
        if location not in PROXY_LOCATIONS:
            check.error(("proxy_location",), f"must be one of {', '.join(PROXY_LOCATIONS)}, "
                                             f"got {location!r}")
        else:
            options["location"] = location
    try:
        http = from_mapping(HTTPOptions, options, "http_options")
    except ConfigError as exc:
        check.failed(path, options, exc, "http_options")
        return HTTPOptions()
    try:
        check_tls_files(http)
    except ConfigError as exc:  # "http_options.ssl_keyfile: what is wrong"
        where, _, message = str(exc).partition(": ")
        key = where.removeprefix("http_options.").split("/")[0]
        check.error((*path, key) if key in options else path, message)
    return http


def _grpc_options(check: _Checker, value: Any) -> gRPCOptions:
    """Ray's gRPCOptions; its servicer functions are imported when it is applied."""
    path: KeyPath = ("grpc_options",)
    data = check.mapping(value, path)
    if not data:
        return gRPCOptions()
    try:
        return from_mapping(gRPCOptions, dict(data), "grpc_options")
    except ConfigError as exc:
        check.failed(path, data, exc, "grpc_options")
        return gRPCOptions()


def _logging(check: _Checker, value: Any) -> LoggingConfig | None:
    """Ray's logging_config, all of it used (surge adds sampling and rotation keys)."""
    path: KeyPath = ("logging_config",)
    if value is None:
        return None
    data = check.mapping(value, path)
    used = check.keys(data or {}, path, LOGGING_KEYS, LOGGING_RAY_ONLY)
    level = used.get("log_level")
    if level is not None and str(level).upper() not in LOG_LEVELS:
        check.error((*path, "log_level"), f"must be one of {', '.join(LOG_LEVELS)}, "
                                          f"got {level!r}")
        return None
    try:
        return from_mapping(LoggingConfig, used, "logging_config")
    except ConfigError as exc:
        check.failed(path, used, exc, "logging_config")
        return None


def _applications(check: _Checker, value: Any) -> tuple[AppConfig, ...]:
    path: KeyPath = ("applications",)
    if value is None:
        return ()
    if not isinstance(value, list):
        check.error(path, f"expected a list of applications, got {type(value).__name__}")
        return ()
    apps = [app for index, item in enumerate(value)
            if (app := _application(check, item, (*path, index))) is not None]
    seen_names: dict[str, KeyPath] = {}
    seen_prefixes: dict[str, str] = {}
    for app in apps:
        if app.name in seen_names:
            check.error((*app.path, "name"), f"application name {app.name!r} is used twice "
                                             f"(also at {dotted(seen_names[app.name])})")
        seen_names.setdefault(app.name, app.path)
        if app.route_prefix is not None and app.route_prefix in seen_prefixes:
            check.error((*app.path, "route_prefix"),
                        f"route_prefix {app.route_prefix!r} is already used by application "
                        f"{seen_prefixes[app.route_prefix]!r}; give each one its own")
        if app.route_prefix is not None:
            seen_prefixes.setdefault(app.route_prefix, app.name)
    return tuple(apps)


def _application(check: _Checker, item: Any, path: KeyPath) -> AppConfig | None:
    data = check.mapping(item, path)
    if data is None:
        return None
    used = check.keys(data, path, APP_KEYS, APP_RAY_ONLY)
    name = used.get("name", "default")
    if not isinstance(name, str) or not name:
        check.error((*path, "name"), f"must be a non-empty string, got {name!r}")
    prefix = used.get("route_prefix", "/")
    problem = route_prefix_problem(prefix)
    if problem is not None:
        check.error((*path, "route_prefix"), f"{problem} (null: no HTTP route)")
    import_path = used.get("import_path")
    if import_path is None:
        check.error(path, "import_path is required, e.g. import_path: my_module:app")
    elif not isinstance(import_path, str) or not (":" in import_path or "." in import_path):
        check.error((*path, "import_path"), "must look like 'module:attribute' "
                                            f"(or 'module.attribute'), got {import_path!r}")
    args = check.mapping(used.get("args"), (*path, "args")) or {}
    env_vars = _runtime_env(check, used.get("runtime_env"), (*path, "runtime_env"))
    deployments = _deployments(check, used.get("deployments"), (*path, "deployments"))
    auth = _auth(check, used["auth"], (*path, "auth")) if "auth" in used else None
    return AppConfig(name=str(name), route_prefix=prefix, import_path=str(import_path),
                     args=dict(args), env_vars=env_vars, deployments=deployments, path=path,
                     auth=auth)


def _auth(check: _Checker, value: Any, path: KeyPath) -> AuthConfig | None:
    """Where the tokens are; the tokens themselves are read at deploy time (api/auth.py)."""
    data = check.mapping(value, path)
    if data is None:
        return None
    if "tokens" in data:
        check.error((*path, "tokens"), "surge does not take tokens written in a config file; "
                                       "put them in an environment variable (tokens_env: "
                                       "NAME) or a file (tokens_file: PATH)")
        data = {k: v for k, v in data.items() if k != "tokens"}
    used = check.keys(data, path, AUTH_KEYS)
    file = used.get("tokens_file")
    if isinstance(file, str) and file and not Path(file).is_absolute() \
            and check.probe.source and Path(check.probe.source).is_file():
        used["tokens_file"] = str(Path(check.probe.source).resolve().parent / file)
    try:
        return from_mapping(AuthConfig, used, "auth")
    except ConfigError as exc:
        check.failed(path, used, exc, "auth")
        return None


def _runtime_env(check: _Checker, value: Any, path: KeyPath) -> dict[str, str]:
    data = check.mapping(value, path)
    used = check.keys(data or {}, path, RUNTIME_ENV_KEYS, RUNTIME_ENV_RAY_ONLY,
                      " (surge imports from this machine's environment)")
    env_vars = used.get("env_vars") or {}
    if not isinstance(env_vars, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
        check.error((*path, "env_vars"), "must map names to strings (quote numbers)")
        return {}
    return dict(env_vars)


def _deployments(check: _Checker, value: Any, path: KeyPath) -> tuple[DeploymentOverride, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        check.error(path, f"expected a list of deployments, got {type(value).__name__}")
        return ()
    found: list[DeploymentOverride] = []
    for index, item in enumerate(value):
        override = _deployment(check, item, (*path, index))
        if override is None:
            continue
        if any(o.name == override.name for o in found):
            check.error((*override.path, "name"), f"deployment {override.name!r} is listed "
                                                  "twice in this application")
        found.append(override)
    return tuple(found)


def _deployment(check: _Checker, item: Any, path: KeyPath) -> DeploymentOverride | None:
    data = check.mapping(item, path)
    if data is None:
        return None
    used = check.keys(data, path, DEPLOYMENT_KEYS, DEPLOYMENT_RAY_ONLY)
    name = used.pop("name", None)
    if not isinstance(name, str) or not name:
        check.error(path, "each deployment needs a name: the deployment it overrides")
        return None
    if (data.get("max_replicas_per_node") is not None
            and data.get("placement_group_bundles") is not None):
        check.error((*path, "max_replicas_per_node"), "Setting max_replicas_per_node is not "
                    "allowed when placement_group_bundles is provided.")
    placement = override_problem(data)  # what Ray refuses whatever the code sets
    if placement is not None:
        strategy = placement.startswith("Invalid placement group strategy")
        key = "placement_group_strategy" if strategy else "placement_group_bundles"
        check.error((*path, key), placement)
    if "autoscaling_config" in used:
        scaling_path = (*path, "autoscaling_config")
        scaling = check.mapping(used["autoscaling_config"], scaling_path)
        used["autoscaling_config"] = None if scaling is None else check.keys(
            scaling, scaling_path, AUTOSCALING_KEYS)
        if scaling is not None:
            _proactive_kwargs(check, scaling.get("policy"), (*scaling_path, "policy"))
    if "ray_actor_options" in used:
        used["ray_actor_options"] = _actor_options(check, used["ray_actor_options"],
                                                   (*path, "ray_actor_options"))
    if "backpressure_config" in used and used["backpressure_config"] is not None:
        bp_path = (*path, "backpressure_config")
        backpressure = check.mapping(used["backpressure_config"], bp_path)
        used["backpressure_config"] = None if backpressure is None else check.keys(
            backpressure, bp_path, BACKPRESSURE_KEYS)
    if used.get("request_router_config") is not None:
        router_path = (*path, "request_router_config")
        router = check.mapping(used["request_router_config"], router_path)
        used["request_router_config"] = None if router is None else check.keys(
            router, router_path, ROUTER_KEYS)
    try:
        build_deployment_config(name, used, "@")
    except ConfigError as exc:
        check.failed(path, used, exc, "@")
    # Ray's placement keys go along, unused, so that the deployment built with them is
    # checked as Ray checks it: the file's and the code's options together.
    ray_placement = {key: data[key] for key in PLACEMENT_KEYS if data.get(key) is not None}
    return DeploymentOverride(name=name, options={**used, **ray_placement}, path=path)


def _proactive_kwargs(check: _Checker, policy: Any, path: KeyPath) -> None:
    """The proactive policy's `policy_kwargs` (surge's default policy), checked as a
    deploy checks them (policy/resolve.py), at their line in the file."""
    if not isinstance(policy, Mapping) or policy_target(policy) != DEFAULT_POLICY:
        return
    kwargs = policy.get("policy_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        return  # AutoscalingPolicy says so
    kwargs_path = (*path, "policy_kwargs")
    used = check.keys(kwargs, kwargs_path, tuple(ProactiveSettings.__dataclass_fields__))
    try:
        ProactiveSettings(**used)
    except FieldError as exc:
        check.error((*kwargs_path, *exc.path), exc.problem)


def _actor_options(check: _Checker, value: Any, path: KeyPath) -> dict[str, Any]:
    data = check.mapping(value, path) or {}
    used = check.keys(data, path, RAY_ACTOR_OPTION_KEYS_IMPLEMENTED,
                      RAY_ACTOR_OPTION_KEYS_ACCEPTED, " on the local backend")
    if "runtime_env" in used:
        env_path = (*path, "runtime_env")
        for key, uri in local_paths(used["runtime_env"]):  # as Ray's config schema
            check.error((*env_path, key), f"{LOCAL_PATH} Expected URI but received path {uri}")
        env_vars = _runtime_env(check, used["runtime_env"], env_path)
        used["runtime_env"] = {"env_vars": env_vars} if env_vars else {}
    return used


def _blame(path: KeyPath, options: Mapping[str, Any], message: str) -> KeyPath:
    """The key a message without a FieldError's path is about: the longest name from
    `options` it mentions."""
    candidates: list[KeyPath] = [(key,) for key in options]
    for key, value in options.items():
        if isinstance(value, Mapping):
            candidates += [(key, sub) for sub in value]
    mentioned = [c for c in candidates if str(c[-1]) in message]
    if not mentioned:
        return path
    return (*path, *max(mentioned, key=lambda c: (len(c), len(str(c[-1])))))


def _strip(message: str, where: str) -> str:
    for prefix in (f"{where}: ", f"{where}."):
        if message.startswith(prefix):
            message = message[len(prefix):]
    return message.replace(f"{where}.", "").replace(f"{where}: ", "")
