"""The autoscaler's shell: load reports in, one autoscaling step per deployment per tick.

Routers (proxies and handles) push per-deployment counters every 0.1 s (less often when
there are many: policy/cadence.py), only when something changed: arrivals (offered,
rejected included), completions, rejections, and their queued and in-flight gauges.
`LoadTracker` sums them into one `LoadSample` per tick, each report's counters spread
over the time it covers by the router's clock (policy/load_spread.py; the share of a
report read after its buckets closed is added to them), and keeps the last minute;
`Autoscaler.step` runs policy.autoscale_step (the step the simulator runs too) with
the deployment's policy (policy/resolve.py) and remembers the decisions for status and
metrics. It also keeps each deployment's saturation state
(policy/saturation.py) between steps: an episode of node CPU saturation is logged once
when it begins and once when it ends, and its first held decision (NODE_SATURATED) is
recorded like a change of target, once per episode.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from surge.config import AutoscalingConfig
from surge.model import DeploymentId, LoadReport
from surge.policy.autoscale_step import Step, StepInputs, autoscale_step
from surge.policy.autoscaling import Decision, DecisionKind, LoadSample, PolicyState
from surge.policy.load_spread import ReportSpread, amend
from surge.policy.resolve import HISTORY_S, Policy, resolve_policy
from surge.policy.saturation import CLEAR_CPU, SaturationState

__all__ = ["Autoscaler", "DecisionRecord", "LoadTracker"]

log = logging.getLogger("surge.autoscaler")

_ZEROS = (0, 0, 0)


class LoadTracker:
    """Per-deployment sums of router reports, closed into one sample per tick.

    Counters (arrivals, completions, rejections) add up until the bucket closes, each
    report's spread over the time it covers when routers report less often than every
    tick (`report_interval_s`, what they were told); the gauges (queued, in flight) are
    each router's latest, and their sums are kept as reports replace them, so closing a
    bucket costs the same with 10 routers or 1,000. A sample lasts from the previous
    one's end (a tick that ran late makes a longer bucket, not a higher rate).
    """

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.report_interval_s = tick_s  # how often routers were told to report
        self.series: dict[DeploymentId, deque[LoadSample]] = {}
        self._counters: dict[DeploymentId, ReportSpread] = {}
        self._gauges: dict[DeploymentId, dict[int, tuple[int, int]]] = {}
        self._sums: dict[DeploymentId, list[int]] = {}  # queued, in flight over routers
        self._sources: dict[int, set[DeploymentId]] = {}  # router -> what it reported

    def report(self, source: int, report: LoadReport, now: float) -> None:
        did = report.deployment
        counters = self._counters.get(did)
        if counters is None:
            counters = self._counters[did] = ReportSpread(self.tick_s)
        late = counters.add(source, (report.arrivals, report.completions, report.rejections),
                            now, self.report_interval_s, report.measured_at, report.covers_s)
        if late is not None:  # read after its bucket closed (the loop stalled): amend it
            series = self.series.get(did)
            if series is not None:
                amend(series, late)
        gauges = self._gauges.get(did)
        if gauges is None:
            gauges = self._gauges[did] = {}
            self._sums[did] = [0, 0]
        sums = self._sums[did]
        old = gauges.get(source)
        if old is None:
            self._sources.setdefault(source, set()).add(did)
        else:
            sums[0] -= old[0]
            sums[1] -= old[1]
        gauges[source] = (report.queued, report.in_flight)
        sums[0] += report.queued
        sums[1] += report.in_flight

    def forget_source(self, source: int) -> None:
        for did in self._sources.pop(source, ()):
            counters = self._counters.get(did)
            if counters is not None:
                counters.forget(source)
            old = self._gauges.get(did, {}).pop(source, None)
            if old is not None:
                self._sums[did][0] -= old[0]
                self._sums[did][1] -= old[1]

    def close_bucket(self, now: float, deployments: Iterable[DeploymentId]) -> None:
        for deployment in deployments:
            counters = self._counters.get(deployment)
            arrivals, completions, rejections = (_ZEROS if counters is None
                                                 else counters.take(now))
            queued, ongoing = self._sums.get(deployment, _ZEROS)[:2]
            series = self.series.get(deployment)
            if series is None:
                series = self.series[deployment] = deque(maxlen=int(HISTORY_S / self.tick_s))
            # From the previous close (the loop sleeps a tick between closes: never less)
            lasted = max(now - series[-1].t, self.tick_s) if series else self.tick_s
            sample = LoadSample(t=now, arrivals=arrivals, completions=completions,
                                rejections=rejections, queued=queued, ongoing=ongoing,
                                duration_s=lasted)
            series.append(sample)

    def peek(self, deployment: DeploymentId, now: float) -> LoadSample | None:
        """The bucket still open, as a sample (for a decision between ticks), or None."""
        series = self.series.get(deployment)
        since = series[-1].t if series else now - self.tick_s
        if now - since < 0.005:
            return None
        counters = self._counters.get(deployment)
        arrivals, completions, rejections = _ZEROS if counters is None else counters.peek(now)
        queued, ongoing = self._sums.get(deployment, _ZEROS)[:2]
        return LoadSample(t=now, arrivals=arrivals, completions=completions,
                          rejections=rejections, queued=queued, ongoing=ongoing,
                          duration_s=now - since)

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
        self._sums.pop(deployment, None)
        for deployments in self._sources.values():
            deployments.discard(deployment)


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
        self.saturation: dict[DeploymentId, SaturationState] = {}
        self._held: set[DeploymentId] = set()  # episodes whose hold was recorded

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
        inputs = replace(inputs, saturation=self.saturation.get(deployment, SaturationState()))
        step = autoscale_step(policy, config, state, inputs)
        decision = step.decision
        if step.failed:
            log.error("autoscaling policy of %s: %s", deployment, decision.reason)
            return step
        self._note_saturation(deployment, inputs.saturation, step.saturation)
        self.states[deployment] = decision.state
        self.last[deployment] = decision
        held = decision.kind is DecisionKind.NODE_SATURATED
        if held and deployment not in self._held:  # once per episode
            self._held.add(deployment)
            self.decisions.append(DecisionRecord(inputs.now, deployment, inputs.target,
                                                 decision.target, decision.kind,
                                                 decision.reason, decision.signals))
        if decision.target != inputs.target:
            self.decisions.append(DecisionRecord(inputs.now, deployment, inputs.target,
                                                 decision.target, decision.kind,
                                                 decision.reason, decision.signals))
            log.info("autoscaling %s: %d -> %d (%s)", deployment, inputs.target,
                     decision.target, decision.reason)
        return step

    def _note_saturation(self, deployment: DeploymentId, before: SaturationState,
                         after: SaturationState) -> None:
        self.saturation[deployment] = after
        if after.saturated and not before.saturated:
            log.warning("autoscaling %s: the node's CPU is saturated (%s); no replicas will "
                        "be added on it until it is below %.0f%% busy", deployment,
                        after.reason, 100 * CLEAR_CPU)
        elif before.saturated and not after.saturated:
            self._held.discard(deployment)
            log.info("autoscaling %s: the node's CPU is no longer saturated", deployment)

    def saturated(self, deployment: DeploymentId) -> str:
        """Why the deployment's node counts as saturated now; "" when it does not."""
        state = self.saturation.get(deployment)
        return state.reason if state is not None and state.saturated else ""

    def forget(self, deployment: DeploymentId) -> None:
        self.states.pop(deployment, None)
        self.policies.pop(deployment, None)
        self.last.pop(deployment, None)
        self.saturation.pop(deployment, None)
        self._held.discard(deployment)
