"""`surge config lint`: the configuration traps of Ray Serve (and surge), one rule each.

Each rule looks at one deployment's effective options (the decorator's when the
import path is importable, with the config's on top; Ray's defaults for the rest) or
at the top-level options, and returns findings
`LEVEL RULE-ID app/deployment.field: what is wrong (fix: what to do)`.
ERROR: the config cannot do what it says (e.g. autoscaling capped at 1 replica).
WARNING: a default or a combination that hurts under a burst. INFO: worth knowing.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from surge.api.config_apply import (
    import_application,
    merged_options,
    search_path,
    walk_deployments,
)
from surge.api.config_file import AppConfig, DeploymentOverride, ServeConfig
from surge.config import (
    DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S,
    DEFAULT_MAX_ONGOING_REQUESTS,
    DEFAULT_MAX_QUEUE_WAIT_S,
    QUEUE_SAFETY_LIMIT,
    AutoscalingConfig,
)
from surge.errors import ConfigError

__all__ = ["RULES", "Finding", "lint_config"]

LEVELS = ("ERROR", "WARNING", "INFO")
# Load balancers close idle connections after ~60 s (AWS ALB's default); the proxy's
# keep-alive must outlast it or the balancer reuses a connection the proxy just closed.
LOAD_BALANCER_IDLE_S = 60.0
SLOW_UPSCALE_S = 10.0
# Replicas' num_cpus beyond this many times the node's cores: each replica's thread pools
# are num_cpus wide (replica/threads.py), and past the cores more replicas add latency,
# not throughput; up to 2x leaves room for replicas that mostly wait (I/O, accelerators).
OVERSUBSCRIBED = 2.0

# rule id -> (level, one-line title): docs/configuration.md's table is made from this.
RULES: dict[str, tuple[str, str]] = {
    "SRG001": ("WARNING", "a Ray Serve key surge accepts but ignores (or an old name)"),
    "SRG002": ("WARNING", "import_path not importable here: code-level checks skipped"),
    "SRG003": ("ERROR", "a deployment in the config is not in the application"),
    "SRG101": ("ERROR", "autoscaling_config without max_replicas: capped at 1 replica"),
    "SRG102": ("ERROR", "max_ongoing_requests below target_ongoing_requests"),
    "SRG103": ("ERROR", "@serve.batch max_batch_size above max_ongoing_requests"),
    "SRG104": ("WARNING", "max_queued_requests unbounded (-1) and per caller in Ray"),
    "SRG105": ("WARNING", "upscale_delay_s of 10 s or more (Ray's default: 30 s)"),
    "SRG106": ("WARNING", "min_replicas 0: cold start on the first request"),
    "SRG107": ("WARNING", "downscale_delay_s shorter than upscale_delay_s: flapping"),
    "SRG108": ("WARNING", "http_options.request_timeout_s unset: requests never time out"),
    "SRG109": ("WARNING", "graceful_shutdown_timeout_s shorter than request_timeout_s"),
    "SRG110": ("WARNING", "keep_alive_timeout_s shorter than a load balancer's idle timeout"),
    "SRG111": ("WARNING", "max_replicas below min_replicas of a schedule window"),
    "SRG112": ("INFO", "fixed num_replicas: no autoscaling under a burst"),
    "SRG113": ("WARNING", "replicas' num_cpus add up to more than twice this node's cores"),
}


@dataclass(frozen=True, order=True)
class Finding:
    where: str  # app/deployment.field, app.field, or a top-level key path
    rule: str
    message: str
    fix: str
    line: int | None = field(default=None, compare=False)

    @property
    def level(self) -> str:
        return RULES[self.rule][0]

    def __str__(self) -> str:
        return f"{self.level} {self.rule} {self.where}: {self.message} (fix: {self.fix})"


@dataclass(frozen=True)
class DeploymentView:
    """What one rule sees: effective options, the config entry, the code when imported."""

    app: AppConfig
    name: str
    options: Mapping[str, Any]
    override: DeploymentOverride | None
    target: Any = None  # the class or function, when the import path was importable

    def where(self, key: str) -> str:
        return f"{self.app.name}/{self.name}.{key}"

    @property
    def autoscaling(self) -> Mapping[str, Any] | None:
        value = self.options.get("autoscaling_config")
        if isinstance(value, AutoscalingConfig):
            default = AutoscalingConfig()
            return {k: getattr(value, k) for k in value.__dataclass_fields__
                    if getattr(value, k) != getattr(default, k)}
        if value is None and self.options.get("num_replicas") == "auto":
            return {"min_replicas": 1, "max_replicas": 100}
        return value if isinstance(value, Mapping) else None

    def scaling(self, key: str) -> Any:
        scaling = self.autoscaling or {}
        if key in scaling:
            return scaling[key]
        if self.options.get("num_replicas") == "auto" and key == "max_replicas":
            return 100
        return getattr(AutoscalingConfig(), key)

    @property
    def policy_name(self) -> str:
        policy = (self.autoscaling or {}).get("policy") or {}
        function = policy.get("policy_function") if isinstance(policy, Mapping) else None
        return str(function or "proactive")


def lint_config(config: ServeConfig, *, import_code: bool = True,
                cores: int | None = None) -> list[Finding]:
    """The findings; `cores`: the node's (os.cpu_count() when None)."""
    findings = [_unimplemented(config, warning) for warning in config.warnings]
    findings += _top_level(config)
    every: list[DeploymentView] = []
    for app in config.applications:
        views, problems = _views(config, app, import_code)
        findings += problems
        every += views
        for view in views:
            for rule in DEPLOYMENT_RULES:
                findings += rule(view, config)
    findings += _oversubscribed(every, config, cores or os.cpu_count() or 1)
    return findings


