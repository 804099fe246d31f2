"""The simulation loop: the controller's 0.1 s tick on virtual time, over flow and cluster.

Each tick (t0, t1]:

1. requests flow (sim/flow.py): one quiet step when nothing can wait, else fine steps
   of ~1 ms, with the cluster's lifecycle events (sim/cluster.py) applied at the first
   step at or after their time;
2. the flow's counters close into one `LoadSample` (what LoadTracker sums from the
   routers' reports) appended to a history as long as the policy can look back;
3. the controller's step: policy.autoscale_step (schedule floors, the deployment's
   policy, a failing policy keeping the target: the very function the controller
   calls) decides the target, and policy.reconcile turns target and replicas into
   actions, called whenever anything it reads changed (it is a pure function of those).

As in the controller (with the same cadence constants, policy.autoscale_step), a router
whose queue starts to grow reports within 5 ms and the policy decides at once on the
open bucket (at most every 20 ms); reports arrive every
0.1 s at any phase, so a tick's sample holds half its own load and half the tick's
before; and the controller's clock has a random offset (Ray's metric pushes fall at any
phase of the pulse). After the schedule ends the loop runs on, without arrivals, until
every request has ended. All randomness comes from the scenario's seed.

Approximations (docs/simulate.md lists them with their effect):

* requests are a fluid with integer counts (sim/flow.py): a request waits only when every
  slot is busy (routing is work-conserving); no per-replica imbalance, no Erlang-C
  queueing below capacity (negligible at 500 replicas x 10 slots, visible at 1-2);
* completions leave at in-flight / mean service time per second; each request's
  latency draws its own service time from the distribution, so latency percentiles are
  exact for the model but completion *timing* follows the mean;
* routers' queues are one FIFO holding the sum of their shares (they see equal traffic);
* timeouts happen in the queue only (a dispatched request always completes);
* proxies add a fixed `overhead_ms`; their CPU is not modelled;
* the controller decides `control.decision_s` after a router's queue starts to grow (by
  default the urgent report's 5 ms) and a ready replica is routable `control.fanout_s`
  later (by default at once): both measured on the real controller by
  bench/control_scale.py when the scenario names its figures (`control.measured`);
  process placement is a free GPU slot (standbys are routable after
  `standby_activation_s`).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from surge.config import AutoscalingConfig
from surge.loadtest.stats import ReplicaSample
from surge.model import DeploymentId
from surge.policy.autoscale_step import (
    TICK_S,
    URGENT_REPORT_DELAY_S,
    StepInputs,
    autoscale_step,
    urgent_decision_due,
    urgent_decision_wait,
)
from surge.policy.autoscaling import LoadSample, PolicyState, ProactiveSettings
from surge.policy.engine_load import EngineLoad
from surge.policy.reconcile import reconcile
from surge.policy.resolve import HISTORY_S, Policy, resolve_policy
from surge.policy.schedule import floors_at
from surge.sim.cluster import ClusterState
from surge.sim.event_flow import EventFlow
from surge.sim.flow import Flow
from surge.sim.llm_flow import LLMFlow
from surge.sim.mux_flow import MuxFlow
from surge.sim.scenario import Scenario
from surge.sim.traffic import TrafficShape

__all__ = ["TICK_S", "DecisionLog", "Simulation", "history_needed_s"]

_DAY_S = 24 * 3600
# Beyond this many fine steps per tick (a sub-0.5 ms service time), accuracy is bought
# too dearly: the step stays at 0.1 ms.
_MAX_STEPS_PER_TICK = 1000
# An event this close to a tick's end belongs to the next tick (float dust).
_EVENT_EPS = 1e-9
# The controller's clock at t=0 is drawn in [0, this): its phase against Ray's metric
# push cadence differs from run to run, as a real monotonic clock's does.
_CLOCK_OFFSET_RANGE_S = 3600.0
# An LLM run goes on this long after its trace at most, for its last streams to finish.
LLM_DRAIN_S = 600.0


@dataclass(frozen=True)
class DecisionLog:
    """A change of target, as the controller logs it."""

    t: float
    previous: int
    target: int
    reason: str
    kind: str = ""  # the decision's DecisionKind value


def history_needed_s(config: AutoscalingConfig, engines: bool = False) -> float:
    """How far back any built-in or Ray-style policy reads, capped at the controller's
    (`engines`: the deployment's engines report, as an LLM deployment's)."""
    spec = config.policy or {}
    windows = [1.0, config.look_back_period_s + max(config.metrics_interval_s, TICK_S)]
    if spec.get("policy_function") in (None, "", "proactive"):
        try:
            settings = ProactiveSettings.from_kwargs(dict(spec.get("policy_kwargs") or {}))
        except (TypeError, ValueError):
            settings = ProactiveSettings()
        windows += [settings.rate_window_s, settings.slope_window_s,
                    settings.max_slope_window_s]  # the slope's window grows with the lead
        if engines:  # an LLM deployment's service time, rate and slope
            windows.append(settings.max_service_window_s)
    return min(HISTORY_S, max(windows) + 0.5)


@dataclass
class Counters:
    quiet_ticks: int = 0
    fine_steps: int = 0
    policy_errors: int = 0
    reconciles: int = 0
    urgent_decisions: int = 0


@dataclass
class Simulation:
    """One run of a scenario; `run()` returns itself with everything filled in."""

    scenario: Scenario
    history_s: float | None = None  # None: as far back as the policy reads
    # What the engines report at a virtual time (an LLM model's EngineLoad), for the
    # step's engine signals and latency objectives; None: the deployment has no engines.
    engine_load: Callable[[float], EngineLoad | None] | None = None
    samples: deque[LoadSample] = field(init=False)
    replicas: list[ReplicaSample] = field(default_factory=list, init=False)
    decisions: list[DecisionLog] = field(default_factory=list, init=False)
    counters: Counters = field(default_factory=Counters, init=False)
    end_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        scenario = self.scenario
        seeds = np.random.SeedSequence(scenario.seed).spawn(6)
        self.points = math.ceil(scenario.traffic.schedule.duration_s / TICK_S - 1e-9)
        # after the schedule: queued requests time out, running ones finish
        self.drain_points = math.ceil((scenario.traffic.timeout_s + 1.0 + 10 * max(
            scenario.service.time_s.quantile(0.999), scenario.service.time_s.mean)) / TICK_S)
        self.mux: MuxFlow | None = None
        self.llm: LLMFlow | None = None
        self.events: EventFlow | None = None  # requests one by one (mux or llm)
        self.flow: Flow | EventFlow
        if scenario.llm is not None:  # long streams finish after the trace
            self.drain_points += math.ceil(LLM_DRAIN_S / TICK_S)
            self.flow = self.events = self.llm = LLMFlow(
                scenario, scenario.llm, random.Random(int(seeds[5].generate_state(1)[0])),
                self.points + self.drain_points)
        elif scenario.multiplex is None:
            self.flow = Flow(scenario, np.random.default_rng(seeds[0]),
                             self.points + self.drain_points)
        else:  # requests wait behind loads (serial ones queue): time to end them
            self.drain_points += math.ceil(
                50 * scenario.multiplex.load_time_s.quantile(0.999) / TICK_S)
            self.flow = self.events = self.mux = MuxFlow(
                scenario, scenario.multiplex, np.random.default_rng(seeds[4]),
                random.Random(int(seeds[5].generate_state(1)[0])),
                self.points + self.drain_points)
        self.cluster = ClusterState(scenario.cluster,
                                    random.Random(int(seeds[1].generate_state(1)[0])),
                                    fanout_s=scenario.control.fanout_s)
        self.report_rng = np.random.default_rng(seeds[2])
        self.shape = TrafficShape(scenario.traffic.schedule)
        config = scenario.autoscaling
        history = self.history_s if self.history_s is not None else (
            history_needed_s(config, scenario.llm is not None) if config is not None
            else 1.0)
        self.samples = deque(maxlen=max(1, round(history / TICK_S)))
        self.policy: Policy | None = None
        if config is not None:
            self.policy = resolve_policy(config, DeploymentId("sim", scenario.deployment.name))
        self.state = PolicyState()
        self.target = scenario.deployment.initial_replicas
        self.standby_wanted = config.standby_replicas if config is not None else 0
        mean = scenario.service.time_s.mean
        # at least 5 steps per mean service time: completions of ~20% of in-flight a step
        steps = min(_MAX_STEPS_PER_TICK, max(math.ceil(TICK_S / scenario.fine_step_s - 1e-6),
                                             math.ceil(TICK_S / (mean / 5) - 1e-6)))
        self.steps_per_tick = steps
        self.dt = TICK_S / steps
        control = scenario.control
        self.offset = (control.clock_offset_s if control.clock_offset_s is not None else
                       float(np.random.default_rng(seeds[3]).uniform(0, _CLOCK_OFFSET_RANGE_S)))
        # A report covers the 0.1 s before its push; pushes come at any phase of the
        # tick, so a tick's sample holds on average this share of the tick before.
        self.lag_weight = min(1.0, control.report_interval_s / 2 / TICK_S)
        self._raw: LoadSample | None = None  # the tick before, as the flow saw it
        self._urgent_at: float | None = None
        self._last_urgent = -math.inf
        # From a router's queue starting to grow to the decision: measured, or the
        # urgent report's own delay.
        self.decision_delay_s = (control.decision_s if control.decision_s is not None
                                 else URGENT_REPORT_DELAY_S)
        if self.engine_load is None and self.llm is not None:
            self.engine_load = self.llm.engine_load  # its replicas' reports

    def __repr__(self) -> str:
        return (f"<Simulation {self.scenario.name} t={self.end_s:.1f}s target={self.target} "
                f"{self.cluster!r} {self.flow!r}>")

    # -- the loop ------------------------------------------------------------------------

    def run(self, until_s: float | None = None) -> Simulation:
        """Simulate to the end (all requests ended), or stop at `until_s`."""
        self._start()
        last = self.points + self.drain_points
        if until_s is not None:
            last = min(last, math.ceil(until_s / TICK_S - 1e-9))
        for point in range(last):
            t0, t1 = point / 10, (point + 1) / 10
            self.flow.point = point
            self._flow(t0, t1)
            self.samples.append(self._reported(self.flow.close_tick(t1, TICK_S)))
            self.replicas.append(ReplicaSample(t0 + TICK_S / 2, self.cluster.running,
                                               self.target))
            self._control(t1)
            self.end_s = t1
            if point + 1 >= self.points and not self.flow.queued and not self.flow.ongoing:
                break
        return self

    def _start(self) -> None:
        config = self.scenario.autoscaling
        standby = 0
        if config is not None:
            floors = floors_at(config.schedule_windows, self._second_of_day(0.0),
                               config.min_replicas, config.standby_replicas)
            self.target = max(self.target, floors.min_replicas)
            standby = self.standby_wanted = floors.standby_replicas
        self.cluster.warm(0.0, self.target, standby)
        if self.events is not None:
            self.events.sync(self.cluster, 0.0)

    def _second_of_day(self, t: float) -> float:
        return (self.scenario.start_time_s + t) % _DAY_S

    def _flow(self, t0: float, t1: float) -> None:
        if self.events is not None:
            self._event_flow(self.events, t0, t1)
            return
        flow, cluster = self.flow, self.cluster
        assert isinstance(flow, Flow)
        rate = self.shape.max_rate(t0, t1)
        routable = cluster.routable
        slots = routable * flow.max_ongoing
        # In steady state a fine step would find slots - rate x mean + rate x dt free for
        # its rate x dt arrivals: nothing waits while rate <= capacity.
        quiet = (not flow.queue and rate <= flow.capacity_rps(routable)
                 and max(flow.steady_ongoing(rate, routable), flow.ongoing) <= slots)
        if quiet:  # events inside the tick only add capacity: they wait for its end
            self.counters.quiet_ticks += 1
            flow.quiet(t0, t1, routable, self.scenario.traffic.schedule.rate_at(t1 - 1e-9))
            cluster.advance(t1 - _EVENT_EPS, self.target, self.standby_wanted)
            return
        dt = self.dt
        urgent = self.scenario.control.urgent_decisions and self.policy is not None
        for step in range(self.steps_per_tick):
            t = t0 + step * dt
            if cluster.next_event() <= t + _EVENT_EPS:
                cluster.advance(t + _EVENT_EPS, self.target, self.standby_wanted)
            flow.fine(t, dt, cluster.routable, rate)
            if flow.pressure_at is not None:
                if urgent and self._urgent_at is None:
                    self._urgent_at = flow.pressure_at + self.decision_delay_s
                flow.pressure_at = None
            if self._urgent_at is not None and t + dt >= self._urgent_at - _EVENT_EPS:
                self._urgent_at = None
                self._decide_now(t + dt, t0)
        self.counters.fine_steps += self.steps_per_tick
        cluster.advance(t1 - _EVENT_EPS, self.target, self.standby_wanted)

    def _event_flow(self, flow: EventFlow, t0: float, t1: float) -> None:
        """Single requests: events up to each lifecycle event or urgent decision."""
        cluster = self.cluster
        urgent = self.scenario.control.urgent_decisions and self.policy is not None
        flow.begin_tick(t0, t1)
        while True:
            stop = min(t1, cluster.next_event(),
                       self._urgent_at if self._urgent_at is not None else math.inf)
            reached = flow.run_until(stop)
            if flow.pressure_at is not None:
                if urgent and self._urgent_at is None:
                    self._urgent_at = flow.pressure_at + self.decision_delay_s
                flow.pressure_at = None
                if reached < stop:
                    continue
            if stop >= t1 - _EVENT_EPS:
                break
            if cluster.next_event() <= stop + _EVENT_EPS:
                cluster.advance(stop + _EVENT_EPS, self.target, self.standby_wanted)
                flow.sync(cluster, stop)
            if self._urgent_at is not None and stop >= self._urgent_at - _EVENT_EPS:
                self._urgent_at = None
                self._decide_now(stop, t0)
        cluster.advance(t1 - _EVENT_EPS, self.target, self.standby_wanted)
        flow.sync(cluster, t1)

    # -- the controller ----------------------------------------------------------------------

    def _reported(self, raw: LoadSample) -> LoadSample:
        """The tick's sample as the routers' reports deliver it: part of it a tick late."""
        w, before = self.lag_weight, self._raw or raw  # the run starts in steady state
        self._raw = raw

        def mix(now: float, then: float) -> float:
            return (1 - w) * now + w * then

        return LoadSample(t=raw.t + self.offset, arrivals=mix(raw.arrivals, before.arrivals),
                          completions=mix(raw.completions, before.completions),
                          rejections=mix(raw.rejections, before.rejections),
                          queued=mix(raw.queued, before.queued),
                          ongoing=mix(raw.ongoing, before.ongoing), duration_s=TICK_S)

    def _control(self, now: float) -> None:
        """The controller's tick: events due, the policy's decision, reconcile."""
        self.cluster.advance(now, self.target, self.standby_wanted)
        self._decide(now, None)
        self._reconcile(now)

    def _decide_now(self, now: float, tick_start: float) -> None:
        """A router's queue just started to grow (or, LLM, its arrivals jumped): decide
        without waiting for the tick; only a scale-up counts (policy/autoscale_step.py)."""
        jump_rate = 0.0  # the LLM router's jump: the rate it implied, spent here
        if self.llm is not None:
            jump_rate, self.llm.jump_rate = self.llm.jump_rate, 0.0
        if not urgent_decision_due(self._last_urgent, now):
            if jump_rate > 0.0 and self.llm is not None:  # as the controller: decided on
                self.llm.jump_rate = jump_rate  # once the interval is over
                self._urgent_at = (now + urgent_decision_wait(self._last_urgent, now)
                                   + 2 * _EVENT_EPS)
            return
        self._last_urgent = now
        self.counters.urgent_decisions += 1
        bucket = self.flow.open_bucket(now, tick_start)
        if bucket is not None:
            bucket = replace(bucket, t=now + self.offset)
        self._decide(now, bucket, urgent=True, jump_rate=jump_rate)
        self._reconcile(now)

    def _decide(self, now: float, open_bucket: LoadSample | None,
                urgent: bool = False, jump_rate: float = 0.0) -> None:
        config, cluster = self.scenario.autoscaling, self.cluster
        if config is None or self.policy is None:
            return
        samples: Sequence[LoadSample] = self.samples
        if open_bucket is not None:
            samples = [*self.samples, open_bucket]
        step = autoscale_step(self.policy, config, self.state, StepInputs(
            now=now + self.offset, second_of_day=self._second_of_day(now),
            running=cluster.running, target=self.target, samples=samples,
            startup_lead_s=cluster.startup_lead_s, standbys=cluster.standby,
            standby_lead_s=self.scenario.cluster.standby_activation_s,
            engine=self.engine_load(now) if self.engine_load is not None else None,
            urgent=urgent, jump_rate=jump_rate))
        if step.standby_replicas != self.standby_wanted:
            self.standby_wanted = step.standby_replicas
            cluster.dirty = True
        decision = step.decision
        if step.failed:  # as the controller: the target stays
            self.counters.policy_errors += 1
            return
        self.state = decision.state
        if decision.target != self.target:
            self.decisions.append(DecisionLog(now, self.target, decision.target,
                                              decision.reason, decision.kind.value))
            self.target = decision.target
            cluster.dirty = True

    def _reconcile(self, now: float) -> None:
        cluster = self.cluster
        if cluster.dirty:  # reconcile is a pure function of what marks the cluster dirty
            self.counters.reconciles += 1
            cluster.apply(reconcile(self.target, 0, cluster.observed(), self.standby_wanted),
                          now)
        if self.events is not None:
            self.events.sync(cluster, now)

    # -- results ------------------------------------------------------------------------------

    @property
    def duration_s(self) -> float:
        return self.scenario.traffic.schedule.duration_s

    def replica_seconds(self) -> float:
        return self.cluster.replica_seconds(0.0, self.duration_s)

