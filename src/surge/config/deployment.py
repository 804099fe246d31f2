"""One deployment's options (Ray Serve's `DeploymentConfig`) and its code, as deployed."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surge.config.autoscaling import AutoscalingConfig
from surge.config.defaults import (
    DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S,
    DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S,
    DEFAULT_HEALTH_CHECK_PERIOD_S,
    DEFAULT_HEALTH_CHECK_TIMEOUT_S,
    DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT,
    DEFAULT_MAX_ONGOING_REQUESTS,
    DEFAULT_MAX_QUEUE_WAIT_S,
    DEFAULT_MAX_QUEUED_REQUESTS,
    QUEUE_SAFETY_LIMIT,
)
from surge.config.schema import (
    FieldError,
    check_keys,
    from_mapping,
    number,
    require,
    suggestion,
)
from surge.errors import ConfigError

log = logging.getLogger("surge.config")


RAY_ACTOR_OPTION_KEYS_IMPLEMENTED = ("num_cpus", "num_gpus", "runtime_env", "resources")
RAY_ACTOR_OPTION_KEYS_ACCEPTED = (
    "memory", "accelerator_type", "max_concurrency", "object_store_memory",
    "scheduling_strategy", "label_selector", "max_restarts", "max_task_retries",
    "fallback_strategy",
)


# The request_router_kwargs surge's own router reads. Ray hands the kwargs to the router
# class's initialize_state, which for its default PowerOfTwoChoicesRequestRouter takes
# and ignores anything, so a config with these runs unchanged on Ray.
# prefix_routing: false turns off prompt-prefix routing (the prefix index and the
# byte-prefix key): plain power of two choices on the engines' queues, for an A/B.
ROUTER_KWARGS = ("prefix_routing",)
DEFAULT_REQUEST_ROUTER_CLASS = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"


@dataclass(frozen=True, kw_only=True)
class RequestRouterConfig:
    """Ray Serve's `RequestRouterConfig`. surge routes with its own router (power of two
    choices; on the engine's queue for replicas that report routing stats) and warns
    that a custom request_router_class is not used; the routing-stats period and
    timeout are honoured (replica/stats_hooks.py), and of `request_router_kwargs` it
    reads ROUTER_KWARGS (`prefix_routing`). With Ray's default class, whose router takes
    no kwargs, another key is rejected as a typo; with another class they are its own."""

    request_router_class: Any = DEFAULT_REQUEST_ROUTER_CLASS
    request_router_kwargs: Mapping[str, Any] = field(default_factory=dict)
    request_routing_stats_period_s: float = 10.0
    request_routing_stats_timeout_s: float = 30.0
    initial_backoff_s: float = 0.025
    backoff_multiplier: float = 2.0
    max_backoff_s: float = 0.5

    def __post_init__(self) -> None:
        for name in ("request_routing_stats_period_s", "request_routing_stats_timeout_s"):
            number(f"request_router_config.{name}", getattr(self, name), gt=0)
        self._check_kwargs()

    def _check_kwargs(self) -> None:
        kwargs = self.request_router_kwargs
        where = "request_router_config.request_router_kwargs"
        require(isinstance(kwargs, Mapping), f"{where} must be a mapping, got {kwargs!r}.")
        try:  # Ray's own check: the kwargs travel as JSON
            json.dumps(dict(kwargs))
        except (TypeError, ValueError) as exc:
            raise FieldError(f"{where} is not JSON-serializable: {exc}.",
                             ("request_router_kwargs",)) from None
        if self.request_router_class == DEFAULT_REQUEST_ROUTER_CLASS:  # a typo, not another's
            try:
                check_keys(kwargs, ROUTER_KWARGS, where)
            except FieldError as exc:
                raise FieldError(str(exc), ("request_router_kwargs", *exc.path),
                                 exc.problem) from None
        prefix = kwargs.get("prefix_routing", True)
        require(isinstance(prefix, bool),
                f"{where}.prefix_routing must be true or false, got {prefix!r}.")

    @property
    def prefix_routing(self) -> bool:
        """Route OpenAI prompts by the prefix the engines hold (False: by load alone)."""
        return bool(self.request_router_kwargs.get("prefix_routing", True))


@dataclass(frozen=True, kw_only=True)
class BackpressureConfig:
    """Ray Serve's `BackpressureConfig`: how an HTTP request over the queue budget is
    answered. `retry_after_s` None: no Retry-After, as Ray, except under surge's wait
    bound (max_queued_requests unset), which advises its drain-time estimate; set: that
    value, rounded up."""

    status_code: int = 503
    retry_after_s: float | None = None

    def __post_init__(self) -> None:
        require(self.status_code in (503, 429) and not isinstance(self.status_code, bool),
                f"backpressure_config.status_code must be 503 or 429, got "
                f"{self.status_code!r}.")
        number("backpressure_config.retry_after_s", self.retry_after_s, ge=0,
               allow_none=True)
        require(self.retry_after_s is None or math.isfinite(self.retry_after_s),
                "backpressure_config.retry_after_s must be finite.")


def runtime_env_uploads(ray_actor_options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """What a deployment's `runtime_env` asks to upload from this machine (a
    `working_dir` or `py_modules` given as a local path, not a URI), one line each. Ray
    2.60 uploads those only for a whole job (`ray.init`, `serve run --working-dir`):
    such a deployment fails to deploy there, so it fails in surge too."""
    runtime_env = (ray_actor_options or {}).get("runtime_env")
    return tuple(f"runtime_env.{key} {value!r} is not a URI"
                 for key, value in local_paths(runtime_env))


def local_paths(runtime_env: Any) -> tuple[tuple[str, str], ...]:
    """The `working_dir` and `py_modules` entries of a runtime_env given as local paths
    (no `scheme://`): (key, path) each."""
    if not isinstance(runtime_env, Mapping):
        return ()
    modules = runtime_env.get("py_modules") or []
    given = [("working_dir", runtime_env.get("working_dir")),
             *(("py_modules", m) for m in (modules if isinstance(modules, list) else []))]
    return tuple((key, value) for key, value in given
                 if isinstance(value, str) and "://" not in value)


@dataclass(frozen=True, kw_only=True)
class ReplicaResources:
    """What a replica needs from its host, from Ray's `ray_actor_options`."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env_vars: Mapping[str, str] = field(default_factory=dict)
    # Ray's custom resources ({"accelerator_x": 1}); placement on the ray backend only.
    resources: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_ray_actor_options(cls, options: Mapping[str, Any] | None,
                               where: str = "ray_actor_options") -> ReplicaResources:
        options = dict(options or {})
        ignored = [k for k in options if k not in RAY_ACTOR_OPTION_KEYS_IMPLEMENTED]
        for key in ignored:
            if key not in RAY_ACTOR_OPTION_KEYS_ACCEPTED:
                raise ConfigError(f"{where}: unknown key {key!r}."
                                  f"{suggestion(key, list(RAY_ACTOR_OPTION_KEYS_IMPLEMENTED))}")
        if ignored:
            log.warning("%s: %s accepted but not used by the local backend", where,
                        ", ".join(sorted(ignored)))
        runtime_env = options.get("runtime_env") or {}
        require(isinstance(runtime_env, Mapping),
                f"{where}.runtime_env must be a mapping, got {type(runtime_env).__name__}.")
        runtime_env = dict(runtime_env)
        env_vars = runtime_env.pop("env_vars", None) or {}
        if runtime_env:
            log.warning("%s.runtime_env: %s not supported by surge; only env_vars is "
                        "honoured", where, ", ".join(sorted(runtime_env)))
        require(isinstance(env_vars, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()),
            f"{where}.runtime_env.env_vars must map strings to strings.")
        num_cpus = options.get("num_cpus", 1.0)
        num_gpus = options.get("num_gpus", 0.0)
        number(f"{where}.num_cpus", num_cpus, ge=0, path=("ray_actor_options", "num_cpus"))
        number(f"{where}.num_gpus", num_gpus, ge=0, path=("ray_actor_options", "num_gpus"))
        custom = options.get("resources") or {}
        require(isinstance(custom, Mapping) and all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            and v >= 0 for k, v in custom.items()),
            f"{where}.resources must map resource names to amounts >= 0, e.g. {{'tpu': 1}}.")
        return cls(num_cpus=float(num_cpus), num_gpus=float(num_gpus), env_vars=dict(env_vars),
                   resources={k: float(v) for k, v in custom.items()})


