"""The autoscaler's shell: load reports in, one policy decision per deployment per tick.

Routers (proxies and handles) push per-deployment counters every 0.1 s, only when
something changed: arrivals (offered, rejected included), completions, rejections, and
their queued and in-flight gauges. `LoadTracker` sums them into one `LoadSample` per
tick and keeps the last minute; `Autoscaler.decide` feeds them to the deployment's
policy (policy/autoscaling.py) and remembers the decisions for status and metrics.
"""

from __future__ import annotations

import importlib
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from surge.config import AutoscalingConfig
from surge.errors import ConfigError
from surge.model import DeploymentId, LoadReport
from surge.policy.autoscaling import (
    Decision,
    LoadSample,
    PolicyState,
    ProactiveSettings,
    ScalingInputs,
    UserPolicy,
    custom,
    proactive,
    ray_default,
)

__all__ = ["Autoscaler", "LoadTracker", "resolve_policy"]

log = logging.getLogger("surge.autoscaler")

HISTORY_S = 60.0
DEFAULT_POLICY = "proactive"


class LoadTracker:
    """Per-deployment sums of router reports, closed into one sample per tick."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.series: dict[DeploymentId, deque[LoadSample]] = {}
        self._counters: dict[DeploymentId, list[int]] = {}
        self._gauges: dict[DeploymentId, dict[int, tuple[int, int]]] = {}

    def report(self, source: int, report: LoadReport) -> None:
        counters = self._counters.setdefault(report.deployment, [0, 0, 0])
        counters[0] += report.arrivals
        counters[1] += report.completions
        counters[2] += report.rejections
        self._gauges.setdefault(report.deployment, {})[source] = (report.queued,
                                                                  report.in_flight)

    def forget_source(self, source: int) -> None:
        for gauges in self._gauges.values():
            gauges.pop(source, None)

    def close_bucket(self, now: float, deployments: list[DeploymentId]) -> None:
        for deployment in deployments:
            arrivals, completions, rejections = self._counters.pop(deployment, [0, 0, 0])
            gauges = self._gauges.get(deployment, {}).values()
            sample = LoadSample(t=now, arrivals=arrivals, completions=completions,
                                rejections=rejections, queued=sum(q for q, _ in gauges),
                                ongoing=sum(f for _, f in gauges), duration_s=self.tick_s)
            series = self.series.setdefault(deployment,
                                            deque(maxlen=int(HISTORY_S / self.tick_s)))
            series.append(sample)

    def drop(self, deployment: DeploymentId) -> None:
        self.series.pop(deployment, None)
        self._counters.pop(deployment, None)
        self._gauges.pop(deployment, None)


Policy = Callable[[ScalingInputs, AutoscalingConfig, PolicyState], Decision]


def resolve_policy(config: AutoscalingConfig, deployment: DeploymentId) -> Policy:
    """The policy named by `autoscaling_config.policy` (a built-in name or module:attr)."""
    spec: Mapping[str, Any] = config.policy or {}
    target = spec.get("policy_function", DEFAULT_POLICY) or DEFAULT_POLICY
    kwargs = dict(spec.get("policy_kwargs") or {})
    if target == "proactive":
        try:
            settings = ProactiveSettings.from_kwargs(kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"policy_kwargs of the proactive policy: {exc}") from None
        return lambda inputs, cfg, state: proactive(inputs, cfg, state, settings)
    if target == "ray_default":
        return ray_default
    user = _load_user_policy(target, kwargs)
    return lambda inputs, cfg, state: custom(user, inputs, cfg, state, deployment.name,
                                             deployment.app)


def _load_user_policy(target: Any, kwargs: dict[str, Any]) -> UserPolicy:
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        if not attr:
            raise ConfigError(f"autoscaling policy {target!r} is neither a built-in "
                              "('proactive', 'ray_default') nor a 'module:attribute' path")
        try:
            found = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load autoscaling policy {target!r}: {exc}") from None
    else:
        found = target
    if isinstance(found, type):
        found = found(**kwargs)
    elif kwargs:
        original = found
        found = lambda ctx: original(ctx, **kwargs)  # noqa: E731
    if not callable(found):
        raise ConfigError(f"autoscaling policy {target!r} is not callable")
    policy: UserPolicy = found
    return policy


@dataclass
class DecisionRecord:
    at: float
    deployment: DeploymentId
    previous: int
    target: int
    reason: str
    signals: Mapping[str, float]


class Autoscaler:
    def __init__(self) -> None:
        self.states: dict[DeploymentId, PolicyState] = {}
        self.policies: dict[DeploymentId, tuple[AutoscalingConfig, Policy]] = {}
        self.decisions: deque[DecisionRecord] = deque(maxlen=500)
        self.last: dict[DeploymentId, Decision] = {}

    def decide(self, deployment: DeploymentId, config: AutoscalingConfig,
               inputs: ScalingInputs) -> int:
        state = self.states.get(deployment, PolicyState())
        try:
            cached = self.policies.get(deployment)
            if cached is None or cached[0].policy != config.policy:
                cached = (config, resolve_policy(config, deployment))
                self.policies[deployment] = cached
            decision = cached[1](inputs, config, state)
        except Exception as exc:  # a user policy must not stop the control loop
            log.error("autoscaling policy of %s failed: %r; keeping %d replicas", deployment,
                      exc, inputs.target)
            return inputs.target
        self.states[deployment] = decision.state
        self.last[deployment] = decision
        if decision.target != inputs.target:
            self.decisions.append(DecisionRecord(inputs.now, deployment, inputs.target,
                                                 decision.target, decision.reason,
                                                 decision.signals))
            log.info("autoscaling %s: %d -> %d (%s)", deployment, inputs.target,
                     decision.target, decision.reason)
        return decision.target

    def forget(self, deployment: DeploymentId) -> None:
        self.states.pop(deployment, None)
        self.policies.pop(deployment, None)
        self.last.pop(deployment, None)