def _unimplemented(config: ServeConfig, warning: str) -> Finding:
    location, _, message = warning.partition(": ")
    path, _, message = message.partition(": ")
    line = location.rpartition(":")[2]
    fix = ("rename it" if "old name" in message
           else "remove it, or keep it for Ray Serve: surge ignores it")
    return Finding(path, "SRG001", message.replace("; it is ignored", ""), fix,
                   int(line) if line.isdigit() else None)


def _views(config: ServeConfig, app: AppConfig,
           import_code: bool) -> tuple[list[DeploymentView], list[Finding]]:
    yaml_only = [DeploymentView(app, o.name, dict(o.options), o) for o in app.deployments]
    if not import_code:
        return yaml_only, []
    try:
        root = import_application(app.import_path, app.args, search_path(config))
    except (ConfigError, Exception) as exc:  # user code may raise anything on import
        return yaml_only, [Finding(f"{app.name}.import_path", "SRG002",
                                   f"cannot import {app.import_path}: {exc}",
                                   "run lint where the application's code and "
                                   "dependencies import", config.line_of(app.path))]
    by_name = {o.name: o for o in app.deployments}
    nodes = walk_deployments(root)
    names = {n.deployment.name for n in nodes}
    problems = [Finding(f"{app.name}/{o.name}.name", "SRG003",
                        f"application {app.name!r} has no deployment {o.name!r} "
                        f"(it has {', '.join(sorted(names))})",
                        "use one of those names", config.line_of((*o.path, "name")))
                for o in app.deployments if o.name not in names]
    views = []
    for node in nodes:
        override = by_name.get(node.deployment.name)
        options = merged_options(node.deployment._options,
                                 override.options if override else {}, {})
        views.append(DeploymentView(app, node.deployment.name, options, override,
                                    node.deployment.func_or_class))
    return views, problems


# -- top-level rules ------------------------------------------------------------------------


def _top_level(config: ServeConfig) -> list[Finding]:
    http = config.http_options
    findings = []
    line = config.line_of(("http_options", "request_timeout_s"))
    if http.request_timeout_s is None:
        findings.append(Finding(
            "http_options.request_timeout_s", "SRG108",
            "no request timeout: a stuck replica holds its clients (and their queue slots) "
            "forever", "set http_options.request_timeout_s above your slowest normal "
            "request, e.g. 30", line))
    if http.keep_alive_timeout_s < LOAD_BALANCER_IDLE_S:
        findings.append(Finding(
            "http_options.keep_alive_timeout_s", "SRG110",
            f"{http.keep_alive_timeout_s:g} s is shorter than a load balancer's idle "
            f"timeout (AWS ALB: {LOAD_BALANCER_IDLE_S:g} s), so it may reuse a connection "
            "the proxy just closed: sporadic 502s",
            "set keep_alive_timeout_s above the balancer's idle timeout (Ray's default is "
            "90)", config.line_of(("http_options", "keep_alive_timeout_s"))))
    return findings


# -- deployment rules -----------------------------------------------------------------------


def _line(view: DeploymentView, config: ServeConfig, *keys: str) -> int | None:
    if view.override is None:
        return config.line_of((*view.app.path, "import_path"))
    for end in range(len(keys), 0, -1):
        path = (*view.override.path, *keys[:end])
        if path in config.lines:
            return config.lines[path]
    return config.line_of(view.override.path)