@dataclass(frozen=True, kw_only=True)
class DeploymentConfig:
    """The options of one deployment, with Ray Serve's names and defaults."""

    name: str
    num_replicas: int | None = None
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS
    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS
    # surge's: the longest a request may wait for a replica while max_queued_requests is
    # unset (policy/admission.py); None bounds the queue by QUEUE_SAFETY_LIMIT alone.
    max_queue_wait_s: float | None = DEFAULT_MAX_QUEUE_WAIT_S
    autoscaling_config: AutoscalingConfig | None = None
    user_config: Any = None
    resources: ReplicaResources = field(default_factory=ReplicaResources)
    health_check_period_s: float = DEFAULT_HEALTH_CHECK_PERIOD_S
    health_check_timeout_s: float = DEFAULT_HEALTH_CHECK_TIMEOUT_S
    graceful_shutdown_timeout_s: float = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S
    graceful_shutdown_wait_loop_s: float = DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S
    backpressure_config: BackpressureConfig = field(default_factory=BackpressureConfig)
    request_router_config: RequestRouterConfig = field(default_factory=RequestRouterConfig)
    max_constructor_retry_count: int = DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT
    # Rolling updates (policy/reconcile.py). None: surge's default, every replacement at
    # once and the old replicas serving until theirs run (no capacity dip).
    rolling_update_percentage: float | None = None  # Ray's: fraction replaced at a time
    max_surge_percent: int | None = None  # Ray's: extra replicas allowed during it

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and bool(self.name) and "#" not in self.name,
                f"deployment name must be a non-empty string without '#', got {self.name!r}.")
        if self.num_replicas is not None:
            number("num_replicas", self.num_replicas, ge=0, integer=True)
        number("max_ongoing_requests", self.max_ongoing_requests, ge=1, integer=True)
        require(isinstance(self.max_queued_requests, int)
                and not isinstance(self.max_queued_requests, bool)
                and (self.max_queued_requests == -1 or self.max_queued_requests >= 0),
                f"max_queued_requests must be -1 (no explicit limit) or an integer >= 0, got "
                f"{self.max_queued_requests!r}.")
        require(self.max_queue_wait_s is None or (
                   isinstance(self.max_queue_wait_s, int | float)
                   and not isinstance(self.max_queue_wait_s, bool)
                   and math.isfinite(self.max_queue_wait_s) and self.max_queue_wait_s > 0),
                f"max_queue_wait_s must be a number of seconds > 0, or None to bound the "
                f"queue by count alone, got {self.max_queue_wait_s!r}.")
        for name in ("health_check_period_s", "health_check_timeout_s",
                     "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s"):
            number(name, getattr(self, name), ge=0)
        if isinstance(self.backpressure_config, Mapping):
            object.__setattr__(self, "backpressure_config", from_mapping(
                BackpressureConfig, self.backpressure_config, "backpressure_config"))
        elif self.backpressure_config is None:
            object.__setattr__(self, "backpressure_config", BackpressureConfig())
        require(isinstance(self.backpressure_config, BackpressureConfig),
                "backpressure_config must be a dict or BackpressureConfig.")
        self._check_router()
        number("max_constructor_retry_count", self.max_constructor_retry_count, ge=1,
               integer=True)
        rate = self.rolling_update_percentage
        number("rolling_update_percentage", rate, gt=0, le=1, allow_none=True)
        number("max_surge_percent", self.max_surge_percent, ge=0, le=100, integer=True,
               allow_none=True)

    def _check_router(self) -> None:
        router = self.request_router_config
        if isinstance(router, Mapping):
            router = from_mapping(RequestRouterConfig, router, "request_router_config")
        elif router is None:
            router = RequestRouterConfig()
        require(isinstance(router, RequestRouterConfig),
                "request_router_config must be a dict or RequestRouterConfig.")
        object.__setattr__(self, "request_router_config", router)
        if router.request_router_class != DEFAULT_REQUEST_ROUTER_CLASS:
            log.warning("deployment %r: request_router_class %r is not used; surge routes "
                        "with its own router", self.name, router.request_router_class)

    @property
    def initial_replicas(self) -> int:
        if self.autoscaling_config is not None:
            return self.autoscaling_config.start_replicas
        return 1 if self.num_replicas is None else self.num_replicas

    @property
    def queue_limit(self) -> int:
        """The queue budget of the whole deployment (the safety limit when unset)."""
        if self.max_queued_requests == -1:
            return QUEUE_SAFETY_LIMIT
        return self.max_queued_requests

    @property
    def queue_wait_limit_s(self) -> float | None:
        """The wait bound routers apply: none when max_queued_requests is explicit (Ray's
        count semantics)."""
        return self.max_queue_wait_s if self.max_queued_requests == -1 else None


