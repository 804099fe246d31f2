"""Frozen, validated configs with Ray Serve's field names and defaults.

Every default is a named constant with the reason it has that value. Configs are
built from keyword arguments or from dicts (YAML); unknown keys are rejected with a
suggestion, and every error names the field and what to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from surge.errors import ConfigError
from surge.model import AccessTokens

__all__ = [
    "DEFAULT_CONTROL_PORT",
    "DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S",
    "DEFAULT_HEALTH_CHECK_PERIOD_S",
    "DEFAULT_HEALTH_CHECK_TIMEOUT_S",
    "DEFAULT_HTTP_HOST",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT",
    "DEFAULT_MAX_ONGOING_REQUESTS",
    "DEFAULT_MAX_QUEUED_REQUESTS",
    "QUEUE_SAFETY_LIMIT",
    "AppSpec",
    "AuthConfig",
    "AutoscalingConfig",
    "BackpressureConfig",
    "DeploymentConfig",
    "DeploymentSpec",
    "HTTPOptions",
    "ProxyLocation",
    "ReplicaResources",
    "ScheduleWindow",
    "parse_schedule",
    "unreadable",
]

log = logging.getLogger("surge.config")

# Ray Serve's default since 2.32: small enough that routers spread load early.
DEFAULT_MAX_ONGOING_REQUESTS = 5
# -1 means "no explicit limit", as in Ray Serve; surge still caps it (QUEUE_SAFETY_LIMIT).
DEFAULT_MAX_QUEUED_REQUESTS = -1
# Requests one router may hold waiting for a replica when no limit is set: bounds memory
# (a queued HTTP request costs ~1-2 KiB) while absorbing a burst of ~1 s at 10k/s.
QUEUE_SAFETY_LIMIT = 10_000
# Ray Serve's health-check cadence and patience.
DEFAULT_HEALTH_CHECK_PERIOD_S = 10.0
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 30.0
# Constructor failures in a row, with no replica running, before a deploy fails. Ray
# retries 20 times; each retry here costs a process start, so fail fast and say why.
DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT = 3
# Ray Serve's drain budget before a replica is killed.
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2.0
# Ray Serve's HTTP defaults; loopback so nothing is exposed by accident.
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
# Bodies above this are refused with 413 before they are buffered.
DEFAULT_MAX_BODY_BYTES = 100 * 1024 * 1024
# Request line + headers above this are refused with 431 (nginx allows 4 x 8 KiB).
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
# A request whose headers take longer than this to arrive (slowloris) gets 408.
DEFAULT_REQUEST_HEADER_TIMEOUT_S = 30.0
# A request body that stops arriving for this long gets 408 (nginx's client_body_timeout,
# also a silence between reads, is 60 s); without it a truncated body held its
# connection forever.
DEFAULT_REQUEST_BODY_TIMEOUT_S = 30.0
# Open client connections per proxy worker; more are answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 10_000
# Ray/uvicorn's keep-alive; long enough for load balancers that reuse connections.
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 90.0
# The control API of a running instance (loopback). SURGE_ADDRESS overrides it.
DEFAULT_CONTROL_PORT = 52800
# "auto" in Ray Serve means autoscaling between 1 and 100 replicas.
AUTO_MAX_REPLICAS = 100

# Client-certificate modes, in the order of ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED.
CERT_REQS = ("none", "optional", "required")

ProxyLocation = Literal["EveryNode", "HeadOnly", "Disabled"]
PROXY_LOCATIONS = ("EveryNode", "HeadOnly", "Disabled", "NoServer")

T = TypeVar("T")


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" Did you mean {close[0]!r}?" if close else f" Known keys: {', '.join(known)}."


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build a config dataclass from a dict, naming `where` in every error."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}.")
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}.{_suggest(str(key), known)}")
    try:
        return cls(**data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def unreadable(key: str, path: str, exc: OSError | UnicodeDecodeError, what: str,
               reader: str) -> ConfigError:
    """The ConfigError for a file named by `key` that cannot be read, saying what to do."""
    if isinstance(exc, FileNotFoundError):
        return ConfigError(f"{key}: no such file {path!r}")
    if isinstance(exc, IsADirectoryError):
        return ConfigError(f"{key}: {path!r} is a directory; give {what}")
    if isinstance(exc, PermissionError):
        return ConfigError(f"{key}: cannot read {path!r} (permission denied); make it "
                           f"readable by {reader}")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    return ConfigError(f"{key}: cannot read {path!r}: {reason}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(name: str, value: object, *, minimum: float, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _require(_is_number(value) and value >= minimum,  # type: ignore[operator]
             f"{name} must be a number >= {minimum}, got {value!r}.")


def _positive(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _require(_is_number(value) and value > 0,  # type: ignore[operator]
             f"{name} must be a number > 0, got {value!r}.")


def _integer(name: str, value: object, *, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             f"{name} must be an integer >= {minimum}, got {value!r}.")


@dataclass(frozen=True)
class ScheduleWindow:
    start_s: int  # seconds after local midnight
    end_s: int
    min_replicas: int | None = None
    standby_replicas: int | None = None

    def covers(self, second_of_day: float) -> bool:
        if self.start_s <= self.end_s:
            return self.start_s <= second_of_day < self.end_s
        return second_of_day >= self.start_s or second_of_day < self.end_s


def _clock(text: Any, where: str) -> int:
    if not isinstance(text, str) or text.count(":") != 1:
        raise ConfigError(f"{where} must be a time of day like '23:50', got {text!r}")
    hours, minutes = text.split(":")
    if not (hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60):
        raise ConfigError(f"{where} must be a time of day like '23:50', got {text!r}")
    return int(hours) * 3600 + int(minutes) * 60


def parse_schedule(windows: Sequence[Mapping[str, Any]]) -> tuple[ScheduleWindow, ...]:
    parsed = []
    for index, window in enumerate(windows):
        where = f"schedule[{index}]"
        if not isinstance(window, Mapping):
            raise ConfigError(f"{where} must be a mapping with start, end and floors")
        unknown = set(window) - {"start", "end", "min_replicas", "standby_replicas"}
        if unknown:
            raise ConfigError(f"{where} has unknown keys {sorted(unknown)}; use start, end, "
                             "min_replicas, standby_replicas")
        floors = {k: window.get(k) for k in ("min_replicas", "standby_replicas")}
        for key, value in floors.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ConfigError(f"{where}.{key} must be an integer >= 0, got {value!r}")
        if floors["min_replicas"] is None and floors["standby_replicas"] is None:
            raise ConfigError(f"{where} sets no floor; give min_replicas or standby_replicas")
        start = _clock(window.get("start"), f"{where}.start")
        end = _clock(window.get("end"), f"{where}.end")
        if start == end:
            raise ConfigError(f"{where} is empty: start and end are both {window['start']}")
        parsed.append(ScheduleWindow(start, end, floors["min_replicas"],
                                     floors["standby_replicas"]))
    return tuple(parsed)



@dataclass(frozen=True, kw_only=True)
class AutoscalingConfig:
    """Ray Serve's `AutoscalingConfig` with Ray's defaults (min 1, max 1, target 2)."""

    min_replicas: int = 1
    initial_replicas: int | None = None
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscale_delay_s: float = 30.0
    aggregation_function: str = "mean"
    policy: Mapping[str, Any] | None = None
    standby_replicas: int = 0
    schedule: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _integer("min_replicas", self.min_replicas, minimum=0)
        _integer("max_replicas", self.max_replicas, minimum=1)
        _require(self.min_replicas <= self.max_replicas,
                 f"min_replicas ({self.min_replicas}) must be <= max_replicas "
                 f"({self.max_replicas}).")
        if self.initial_replicas is not None:
            _integer("initial_replicas", self.initial_replicas, minimum=0)
            _require(self.min_replicas <= self.initial_replicas <= self.max_replicas,
                     "initial_replicas must lie within [min_replicas, max_replicas].")
        _positive("target_ongoing_requests", self.target_ongoing_requests)
        for name in ("metrics_interval_s", "look_back_period_s", "downscale_delay_s",
                     "upscale_delay_s"):
            _number(name, getattr(self, name), minimum=0)
        _number("downscale_to_zero_delay_s", self.downscale_to_zero_delay_s, minimum=0,
                allow_none=True)
        for name in ("smoothing_factor", "upscale_smoothing_factor",
                     "downscale_smoothing_factor", "upscaling_factor", "downscaling_factor"):
            _positive(name, getattr(self, name), allow_none=True)
        _require(self.aggregation_function in ("mean", "max", "min"),
                 "aggregation_function must be one of 'mean', 'max', 'min'.")
        _integer("standby_replicas", self.standby_replicas, minimum=0)
        _require(isinstance(self.schedule, list | tuple),
                 "schedule must be a list of windows like "
                 "{start: '23:50', end: '00:30', min_replicas: 8}.")
        object.__setattr__(self, "schedule", tuple(self.schedule))
        parse_schedule(self.schedule)
        if self.policy is not None:
            _require(isinstance(self.policy, Mapping) and set(self.policy) <= {
                "policy_function", "policy_kwargs"},
                "policy must be a mapping with policy_function and optional policy_kwargs.")

    @property
    def schedule_windows(self) -> tuple[ScheduleWindow, ...]:
        return parse_schedule(self.schedule)

    @classmethod
    def default(cls) -> AutoscalingConfig:
        """What `num_replicas="auto"` means: 1 to 100 replicas."""
        return cls(min_replicas=1, max_replicas=AUTO_MAX_REPLICAS)

    @property
    def start_replicas(self) -> int:
        return self.initial_replicas if self.initial_replicas is not None else self.min_replicas


def default_proxy_workers() -> int:
    """One proxy process per two cores (the rest serve replicas), between 1 and 8."""
    import os

    return max(1, min(8, (os.cpu_count() or 1) // 2))


@dataclass(frozen=True, kw_only=True)
class HTTPOptions:
    """Ray Serve's `HTTPOptions`, plus surge's body-size limit."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    root_path: str = ""
    request_timeout_s: float | None = None
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    request_header_timeout_s: float = DEFAULT_REQUEST_HEADER_TIMEOUT_S
    request_body_timeout_s: float = DEFAULT_REQUEST_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    location: str = "EveryNode"
    proxy_workers: int | None = None  # None: default_proxy_workers()
    # TLS (Ray Serve's and uvicorn's names). A certificate turns the port into HTTPS only;
    # the files are checked when the options are given (proxy/tls.py) and read by each
    # proxy worker. ssl_ca_certs verifies client certificates (mutual TLS): then
    # ssl_cert_reqs defaults to "required".
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str | int | None = None  # "none" | "optional" | "required" (or 0/1/2)

    def __post_init__(self) -> None:
        _require(isinstance(self.port, int) and not isinstance(self.port, bool)
                 and 0 <= self.port <= 65535,
                 f"port must be an integer in 0..65535, got {self.port!r}.")
        _number("request_timeout_s", self.request_timeout_s, minimum=0, allow_none=True)
        _number("keep_alive_timeout_s", self.keep_alive_timeout_s, minimum=0)
        _number("max_body_bytes", self.max_body_bytes, minimum=0)
        _require(float(self.max_body_bytes).is_integer(),
                 f"max_body_bytes must be a whole number of bytes, got {self.max_body_bytes!r}.")
        object.__setattr__(self, "max_body_bytes", int(self.max_body_bytes))  # 1e6 is fine
        _integer("max_header_bytes", self.max_header_bytes, minimum=1024)
        _number("request_header_timeout_s", self.request_header_timeout_s, minimum=0.1)
        _number("request_body_timeout_s", self.request_body_timeout_s, minimum=0.1)
        _integer("max_connections", self.max_connections, minimum=1)
        if self.proxy_workers is not None:
            _integer("proxy_workers", self.proxy_workers, minimum=1)
        _require(self.location in PROXY_LOCATIONS,
                 f"proxy location must be one of {PROXY_LOCATIONS}, got {self.location!r}.")
        self._check_tls_shape()

    def _check_tls_shape(self) -> None:
        """The TLS keys fit together; proxy/tls.py checks the files themselves."""
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, str) and bool(value)),
                     f"{name} must be the path of a PEM file, got {value!r}.")
        _require(self.ssl_certfile is not None or (self.ssl_keyfile is None
                                                   and self.ssl_ca_certs is None),
                 "ssl_keyfile and ssl_ca_certs need ssl_certfile (the server's certificate).")
        reqs = self.ssl_cert_reqs
        if isinstance(reqs, int) and not isinstance(reqs, bool) and reqs in (0, 1, 2):
            reqs = CERT_REQS[reqs]  # uvicorn's spelling: ssl.CERT_NONE/OPTIONAL/REQUIRED
        _require(reqs is None or reqs in CERT_REQS,
                 f"ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, got "
                 f"{self.ssl_cert_reqs!r}.")
        _require(reqs in (None, "none") or self.ssl_ca_certs is not None,
                 f"ssl_cert_reqs {reqs!r} needs ssl_ca_certs: the CA bundle that client "
                 "certificates are verified against.")
        if reqs is None:
            reqs = "required" if self.ssl_ca_certs is not None else "none"
        object.__setattr__(self, "ssl_cert_reqs", reqs)

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None


