"""The autoscaler's shell: load reports in, one autoscaling step per deployment per tick.

Routers (proxies and handles) push per-deployment counters every 0.1 s, only when
something changed: arrivals (offered, rejected included), completions, rejections, and
their queued and in-flight gauges. `LoadTracker` sums them into one `LoadSample` per
tick and keeps the last minute; `Autoscaler.step` runs policy.autoscale_step (the step
the simulator runs too) with the deployment's policy (policy/resolve.py) and remembers
the decisions for status and metrics.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from surge.config import AutoscalingConfig
from surge.model import DeploymentId, LoadReport
from surge.policy.autoscale_step import Step, StepInputs, autoscale_step
from surge.policy.autoscaling import Decision, DecisionKind, LoadSample, PolicyState
from surge.policy.resolve import HISTORY_S, Policy, resolve_policy

__all__ = ["Autoscaler", "DecisionRecord", "LoadTracker"]

log = logging.getLogger("surge.autoscaler")


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

    def peek(self, deployment: DeploymentId, now: float) -> LoadSample | None:
        """The bucket still open, as a sample (for a decision between ticks), or None."""
        series = self.series.get(deployment)
        since = series[-1].t if series else now - self.tick_s
        if now - since < 0.005:
            return None
        arrivals, completions, rejections = self._counters.get(deployment, [0, 0, 0])
        gauges = self._gauges.get(deployment, {}).values()
        return LoadSample(t=now, arrivals=arrivals, completions=completions,
                          rejections=rejections, queued=sum(q for q, _ in gauges),
                          ongoing=sum(f for _, f in gauges), duration_s=now - since)

    def rates(self, deployment: DeploymentId, seconds: float = 1.0) -> dict[str, float]:
        """Offered/completed/rejected per second over the last `seconds`; queued, ongoing now."""
        series = self.series.get(deployment, ())
        recent = list(series)[-max(1, round(seconds / self.tick_s)):]
        span = sum(s.duration_s for s in recent)
        if not recent or span <= 0:
            return {}
        return {"offered_per_s": sum(s.arrivals for s in recent) / span,
                "completed_per_s": sum(s.completions for s in recent) / span,
                "rejected_per_s": sum(s.rejections for s in recent) / span,
                "queued": recent[-1].queued, "ongoing": recent[-1].ongoing}

    def drop(self, deployment: DeploymentId) -> None:
        self.series.pop(deployment, None)
        self._counters.pop(deployment, None)
        self._gauges.pop(deployment, None)


@dataclass
class DecisionRecord:
    at: float
    deployment: DeploymentId
    previous: int
    target: int
    kind: DecisionKind
    reason: str
    signals: Mapping[str, float]


def _failing(exc: Exception) -> Policy:
    """A policy that could not be built: each step reports it as the policy's failure."""
    def policy(*_: object) -> Decision:
        raise exc

    return policy


class Autoscaler:
    """Runs policy.autoscale_step for each autoscaled deployment and keeps what it decided."""

    def __init__(self) -> None:
        self.states: dict[DeploymentId, PolicyState] = {}
        self.policies: dict[DeploymentId, tuple[AutoscalingConfig, Policy]] = {}
        self.decisions: deque[DecisionRecord] = deque(maxlen=500)
        self.last: dict[DeploymentId, Decision] = {}

    def __repr__(self) -> str:
        return f"<Autoscaler deployments={len(self.policies)} decisions={len(self.decisions)}>"

    def prepare(self, deployment: DeploymentId, config: AutoscalingConfig) -> Policy:
        """The deployment's policy, built once per policy spec (raises ConfigError if bad)."""
        cached = self.policies.get(deployment)
        if cached is None or cached[0].policy != config.policy:
            cached = (config, resolve_policy(config, deployment))
            self.policies[deployment] = cached
        return cached[1]

    def step(self, deployment: DeploymentId, config: AutoscalingConfig,
             inputs: StepInputs) -> Step:
        state = self.states.get(deployment, PolicyState())
        try:
            policy = self.prepare(deployment, config)
        except Exception as exc:  # deploys check it first; a user's class may still raise
            policy = _failing(exc)
        step = autoscale_step(policy, config, state, inputs)
        decision = step.decision
        if step.failed:
            log.error("autoscaling policy of %s: %s", deployment, decision.reason)
            return step
        self.states[deployment] = decision.state
        self.last[deployment] = decision
        if decision.target != inputs.target:
            self.decisions.append(DecisionRecord(inputs.now, deployment, inputs.target,
                                                 decision.target, decision.kind,
                                                 decision.reason, decision.signals))
            log.info("autoscaling %s: %d -> %d (%s)", deployment, inputs.target,
                     decision.target, decision.reason)
        return step

    def forget(self, deployment: DeploymentId) -> None:
        self.states.pop(deployment, None)
        self.policies.pop(deployment, None)
        self.last.pop(deployment, None)