def build_deployment_config(name: str, options: Mapping[str, Any],
                            where: str = "deployment") -> DeploymentConfig:
    """Resolve Ray's spelling (`num_replicas="auto"`, dict autoscaling) into a config."""
    options = dict(options)
    num_replicas = options.pop("num_replicas", None)
    autoscaling = options.pop("autoscaling_config", None)
    auto = num_replicas == "auto"
    if isinstance(autoscaling, Mapping):
        # As in Ray, with "auto" the fields the user set go over AutoscalingConfig.default(),
        # before validation (min_replicas=5 alone is valid under auto's max of 100).
        base = AutoscalingConfig.default()
        merged = ({"min_replicas": base.min_replicas, "max_replicas": base.max_replicas,
                   **autoscaling} if auto else autoscaling)
        autoscaling = from_mapping(AutoscalingConfig, merged, f"{where}.autoscaling_config",
                                   ("autoscaling_config",))
    elif auto and isinstance(autoscaling, AutoscalingConfig):
        # An object cannot say which fields were set: keep those that differ from defaults.
        given = {f.name: getattr(autoscaling, f.name) for f in dataclasses.fields(autoscaling)
                 if getattr(autoscaling, f.name) != getattr(AutoscalingConfig(), f.name)}
        autoscaling = dataclasses.replace(AutoscalingConfig.default(), **given)
    if autoscaling is not None and not isinstance(autoscaling, AutoscalingConfig):
        raise ConfigError(f"{where}.autoscaling_config must be a dict or AutoscalingConfig.")
    if auto:
        autoscaling, num_replicas = autoscaling or AutoscalingConfig.default(), None
    elif isinstance(num_replicas, str):
        # As Ray's pydantic field takes it: an integer written as a string ("3", e.g. a
        # builder's CLI argument) is that integer.
        if not num_replicas.strip().lstrip("+-").isdigit():
            raise FieldError(f"{where}.num_replicas must be an integer or 'auto', "
                             f"got {num_replicas!r}.", ("num_replicas",))
        num_replicas = int(num_replicas)
    elif num_replicas is not None and autoscaling is not None:
        raise ConfigError(f"{where}: num_replicas and autoscaling_config cannot both be set; "
                          "use num_replicas='auto' or drop one of them.")
    resources = ReplicaResources.from_ray_actor_options(
        options.pop("ray_actor_options", None), f"{where}.ray_actor_options")
    known = {f.name for f in dataclasses.fields(DeploymentConfig)} - {"name", "resources"}
    for key in options:
        if key not in known:
            hint = suggestion(key, sorted(known))
            raise FieldError(f"{where}: unknown option {key!r}.{hint}", (key,),
                             f"unknown option.{hint}")
    try:
        return DeploymentConfig(name=name, num_replicas=num_replicas,
                                autoscaling_config=autoscaling, resources=resources, **options)
    except FieldError as exc:
        raise exc.within(where) from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class DeploymentSpec:
    """A deployment as sent to the controller: its config and its pickled code."""

    config: DeploymentConfig
    target_blob: bytes
    init_blob: bytes
    # The digest of the file that defines the code: a class pickled by reference has the
    # same blob when its module changed (`surge run --reload`, a redeploy after an edit).
    source_digest: str = ""
    deploy_id: str = ""  # build_app_spec's: set, a new one per serve.run (Ray's behaviour)

    @property
    def code_version(self) -> str:
        """Changes when replicas must be replaced (code, args, resources, limits)."""
        import hashlib

        c = self.config
        digest = hashlib.sha256(self.target_blob + b"\0" + self.init_blob + b"\0"
                                + self.source_digest.encode())
        if self.deploy_id:
            digest.update(b"\0" + self.deploy_id.encode())
        digest.update(repr((c.max_ongoing_requests, c.resources, c.graceful_shutdown_timeout_s,
                            c.health_check_period_s, c.health_check_timeout_s)).encode())
        return digest.hexdigest()[:16]