RAY_ACTOR_OPTION_KEYS_IMPLEMENTED = ("num_cpus", "num_gpus", "runtime_env", "resources")
RAY_ACTOR_OPTION_KEYS_ACCEPTED = (
    "memory", "accelerator_type", "max_concurrency", "object_store_memory",
    "scheduling_strategy", "label_selector", "max_restarts", "max_task_retries",
    "fallback_strategy",
)


@dataclass(frozen=True, kw_only=True)
class BackpressureConfig:
    """Ray Serve's `BackpressureConfig`: how an HTTP request over the queue budget is
    answered. `retry_after_s` None: surge's own estimate from the deployment's drain rate
    (Ray sends no Retry-After then); set: that value, rounded up."""

    status_code: int = 503
    retry_after_s: float | None = None

    def __post_init__(self) -> None:
        _require(self.status_code in (503, 429) and not isinstance(self.status_code, bool),
                 f"backpressure_config.status_code must be 503 or 429, got "
                 f"{self.status_code!r}.")
        _number("backpressure_config.retry_after_s", self.retry_after_s, minimum=0,
                allow_none=True)
        _require(self.retry_after_s is None or math.isfinite(self.retry_after_s),
                 "backpressure_config.retry_after_s must be finite.")


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
                                  f"{_suggest(key, list(RAY_ACTOR_OPTION_KEYS_IMPLEMENTED))}")
        if ignored:
            log.warning("%s: %s accepted but not used by the local backend", where,
                        ", ".join(sorted(ignored)))
        runtime_env = options.get("runtime_env") or {}
        _require(isinstance(runtime_env, Mapping),
                 f"{where}.runtime_env must be a mapping, got {type(runtime_env).__name__}.")
        runtime_env = dict(runtime_env)
        env_vars = runtime_env.pop("env_vars", None) or {}
        if runtime_env:
            log.warning("%s.runtime_env: %s not supported by surge; only env_vars is "
                        "honoured", where, ", ".join(sorted(runtime_env)))
        _require(isinstance(env_vars, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()),
            f"{where}.runtime_env.env_vars must map strings to strings.")
        num_cpus = options.get("num_cpus", 1.0)
        num_gpus = options.get("num_gpus", 0.0)
        _number(f"{where}.num_cpus", num_cpus, minimum=0)
        _number(f"{where}.num_gpus", num_gpus, minimum=0)
        custom = options.get("resources") or {}
        _require(isinstance(custom, Mapping) and all(
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
    autoscaling_config: AutoscalingConfig | None = None
    user_config: Any = None
    resources: ReplicaResources = field(default_factory=ReplicaResources)
    health_check_period_s: float = DEFAULT_HEALTH_CHECK_PERIOD_S
    health_check_timeout_s: float = DEFAULT_HEALTH_CHECK_TIMEOUT_S
    graceful_shutdown_timeout_s: float = DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S
    graceful_shutdown_wait_loop_s: float = DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S
    backpressure_config: BackpressureConfig = field(default_factory=BackpressureConfig)
    max_constructor_retry_count: int = DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT
    # Rolling updates (policy/reconcile.py). None: surge's default, every replacement at
    # once and the old replicas serving until theirs run (no capacity dip).
    rolling_update_percentage: float | None = None  # Ray's: fraction replaced at a time
    max_surge_percent: int | None = None  # Ray's: extra replicas allowed during it

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and bool(self.name) and "#" not in self.name,
                 f"deployment name must be a non-empty string without '#', got {self.name!r}.")
        if self.num_replicas is not None:
            _number("num_replicas", self.num_replicas, minimum=0)
            _require(isinstance(self.num_replicas, int), "num_replicas must be an integer.")
        _integer("max_ongoing_requests", self.max_ongoing_requests, minimum=1)
        _require(isinstance(self.max_queued_requests, int)
                 and not isinstance(self.max_queued_requests, bool)
                 and (self.max_queued_requests == -1 or self.max_queued_requests >= 0),
                 f"max_queued_requests must be -1 (no explicit limit) or an integer >= 0, got "
                 f"{self.max_queued_requests!r}.")
        for name in ("health_check_period_s", "health_check_timeout_s",
                     "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s"):
            _number(name, getattr(self, name), minimum=0)
        if isinstance(self.backpressure_config, Mapping):
            object.__setattr__(self, "backpressure_config", from_mapping(
                BackpressureConfig, self.backpressure_config, "backpressure_config"))
        elif self.backpressure_config is None:
            object.__setattr__(self, "backpressure_config", BackpressureConfig())
        _require(isinstance(self.backpressure_config, BackpressureConfig),
                 "backpressure_config must be a dict or BackpressureConfig.")
        _integer("max_constructor_retry_count", self.max_constructor_retry_count, minimum=1)
        rate = self.rolling_update_percentage
        _require(rate is None or (_is_number(rate) and 0 < rate <= 1),
                 f"rolling_update_percentage must be in (0.0, 1.0], got {rate!r}.")
        _integer("max_surge_percent", self.max_surge_percent, minimum=0, allow_none=True)
        _require(self.max_surge_percent is None or self.max_surge_percent <= 100,
                 f"max_surge_percent must be in [0, 100], got {self.max_surge_percent!r}.")

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
        autoscaling = from_mapping(AutoscalingConfig, merged, f"{where}.autoscaling_config")
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
        raise ConfigError(f"{where}.num_replicas must be an integer or 'auto', "
                          f"got {num_replicas!r}.")
    elif num_replicas is not None and autoscaling is not None:
        raise ConfigError(f"{where}: num_replicas and autoscaling_config cannot both be set; "
                          "use num_replicas='auto' or drop one of them.")
    resources = ReplicaResources.from_ray_actor_options(
        options.pop("ray_actor_options", None), f"{where}.ray_actor_options")
    known = {f.name for f in dataclasses.fields(DeploymentConfig)} - {"name", "resources"}
    for key in options:
        if key not in known:
            raise ConfigError(f"{where}: unknown option {key!r}.{_suggest(key, sorted(known))}")
    try:
        return DeploymentConfig(name=name, num_replicas=num_replicas,
                                autoscaling_config=autoscaling, resources=resources, **options)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class DeploymentSpec:
    """A deployment as sent to the controller: its config and its pickled code."""

    config: DeploymentConfig
    target_blob: bytes
    init_blob: bytes

    @property
    def code_version(self) -> str:
        """Changes when replicas must be replaced (code, args, resources, limits)."""
        import hashlib

        c = self.config
        digest = hashlib.sha256(self.target_blob + b"\0" + self.init_blob)
        digest.update(repr((c.max_ongoing_requests, c.resources, c.graceful_shutdown_timeout_s,
                            c.health_check_period_s, c.health_check_timeout_s)).encode())
        return digest.hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class AuthConfig:
    """Bearer-token authentication of one application's HTTP route (read by api/auth.py).

    It says where the tokens are, never what they are: `tokens_env` names an environment
    variable of the process that deploys (tokens separated by commas or whitespace),
    `tokens_file` a file with one token per line (`#` starts a comment). From Python,
    `tokens` may give them directly (say, fetched from a secrets manager); a config file
    cannot. A request needs `Authorization: Bearer <one of them>`.
    """

    tokens_env: str | None = None
    tokens_file: str | None = None
    tokens: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        env = self.tokens_env
        _require(env is None or (isinstance(env, str) and env.isidentifier()),
                 f"tokens_env must name an environment variable (like APP_TOKENS), "
                 f"got {env!r}.")
        _require(self.tokens_file is None or (isinstance(self.tokens_file, str)
                                              and bool(self.tokens_file)),
                 f"tokens_file must be the path of a file, got {self.tokens_file!r}.")
        _require(isinstance(self.tokens, list | tuple)
                 and all(isinstance(t, str) for t in self.tokens),
                 "tokens must be a list of strings.")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        _require(env is not None or self.tokens_file is not None or bool(self.tokens),
                 "auth needs tokens_env (an environment variable holding the tokens) or "
                 "tokens_file (a file with one token per line).")


@dataclass(frozen=True, kw_only=True)
class AppSpec:
    """One application: its route, its ingress deployment, and all its deployments."""

    name: str
    route_prefix: str | None
    ingress: str
    deployments: tuple[DeploymentSpec, ...]
    sys_path: tuple[str, ...] = ()
    auth: AccessTokens | None = None  # None: HTTP requests need no credentials

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str), "application name must be a string.")
        if self.route_prefix is not None:
            _require(isinstance(self.route_prefix, str) and self.route_prefix.startswith("/"),
                     f"route_prefix must start with '/', got {self.route_prefix!r}.")
            _require(self.route_prefix == "/" or not self.route_prefix.endswith("/"),
                     f"route_prefix must not end with '/', got {self.route_prefix!r}.")
        names = [d.config.name for d in self.deployments]
        _require(len(names) == len(set(names)),
                 f"application {self.name!r} has two deployments with the same name; give "
                 "one of them another name with .options(name=...).")
        _require(self.ingress in names, f"ingress {self.ingress!r} is not among the deployments.")