def _max_replicas(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    scaling = view.autoscaling
    if scaling is None or "max_replicas" in scaling or view.options.get("num_replicas") == "auto":
        return []
    return [Finding(view.where("autoscaling_config.max_replicas"), "SRG101",
                    "autoscaling_config has no max_replicas, and Ray's default is 1: this "
                    "deployment can never scale above 1 replica",
                    "set autoscaling_config.max_replicas to the most replicas you can afford",
                    _line(view, config, "autoscaling_config"))]


def _max_ongoing(view: DeploymentView) -> int:
    value = view.options.get("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)
    return int(value)


def _target_above_max(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.autoscaling is None:
        return []
    target = float(view.scaling("target_ongoing_requests"))
    limit = _max_ongoing(view)
    if limit >= target:
        return []
    return [Finding(view.where("max_ongoing_requests"), "SRG102",
                    f"max_ongoing_requests {limit} is below target_ongoing_requests "
                    f"{target:g}: a replica can never reach the target, so the autoscaler "
                    "sees it under-loaded while requests queue",
                    f"raise max_ongoing_requests to at least {target:g} (about 2-3x the "
                    "target leaves headroom), or lower target_ongoing_requests",
                    _line(view, config, "max_ongoing_requests"))]


def batch_sizes(target: Any) -> dict[str, int]:
    """`@serve.batch` methods (or the function itself) and their max_batch_size."""
    found: dict[str, int] = {}
    members: list[tuple[str, Any]] = [("__call__", target)] if inspect.isfunction(target) \
        else inspect.getmembers(target) if inspect.isclass(target) else []
    for name, member in members:
        batch = getattr(member, "__surge_batch__", None)
        if isinstance(batch, Mapping) and isinstance(batch.get("max_batch_size"), int):
            found[name] = batch["max_batch_size"]
    return found


def _batch_above_max(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    limit = _max_ongoing(view)
    return [Finding(view.where("max_ongoing_requests"), "SRG103",
                    f"@serve.batch on {method}() has max_batch_size {size}, above "
                    f"max_ongoing_requests {limit}: a replica holds at most {limit} requests, "
                    f"so a batch never fills and every batch waits out batch_wait_timeout_s",
                    f"set max_ongoing_requests >= {size} (a multiple of max_batch_size), or "
                    f"lower max_batch_size", _line(view, config, "max_ongoing_requests"))
            for method, size in sorted(batch_sizes(view.target).items()) if size > limit]


def _unbounded_queue(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.options.get("max_queued_requests", -1) != -1:
        return []
    return [Finding(view.where("max_queued_requests"), "SRG104",
                    "max_queued_requests is -1: Ray Serve queues without bound, and its "
                    "limit counts per caller (each proxy and handle), so a burst turns into "
                    "timeouts instead of fast 503s; surge bounds this queue by time instead "
                    f"(max_queue_wait_s, {_queue_wait(view)}) and by {QUEUE_SAFETY_LIMIT:,} "
                    "per router",
                    "on Ray, set max_queued_requests to what one deployment may hold "
                    "waiting, e.g. max_replicas x max_ongoing_requests (on surge an explicit "
                    "count replaces the wait bound)", _line(view, config))]


def _queue_wait(view: DeploymentView) -> str:
    wait = view.options.get("max_queue_wait_s", DEFAULT_MAX_QUEUE_WAIT_S)
    return "off" if wait is None else f"{wait:g} s"


def _upscale_delay(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.autoscaling is None:
        return []
    delay = float(view.scaling("upscale_delay_s"))
    if delay < SLOW_UPSCALE_S:
        return []
    given = "upscale_delay_s" in view.autoscaling
    source = f"is {delay:g} s" if given else f"defaults to {delay:g} s"
    if view.policy_name == "proactive":
        tail = ("surge's proactive policy skips it only for surges above 20% of the "
                "target; slower growth waits for it")
    else:
        tail = f"the {view.policy_name} policy adds no replica for {delay:g} s of overload"
    return [Finding(view.where("autoscaling_config.upscale_delay_s"), "SRG105",
                    f"upscale_delay_s {source}: {tail}",
                    "set upscale_delay_s to a few seconds (e.g. 3)",
                    _line(view, config, "autoscaling_config", "upscale_delay_s"))]


def _cold_start(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.autoscaling is None or int(view.scaling("min_replicas")) != 0:
        return []
    return [Finding(view.where("autoscaling_config.min_replicas"), "SRG106",
                    "min_replicas is 0: after an idle period the first request waits for a "
                    "replica to start and load its model (a cold start)",
                    "set min_replicas >= 1 for latency-sensitive traffic, or accept the first "
                    "request's delay", _line(view, config, "autoscaling_config",
                                             "min_replicas"))]


def _flapping(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.autoscaling is None:
        return []
    up, down = float(view.scaling("upscale_delay_s")), float(view.scaling("downscale_delay_s"))
    if down >= up:
        return []
    return [Finding(view.where("autoscaling_config.downscale_delay_s"), "SRG107",
                    f"downscale_delay_s {down:g} s is shorter than upscale_delay_s {up:g} s: "
                    "replicas are removed faster than they are added, so a bursty load "
                    "flaps between too few and too many",
                    "make downscale_delay_s longer than upscale_delay_s (Ray's default is "
                    "600 s)", _line(view, config, "autoscaling_config", "downscale_delay_s"))]


def _drain_shorter_than_timeout(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    timeout = config.http_options.request_timeout_s
    grace = float(view.options.get("graceful_shutdown_timeout_s",
                                   DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S))
    if timeout is None or grace >= timeout:
        return []
    return [Finding(view.where("graceful_shutdown_timeout_s"), "SRG109",
                    f"graceful_shutdown_timeout_s {grace:g} s is shorter than "
                    f"request_timeout_s {timeout:g} s: a replica stopped by a scale-down or "
                    "a rolling update kills requests that were still allowed to finish",
                    f"set graceful_shutdown_timeout_s >= {timeout:g}",
                    _line(view, config, "graceful_shutdown_timeout_s"))]


def _schedule_above_max(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.autoscaling is None:
        return []
    top = int(view.scaling("max_replicas"))
    floors = [int(w.get("min_replicas") or 0) for w in view.scaling("schedule") or ()]
    if not floors or max(floors) <= top:
        return []
    return [Finding(view.where("autoscaling_config.schedule"), "SRG111",
                    f"a schedule window asks for min_replicas {max(floors)}, above "
                    f"max_replicas {top}: surge raises the ceiling during that window",
                    f"set max_replicas >= {max(floors)} so the config says what runs",
                    _line(view, config, "autoscaling_config", "schedule"))]


def _fixed_replicas(view: DeploymentView, config: ServeConfig) -> list[Finding]:
    if view.autoscaling is not None:
        return []
    count = view.options.get("num_replicas", 1)
    return [Finding(view.where("num_replicas"), "SRG112",
                    f"a fixed {count} replica(s): a burst above their capacity is queued or "
                    "rejected, never absorbed",
                    "use autoscaling_config (min_replicas, max_replicas) or "
                    "num_replicas: auto", _line(view, config, "num_replicas"))]


def _most_replicas(view: DeploymentView) -> int:
    if view.autoscaling is not None:
        return int(view.scaling("max_replicas"))
    count = view.options.get("num_replicas", 1)
    return count if isinstance(count, int) else 1


def _num_cpus(view: DeploymentView) -> float:
    actor = view.options.get("ray_actor_options") or {}
    num_cpus = actor.get("num_cpus", 1.0) if isinstance(actor, Mapping) else 1.0
    return float(num_cpus) if isinstance(num_cpus, int | float) else 1.0


def _oversubscribed(views: list[DeploymentView], config: ServeConfig,
                    cores: int) -> list[Finding]:
    """The whole config's replicas at their most, against this node's cores."""
    demand = sorted(((_most_replicas(v) * _num_cpus(v), v) for v in views),
                    key=lambda pair: -pair[0])
    total = sum(cpus for cpus, _ in demand)
    if total <= OVERSUBSCRIBED * cores:
        return []
    top = demand[0][1]
    parts = ", ".join(f"{v.app.name}/{v.name} {_most_replicas(v)} x {_num_cpus(v):g}"
                      for cpus, v in demand[:3] if cpus > 0)
    return [Finding(top.where("ray_actor_options.num_cpus"), "SRG113",
                    f"the replicas' num_cpus add up to {total:g} at their most ({parts}), "
                    f"{total / cores:.1f}x this node's {cores} cores: each replica's thread "
                    "pools are num_cpus wide, and past the cores more replicas add latency, "
                    "not throughput",
                    f"keep the sum within {OVERSUBSCRIBED:g}x the cores: lower max_replicas "
                    "(or num_replicas), or num_cpus; on a Ray cluster, count its nodes' "
                    "cores instead", _line(top, config, "ray_actor_options", "num_cpus"))]


DEPLOYMENT_RULES: tuple[Callable[[DeploymentView, ServeConfig], list[Finding]], ...] = (
    _max_replicas, _target_above_max, _batch_above_max, _unbounded_queue, _upscale_delay,
    _cold_start, _flapping, _drain_shorter_than_timeout, _schedule_above_max, _fixed_replicas,
)
