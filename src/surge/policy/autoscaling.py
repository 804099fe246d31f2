"""Autoscaling policies: fresh load samples in, a target replica count and a reason out.

Three policies share one input shape (`ScalingInputs`, a 0.1 s series of what the
routers and replicas of one deployment saw) and return a `Decision`:

* `ray_default` reproduces Ray Serve 2.60: the mean of ongoing + queued requests over
  `look_back_period_s` as Ray's handles would have reported it (sampled every
  min(0.2 x look_back, metrics_interval_s), pushed every `metrics_interval_s`), divided
  by `target_ongoing_requests`, then Ray's wrapper: cold-start bypass, up/down scaling
  factors, wall-clock up/down delays, bounds.
* `proactive` (surge's default) sizes for the *offered* arrival rate, rejected requests
  included, projected over the replica start-up lead time along its measured slope
  (and never below what the engines' own queues ask for, policy/engine_load.py).
  When demand outruns capacity it acts at once (no delay), growing at most
  `max_step_factor` times per decision; it scales down only after `downscale_delay_s`
  below a hysteresis band, never below `min_replicas`. An LLM deployment (its engines
  report) is sized on the requests it will hold a start-up lead from now
  (`llm_in_flight_ahead`) and 1.5 standard deviations of them (`llm_in_flight_spread`:
  a request sent to a full batch waits seconds for a slot), acts on any excess at once
  and scales down below a wider band (`ProactiveSettings.llm_*`: its requests hold a
  batch slot for seconds, and swing about their mean on bursty traffic). An LLM
  deployment with `objectives` (p99 TTFT / TPOT) whose engines report is sized for them
  instead of for `target_ongoing_requests` (policy/llm_objectives.py), and its scale-ups
  name what bound it (UP_PREFILL, UP_DECODE, UP_KV).
* `custom` wraps a user function's desired count in Ray's wrapper, as Ray does.

The load signals they read (arrival rate and slope, service time) are
policy/load_signals.py's; `LoadSample` is re-exported here for its callers. (Over
500 lines because the three share their input, state and decision types and Ray's
wrapper; apart, each would import the others' pieces.)
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from surge.config import AutoscalingConfig
from surge.config.schema import number
from surge.policy.engine_load import EngineLoad
from surge.policy.llm_objectives import Bound, ObjectiveDemand, objective_demand
from surge.policy.load_signals import LoadSample, arrival_rate, arrival_slope, service_time_s

__all__ = [
    "BUILTIN_POLICIES",
    "AutoscalingContext",
    "Decision",
    "DecisionKind",
    "LoadSample",
    "PolicyState",
    "ProactiveSettings",
    "ScalingInputs",
    "UserPolicy",
    "apply_ray_wrapper",
    "context_for",
    "custom",
    "llm_in_flight_ahead",
    "llm_in_flight_spread",
    "proactive",
    "ray_default",
    "ray_total_requests",
]

# Ray's epsilon when comparing elapsed time with a delay.
_EPS_S = 1e-6
# Ray: each handle records a sample every look_back_period_s x this factor (or
# metrics_interval_s if smaller).
RAY_RECORD_INTERVAL_FACTOR = 0.2


@dataclass(frozen=True)
class ScalingInputs:
    now: float
    running: int  # replicas RUNNING (Ray's current_num_replicas)
    target: int  # the current target (Ray's target_num_replicas)
    samples: Sequence[LoadSample]  # oldest first
    startup_lead_s: float = 1.0  # measured time from asking for a replica to it serving
    engine_demand: float = 0.0  # replicas the engines' queues ask for (policy/engine_load)
    engine: EngineLoad | None = None  # the engines' fresh reports, for latency objectives
    # An urgent decision on an LLM router's jump: the rate its arrivals implied
    # (policy/arrival_jump.py); proactive sizes an LLM deployment on at least it
    jump_rate: float = 0.0


@dataclass(frozen=True)
class PolicyState:
    """What a policy remembers between decisions (Ray's delay timers, user state)."""

    up_since: float | None = None
    down_since: float | None = None
    down_peak: float = 0.0  # proactive: the most demand seen since down_since
    user: Mapping[str, Any] = field(default_factory=dict)


class DecisionKind(enum.StrEnum):
    """What a decision does, for tests, logs and metric labels (reasons are prose)."""

    UP = "up"
    DOWN = "down"
    HOLD = "hold"
    COLD_START = "cold_start"  # from zero running replicas, with requests waiting
    POLICY_FAILED = "policy_failed"  # the policy raised: the target stays
    # The policy asked for more, but the node's CPU is saturated and the replicas added
    # last did not raise throughput: the target stays (policy/saturation.py).
    NODE_SATURATED = "node_saturated"
    # Up for an LLM deployment's objectives (policy/llm_objectives.py), by what bound it:
    UP_PREFILL = "up_prefill"  # TTFT: the prefill flow or backlog
    UP_DECODE = "up_decode"  # TPOT: the decode batch
    UP_KV = "up_kv"  # the KV cache


_UP_KINDS = {Bound.PREFILL: DecisionKind.UP_PREFILL, Bound.DECODE: DecisionKind.UP_DECODE,
             Bound.KV: DecisionKind.UP_KV}


@dataclass(frozen=True)
class Decision:
    target: int
    kind: DecisionKind
    reason: str
    state: PolicyState
    signals: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AutoscalingContext:
    """Ray Serve's `AutoscalingContext`, the input of a custom policy."""

    deployment_name: str
    app_name: str
    current_num_replicas: int
    target_num_replicas: int
    total_num_requests: float
    total_queued_requests: float
    capacity_adjusted_min_replicas: int
    capacity_adjusted_max_replicas: int
    policy_state: Mapping[str, Any]
    current_time: float
    config: AutoscalingConfig
    arrival_rate: float = 0.0  # surge: offered requests/s over the last 0.5 s
    arrival_slope: float = 0.0  # surge: d(rate)/dt over the last second

    @property
    def running_replicas(self) -> int:
        return self.current_num_replicas


# -- shared helpers ---------------------------------------------------------------------


def _upscaling_factor(config: AutoscalingConfig) -> float:
    return config.upscaling_factor or config.upscale_smoothing_factor or config.smoothing_factor


def _downscaling_factor(config: AutoscalingConfig) -> float:
    return (config.downscaling_factor or config.downscale_smoothing_factor
            or config.smoothing_factor)


def _bounds(value: int, config: AutoscalingConfig) -> int:
    return max(config.min_replicas, min(config.max_replicas, value))


def ray_total_requests(samples: Sequence[LoadSample], now: float,
                       config: AutoscalingConfig) -> float:
    """Ongoing + queued requests as Ray's controller would see them at `now`.

    Handles sample every `record` seconds and push every `metrics_interval_s`; the
    controller averages the pushed step function over `look_back_period_s`, holding the
    last sample until now (or takes its max or min, per `aggregation_function`). Samples
    here are the 0.1 s buckets; a handle sample at time t reads the latest bucket ending
    at or before t, so sampling faster than one bucket adds nothing and is not done.
    """
    if not samples:
        return 0.0
    bucket = samples[-1].duration_s
    interval = max(config.metrics_interval_s, bucket)
    record = max(min(config.look_back_period_s * RAY_RECORD_INTERVAL_FACTOR, interval), bucket)
    pushed_until = math.floor(now / interval) * interval
    start = max(pushed_until - config.look_back_period_s, samples[0].t - samples[0].duration_s)
    points: list[tuple[float, float]] = []
    index = 0
    tick = math.ceil(start / record) * record
    while tick <= pushed_until + _EPS_S:
        while index + 1 < len(samples) and samples[index + 1].t <= tick + _EPS_S:
            index += 1
        if samples[index].t <= tick + _EPS_S:
            sample = samples[index]
            points.append((tick, sample.ongoing + sample.queued))
        tick += record
    if not points:
        return 0.0
    if config.aggregation_function == "max":
        return max(value for _, value in points)
    if config.aggregation_function == "min":
        return min(value for _, value in points)
    if len(points) == 1:
        return points[0][1]
    total = 0.0
    for (t0, v0), (t1, _) in itertools.pairwise(points):
        total += v0 * (t1 - t0)
    end = max(now, points[-1][0])
    total += points[-1][1] * (end - points[-1][0])
    span = end - points[0][0]
    return total / span if span > 0 else points[-1][1]


def _ray_observed_total(inputs: ScalingInputs, config: AutoscalingConfig) -> float:
    total = ray_total_requests(inputs.samples, inputs.now, config)
    if inputs.running == 0 and inputs.samples and inputs.samples[-1].queued > 0:
        # Ray's handles push at once when a deployment at zero has queued requests.
        total = max(total, inputs.samples[-1].queued)
    return total


def apply_ray_wrapper(desired: float, inputs: ScalingInputs, config: AutoscalingConfig,
                      state: PolicyState, reason: str, total_requests: float,
                      signals: Mapping[str, float] | None = None) -> Decision:
    """Ray's wrapper around every policy: cold start, factors, delays, then bounds."""
    signals = dict(signals or {})
    if inputs.running == 0 and total_requests > 0:
        cold = max(math.ceil(_upscaling_factor(config)), inputs.target)
        return Decision(_bounds(cold, config), DecisionKind.COLD_START,
                        f"up: cold start with {total_requests:g} requests waiting", state,
                        signals)
    if inputs.running == 0:  # Ray keeps the target until a replica runs
        return Decision(_bounds(inputs.target, config), DecisionKind.HOLD,
                        f"hold: {reason} (no replica running)",
                        state, signals)
    scaled = _apply_factors(desired, inputs.running, config)
    decided, state = _apply_delays(max(0, scaled), inputs.target, config, state, inputs.now)
    final = _bounds(decided, config)
    if final > inputs.target:
        return Decision(final, DecisionKind.UP, f"up: {reason}", state, signals)
    if final < inputs.target:
        return Decision(final, DecisionKind.DOWN, f"down: {reason}", state, signals)
    waiting = ""
    if scaled > inputs.target and state.up_since is not None:
        waiting = f" (up to {scaled} after upscale_delay_s={config.upscale_delay_s:g})"
    elif scaled < inputs.target and state.down_since is not None:
        waiting = f" (down to {scaled} after downscale_delay_s={config.downscale_delay_s:g})"
    return Decision(final, DecisionKind.HOLD, f"hold: {reason}{waiting}", state, signals)


def _apply_factors(desired: float, running: int, config: AutoscalingConfig) -> int:
    delta = desired - running
    factor = _upscaling_factor(config) if delta > 0 else _downscaling_factor(config)
    scaled = math.ceil(running + factor * delta)
    if math.ceil(desired) < running and scaled == running:
        scaled -= 1  # a small factor must not leave downscaling stuck
    return scaled


def _apply_delays(desired: int, target: int, config: AutoscalingConfig, state: PolicyState,
                  now: float) -> tuple[int, PolicyState]:
    if desired > target:
        since = state.up_since if state.up_since is not None else now
        if now - since + _EPS_S >= config.upscale_delay_s:
            return desired, replace(state, up_since=None, down_since=None)
        return target, replace(state, up_since=since, down_since=None)
    if desired < target:
        if target == 1:  # only 1 -> 0 may reach zero
            delay = (config.downscale_to_zero_delay_s
                     if config.downscale_to_zero_delay_s is not None else config.downscale_delay_s)
        else:
            delay = config.downscale_delay_s
            desired = max(1, desired)
        since = state.down_since if state.down_since is not None else now
        if now - since + _EPS_S >= delay:
            return desired, replace(state, up_since=None, down_since=None)
        return target, replace(state, up_since=None, down_since=since)
    return target, replace(state, up_since=None, down_since=None)


# -- ray_default --------------------------------------------------------------------------


def ray_default(inputs: ScalingInputs, config: AutoscalingConfig,
                state: PolicyState) -> Decision:
    """Ray Serve 2.60's default policy, with Ray's metric pipeline emulated."""
    total = _ray_observed_total(inputs, config)
    desired = (float(inputs.target) if inputs.running == 0
               else total / config.target_ongoing_requests)
    reason = (f"{total:.1f} requests (Ray's {config.look_back_period_s:g}s mean) / "
              f"target_ongoing_requests {config.target_ongoing_requests:g} = {desired:.1f}")
    return apply_ray_wrapper(desired, inputs, config, state, reason, total,
                             {"total_requests": total, "desired": desired})


# -- proactive ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ProactiveSettings:
    """`policy_kwargs` of the proactive policy; each default with its reason."""

    # Arrival rate over the last 0.3 s: three buckets, fresh yet not one bucket's noise.
    rate_window_s: float = 0.3
    # Slope over the last 1 s: long enough to see a ramp of 500 ms.
    slope_window_s: float = 1.0
    # ... and over at least 1/this of the start-up lead it is projected over: a slope of
    # 1 s of buckets projected 27 s ahead (a herd's lead at 10,000 replicas) multiplies
    # their noise 27 times, and read a smooth ramp as twice the capacity.
    lead_per_slope_window: float = 4.0
    # ... up to this (the history the simulator keeps for the policy).
    max_slope_window_s: float = 10.0
    # Act without delay when projected demand exceeds the target by this fraction.
    surge_threshold: float = 0.2
    # At most this many times the current replicas per decision (guards a bad estimate).
    max_step_factor: float = 4.0
    # Scale down only when demand stays below this fraction of the target.
    downscale_band: float = 0.7
    # Service time assumed until completions measure it (seconds per request).
    default_service_time_s: float = 0.01
    # An LLM deployment's (its engines report) requests stream for seconds: its service
    # time is measured over this long (a second holds a handful of completions, and the
    # noise of 1 / their count read as a service time ratchets replicas up), and its
    # rate and slope over a window as long as that service time, up to this: arrivals
    # that come and go within one request's time are load it already holds, not a rate
    # that lasts (a 0.3 s burst of 12 s requests read as a rate asked for 50 replicas on
    # a BurstGPT replay).
    max_service_window_s: float = 30.0
    # An LLM deployment acts on any excess at once: a request beyond its replicas'
    # batches waits for a sequence to finish (~a request's time / the batch: 1.5 s of a
    # 12 s request at 8), a TTFT miss in the making, where a short request's wait is a
    # few ms. (0.2 on bench/llm_sim_targets.py's replay: SLO attainment 96-97%; 0: 98-99%.)
    llm_surge_threshold: float = 0.0
    # ... and scales down below this fraction of its target: its requests in flight swing
    # +-40% about their mean on bursty (gamma 0.25) traffic, so a target sized for the
    # peaks sees its mean at ~0.7 of it and 0.7 scaled down inside a steady phase, the
    # next burst back up (a change of direction each way).
    llm_downscale_band: float = 0.6
    # ... and sized this many standard deviations of its requests in flight above their
    # mean (`llm_in_flight_spread`), over the start-up lead or, if longer, a slot's turn
    # (service time / batch: a request sent to a full batch waits for one of its
    # sequences, however soon a new replica serves). Sized on the mean alone, each
    # scale-up of bench/llm_sim_vs_real.py's ramp came once the batches were full (16 of
    # 16, 23 of 24, 30 of 32 in flight) and what arrived meanwhile waited seconds for a
    # slot: simulated TTFT p99 1.6 s at a 0.5 s start-up (1: 0.9 s; 1.5: 161 ms, 1%
    # more replica-seconds) and 2.2 s at 2 s (1: 157 ms, 3% more).
    llm_spread_sd: float = 1.5

    def __post_init__(self) -> None:
        # a margin above the mean: a negative one would size below it
        number("llm_spread_sd", self.llm_spread_sd, ge=0)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> ProactiveSettings:
        known = set(cls.__dataclass_fields__)
        unknown = set(kwargs) - known
        if unknown:
            raise ValueError(f"unknown proactive policy_kwargs {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        return cls(**dict(kwargs))


def proactive(inputs: ScalingInputs, config: AutoscalingConfig, state: PolicyState,
              settings: ProactiveSettings | None = None) -> Decision:
    """Size for the offered rate projected over the start-up lead time; act on surges now."""
    s = settings or ProactiveSettings()
    now, samples = inputs.now, inputs.samples
    lead = max(inputs.startup_lead_s, 0.1)
    slope_window = max(s.slope_window_s,
                       min(lead / s.lead_per_slope_window, s.max_slope_window_s))
    rate_window = s.rate_window_s
    if inputs.engine is None:
        service = service_time_s(samples, now, s.default_service_time_s)
    else:  # LLM requests: see max_service_window_s
        service = service_time_s(samples, now, s.default_service_time_s,
                                 s.max_service_window_s)
        rate_window = max(rate_window, min(service, s.max_service_window_s))
        slope_window = max(slope_window, rate_window)
    rate = arrival_rate(samples, now, rate_window)
    slope = arrival_slope(samples, now, slope_window, weighted=inputs.engine is not None)
    projected = max(rate, rate + slope * lead)
    if inputs.engine is not None and inputs.jump_rate > rate:  # a jump, read a few ms in
        rate = inputs.jump_rate
        projected = max(projected, rate)
    latest = samples[-1] if samples else None
    in_system = (latest.ongoing + latest.queued) if latest else 0.0
    per_replica = config.target_ongoing_requests / service  # requests/s at target load
    ahead = headroom = 0.0
    if inputs.engine is None:
        demand = max(projected / per_replica, in_system / config.target_ongoing_requests,
                     inputs.engine_demand)
    else:  # LLM: the requests in flight a start-up lead from now (llm_in_flight_ahead),
        # and a margin for their spread about that mean (llm_in_flight_spread)
        ahead = llm_in_flight_ahead(in_system, projected, service, lead)
        turn = service / config.target_ongoing_requests  # a batch slot's turn
        headroom = s.llm_spread_sd * llm_in_flight_spread(in_system, projected, service,
                                                          max(lead, turn))
        demand = max((in_system + ahead + headroom) / config.target_ongoing_requests,
                     inputs.engine_demand)
    signals = {"rate": rate, "rate_window_s": rate_window, "slope": slope,
               "slope_window_s": slope_window,
               "projected_rate": projected,
               "service_time_s": service, "demand_replicas": demand,
               "engine_demand": inputs.engine_demand, "in_flight_ahead": ahead,
               "in_flight_headroom": headroom}
    objective = _objective(inputs, config, projected, latest, margin=ahead + headroom)
    up_kind = DecisionKind.UP
    if objective is not None:  # objectives, not levels: they replace the sizing above
        demand = objective.replicas
        signals.update(objective.signals, demand_replicas=demand)
        up_kind = _UP_KINDS.get(objective.bound, DecisionKind.UP)
    wanted = math.ceil(demand - 1e-9)
    base = max(inputs.target, inputs.running, 1)
    if inputs.running == 0 and inputs.target == 0 and (rate > 0 or in_system > 0):
        return Decision(_bounds(max(1, wanted), config), DecisionKind.COLD_START,
                        f"up: cold start, {rate:.0f} req/s offered", PolicyState(user=state.user),
                        signals)
    held = _bounds(inputs.target, config)  # bounds may have moved under the target
    llm = inputs.engine is not None
    if wanted > inputs.target:
        threshold = s.llm_surge_threshold if llm else s.surge_threshold
        surge = demand > inputs.target * (1 + threshold)
        cap = math.ceil(base * max(s.max_step_factor, _upscaling_factor(config)))
        step = _bounds(min(wanted, cap), config)
        why = (_llm_why(signals, in_system, config.target_ongoing_requests, s.llm_spread_sd,
                        lead, objective) if llm else
               f"{rate:.0f} req/s offered, slope {slope:+.0f}/s, projected {projected:.0f} "
               f"over {lead:.2f}s lead, {per_replica:.0f} req/s per replica -> {demand:.1f} "
               "replicas")
        up = Decision(step, up_kind, f"up: {why}", PolicyState(user=state.user), signals)
        if surge or inputs.target == 0:
            return up
        since = state.up_since if state.up_since is not None else now
        if now - since + _EPS_S >= config.upscale_delay_s:
            return up
        return Decision(held, DecisionKind.HOLD, f"hold: {why} (within the surge band; waiting "
                        f"upscale_delay_s={config.upscale_delay_s:g})",
                        PolicyState(up_since=since, user=state.user), signals)
    band = s.llm_downscale_band if llm else s.downscale_band
    if demand < inputs.target * band and inputs.target > config.min_replicas:
        since = state.down_since if state.down_since is not None else now
        # down to what the whole delay needed at its most, not to its last moment: a
        # lull in bursty load would otherwise turn the next burst into a change of
        # direction
        peak = max(demand, state.down_peak if state.down_since is not None else 0.0)
        low = _bounds(max(math.ceil(peak - 1e-9), 0), config)
        if now - since + _EPS_S >= config.downscale_delay_s:
            step = max(low, inputs.target - max(1, (inputs.target - low) // 2))
            return Decision(_bounds(step, config), DecisionKind.DOWN,
                            f"down: demand {demand:.1f} replicas (at most {peak:.1f}) below "
                            f"{band:.0%} of {inputs.target} for "
                            f"{config.downscale_delay_s:g}s", PolicyState(user=state.user),
                            signals)
        return Decision(held, DecisionKind.HOLD, f"hold: demand {demand:.1f} replicas (waiting "
                        f"downscale_delay_s={config.downscale_delay_s:g})",
                        PolicyState(down_since=since, down_peak=peak, user=state.user),
                        signals)
    return Decision(held, DecisionKind.HOLD, f"hold: demand {demand:.1f} replicas",
                    PolicyState(user=state.user), signals)


def llm_in_flight_ahead(in_flight: float, rate: float, service_s: float,
                        lead_s: float) -> float:
    """Requests an LLM deployment will hold `lead_s` from now beyond the `in_flight` it
    holds, at `rate` arrivals/s of `service_s` each (0 when fewer).

    The requests in flight relax towards rate x service_s with time constant service_s
    (an M/G/inf queue's mean, exact for exponential service): within a start-up lead
    much shorter than a request (2 s of 12 s) they grow by about (rate - completions) x
    lead, not by the rate's ratio to now's. Sizing all of them by that ratio (the
    slope's projection over the lead / the rate now: x1.67 at 3 req/s) read a burst of
    37 sequences as 61 on bench/llm_sim_targets.py's replay."""
    if service_s <= 0:
        return 0.0
    settled = rate * service_s
    return max(0.0, (settled - in_flight) * -math.expm1(-lead_s / service_s))


def llm_in_flight_spread(in_flight: float, rate: float, service_s: float,
                         lead_s: float) -> float:
    """The standard deviation of the requests an LLM deployment will hold `lead_s` from
    now, in llm_in_flight_ahead's M/G/inf model (proactive passes the longer of the
    start-up lead and a batch slot's turn, so this spread may be over a longer horizon
    than the `ahead` it is added to).

    Each of the `in_flight` requests is still running after the lead with probability
    q = e^(-lead/service) (binomial: variance n q (1 - q)); those arriving in the lead
    at `rate` and still running are Poisson (variance = mean = rate x service x (1 - q)).
    At 2 req/s of 12 s requests, 24 in flight and a 2 s lead: 2.6 requests, about a
    third of a batch of 8; a square root, so a small share of a large deployment."""
    if service_s <= 0:
        return 0.0
    gone = -math.expm1(-lead_s / service_s)  # 1 - q
    return math.sqrt(max(0.0, in_flight) * gone * (1.0 - gone)
                     + max(0.0, rate) * service_s * gone)


def _llm_why(signals: Mapping[str, float], in_flight: float, batch: float, sd: float,
             lead: float, objective: ObjectiveDemand | None) -> str:
    """What an LLM deployment's scale-up was sized on: its requests in flight, those
    ahead over the lead and the spread margin against a replica's batch (or, with
    objectives, what bound them), then the offered load they came from."""
    ahead, headroom = signals["in_flight_ahead"], signals["in_flight_headroom"]
    load = (f"{signals['rate']:.1f} req/s offered, projected "
            f"{signals['projected_rate']:.1f}, {signals['service_time_s']:.1f}s a request")
    held = (f"{in_flight:.0f} in flight + {ahead:.1f} ahead over {lead:.2f}s lead + "
            f"{headroom:.1f} spread margin ({sd:g} sd)")
    if objective is not None:
        return f"{objective.reason}; {held}; {load}"
    sized = (in_flight + ahead + headroom) / batch
    why = f"{held} at {batch:g} a replica"
    if signals["engine_demand"] > sized:
        why += f" ({sized:.1f}), the engines' queues {signals['engine_demand']:.1f}"
    return f"{why} -> {signals['demand_replicas']:.1f} replicas ({load})"


def _objective(inputs: ScalingInputs, config: AutoscalingConfig, projected: float,
               latest: LoadSample | None, margin: float) -> ObjectiveDemand | None:
    """The objectives' demand, when the deployment states them and its engines report;
    `margin`: the requests held beyond those in flight now (ahead + headroom)."""
    objectives = config.latency_objectives
    if objectives is None or inputs.engine is None or inputs.engine.replicas <= 0:
        return None
    return objective_demand(inputs.engine, objectives, projected_rate=projected,
                            router_queued=latest.queued if latest else 0.0,
                            fallback_batch=config.target_ongoing_requests, margin=margin)


# -- custom -------------------------------------------------------------------------------

UserPolicy = Callable[[AutoscalingContext], tuple[float, Mapping[str, Any]]]


def context_for(inputs: ScalingInputs, config: AutoscalingConfig, state: PolicyState,
                deployment: str, app: str) -> AutoscalingContext:
    latest = inputs.samples[-1] if inputs.samples else None
    return AutoscalingContext(
        deployment_name=deployment, app_name=app, current_num_replicas=inputs.running,
        target_num_replicas=inputs.target,
        total_num_requests=_ray_observed_total(inputs, config),
        total_queued_requests=latest.queued if latest else 0.0,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=dict(state.user), current_time=inputs.now, config=config,
        arrival_rate=arrival_rate(inputs.samples, inputs.now, 0.5),
        arrival_slope=arrival_slope(inputs.samples, inputs.now, 1.0))


def custom(policy: UserPolicy, inputs: ScalingInputs, config: AutoscalingConfig,
           state: PolicyState, deployment: str = "", app: str = "") -> Decision:
    """A user policy (Ray's signature), wrapped like Ray wraps it."""
    ctx = context_for(inputs, config, state, deployment, app)
    desired, user_state = policy(ctx)
    if not isinstance(desired, int | float) or isinstance(desired, bool) or \
            not math.isfinite(desired):
        raise ValueError(f"the custom policy returned {desired!r}; it must return "
                         "(number of replicas, state dict)")
    state = replace(state, user=dict(user_state or {}))
    return apply_ray_wrapper(float(desired), inputs, config, state,
                             f"custom policy wants {desired:g}", ctx.total_num_requests)


BUILTIN_POLICIES = ("proactive", "ray_default")
