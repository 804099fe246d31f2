"""autoscaling policies on virtual time: exact targets at exact `now` values.

Load series are built from 0.1 s buckets whose end times are `i / 10`, so every time
in these tables is exact. `ray_default` tables feed a constant load each tick (its
time-weighted mean is that constant), carry the state and the target from one row to
the next, and assume replicas start at once (running == target).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.config import AutoscalingConfig
from surge.errors import ConfigError
from surge.policy.autoscaling import (
    AutoscalingContext,
    Decision,
    PolicyState,
    ProactiveSettings,
    ScalingInputs,
    custom,
    llm_in_flight_ahead,
    llm_in_flight_spread,
    proactive,
    ray_default,
    ray_total_requests,
)
from surge.policy.engine_load import EngineLoad
from surge.policy.load_signals import LoadSample, arrival_rate, arrival_slope, service_time_s

SERVICE_S = 0.01  # 10 ms per request: at target_ongoing_requests=2, 200 req/s per replica


def config(**overrides: Any) -> AutoscalingConfig:
    values: dict[str, Any] = {"min_replicas": 1, "max_replicas": 10,
                              "target_ongoing_requests": 2.0}
    values.update(overrides)
    return AutoscalingConfig(**values)


def bucket(i: int, *, arrivals: float = 0.0, completions: float = 0.0,
           rejections: float = 0.0, queued: float = 0.0, ongoing: float = 0.0) -> LoadSample:
    return LoadSample(t=i / 10, arrivals=arrivals, completions=completions,
                      rejections=rejections, queued=queued, ongoing=ongoing)


def steady(total: float, now: float, seconds: float = 40.0) -> list[LoadSample]:
    """`total` requests in the system (all ongoing) in every bucket of the last `seconds`."""
    end = round(now * 10)
    return [bucket(i, ongoing=total) for i in range(end - round(seconds * 10) + 1, end + 1)]


def gauge(values: Callable[[float], float], first: int, last: int) -> list[LoadSample]:
    """Buckets `first..last` (ends at i / 10) with ongoing = values(end time)."""
    return [bucket(i, ongoing=values(i / 10)) for i in range(first, last + 1)]


def traffic(segments: Sequence[tuple[float, float]], now: float,
            service_s: float = SERVICE_S, seconds: float = 2.0) -> list[LoadSample]:
    """Arrivals at a piecewise-constant rate; segments are (from time, req/s), in order.

    Every bucket completes what arrives and holds rate x service time in flight
    (Little's law), so the measured service time is exactly `service_s`.
    """
    end = round(now * 10)
    samples = []
    for i in range(end - round(seconds * 10) + 1, end + 1):
        rate = [r for start, r in segments if i / 10 > start][-1]
        samples.append(bucket(i, arrivals=rate / 10, completions=rate / 10,
                              ongoing=rate * service_s))
    return samples


def timers(decision: Decision) -> tuple[float | None, float | None]:
    return decision.state.up_since, decision.state.down_since


Row = tuple[float, float, int, float | None, float | None]  # now, load, target, up, down


def run_ray_table(cfg: AutoscalingConfig, start: int, rows: Sequence[Row]) -> None:
    state, target = PolicyState(), start
    for now, total, want, up, down in rows:
        decision = ray_default(ScalingInputs(now, running=target, target=target,
                                             samples=steady(total, now)), cfg, state)
        assert (decision.target, *timers(decision)) == (want, up, down), f"at now={now}"
        state, target = decision.state, decision.target


# -- ray_default: delays -------------------------------------------------------------------

RAY = config(upscale_delay_s=30.0, downscale_delay_s=600.0)


def test_ray_scales_up_exactly_upscale_delay_after_the_first_up_decision() -> None:
    # 9 requests / 2 per replica = 4.5 -> 5 replicas wanted.
    run_ray_table(RAY, 2, [
        (0.0, 9, 2, 0.0, None),
        (10.0, 9, 2, 0.0, None),
        (29.9, 9, 2, 0.0, None),
        (30.0, 9, 5, None, None),
        (30.1, 9, 5, None, None),  # at 5 replicas 4.5 wanted rounds to 5: nothing to do
    ])


def test_ray_hold_resets_the_up_timer() -> None:
    # 3 requests -> 1.5 wanted -> ceil(2 - 0.5) = 2 == target: the timer restarts.
    run_ray_table(RAY, 2, [
        (0.0, 9, 2, 0.0, None),
        (20.0, 3, 2, None, None),
        (25.0, 9, 2, 25.0, None),
        (54.9, 9, 2, 25.0, None),
        (55.0, 9, 5, None, None),
    ])


def test_ray_direction_change_swaps_the_timers() -> None:
    run_ray_table(RAY, 2, [
        (0.0, 9, 2, 0.0, None),
        (5.0, 1, 2, None, 5.0),  # 0.5 wanted -> ceil(2 - 1.5) = 1 < 2
        (10.0, 9, 2, 10.0, None),
        (39.9, 9, 2, 10.0, None),
        (40.0, 9, 5, None, None),
    ])


def test_ray_scales_down_after_downscale_delay() -> None:
    # 3 requests at 4 replicas: 1.5 wanted -> ceil(4 - 2.5) = 2.
    run_ray_table(RAY, 4, [
        (0.0, 3, 4, None, 0.0),
        (300.0, 3, 4, None, 0.0),
        (599.9, 3, 4, None, 0.0),
        (600.0, 3, 2, None, None),
        (600.1, 3, 2, None, None),
    ])


def test_ray_n_to_zero_is_clamped_to_one_then_one_to_zero_uses_its_own_delay() -> None:
    cfg = config(min_replicas=0, downscale_delay_s=600.0, downscale_to_zero_delay_s=5.0)
    run_ray_table(cfg, 3, [
        (0.0, 0, 3, None, 0.0),
        (599.9, 0, 3, None, 0.0),
        (600.0, 0, 1, None, None),  # 3 -> 0 wanted, clamped to 1
        (600.1, 0, 1, None, 600.1),  # 1 -> 0: a fresh timer with downscale_to_zero_delay_s
        (605.0, 0, 1, None, 600.1),
        (605.1, 0, 0, None, None),
        (605.2, 0, 0, None, None),
    ])


def test_ray_two_to_zero_is_not_one_to_zero() -> None:
    cfg = config(min_replicas=0, downscale_delay_s=600.0, downscale_to_zero_delay_s=5.0)
    run_ray_table(cfg, 2, [
        (0.0, 0, 2, None, 0.0),
        (5.0, 0, 2, None, 0.0),  # downscale_to_zero_delay_s is for 1 -> 0 only
        (600.0, 0, 1, None, None),
    ])


def test_ray_one_to_zero_without_its_own_delay_waits_downscale_delay() -> None:
    cfg = config(min_replicas=0, downscale_delay_s=600.0)
    run_ray_table(cfg, 1, [
        (0.0, 0, 1, None, 0.0),
        (599.9, 0, 1, None, 0.0),
        (600.0, 0, 0, None, None),
    ])


def test_ray_never_goes_below_min_replicas_even_after_the_delay() -> None:
    run_ray_table(config(downscale_delay_s=10.0), 1, [
        (0.0, 0, 1, None, 0.0),
        (10.0, 0, 1, None, None),
    ])


def test_ray_hold_reason_says_what_it_waits_for() -> None:
    up = ray_default(ScalingInputs(0.0, 2, 2, steady(9, 0.0)), RAY, PolicyState())
    assert up.reason.endswith("(up to 5 after upscale_delay_s=30)")
    assert up.kind == "hold"
    assert up.signals == {"total_requests": 9.0, "desired": 4.5}
    down = ray_default(ScalingInputs(0.0, 4, 4, steady(3, 0.0)), RAY, PolicyState())
    assert down.reason.endswith("(down to 2 after downscale_delay_s=600)")
    done = ray_default(ScalingInputs(30.0, 2, 2, steady(9, 30.0)), RAY, up.state)
    assert done.kind == "up" and done.target == 5
    assert done.reason.startswith("up: 9.0 requests (Ray's 30s mean) / "
                                  "target_ongoing_requests 2 = 4.5")
    shrink = ray_default(ScalingInputs(600.0, 4, 4, steady(3, 600.0)), RAY, down.state)
    assert shrink.kind == "down" and shrink.target == 2


# -- ray_default: cold start, factors, bounds ------------------------------------------------


def cold(cfg: AutoscalingConfig, target: int = 0, queued: float = 3.0,
         now: float = 12.3) -> Decision:
    """Zero replicas running; the last bucket has `queued` requests waiting in a router."""
    samples = [*steady(0, now)[:-1], bucket(round(now * 10), queued=queued)]
    return ray_default(ScalingInputs(now, running=0, target=target, samples=samples), cfg,
                       PolicyState())


@pytest.mark.parametrize(("overrides", "target", "queued", "expected", "direction"), [
    ({}, 0, 3.0, 1, "cold_start"),  # max(ceil(1 x 1.0), 0), no upscale delay
    ({"upscaling_factor": 2.5}, 0, 3.0, 3, "cold_start"),  # ceil(1 x 2.5)
    ({"upscaling_factor": 5.0, "max_replicas": 2}, 0, 3.0, 2, "cold_start"),  # bounded
    ({}, 4, 3.0, 4, "cold_start"),  # replicas already starting: keep the larger target
    ({}, 0, 0.0, 0, "hold"),  # nothing waiting: stay at zero
    ({}, 2, 0.0, 2, "hold"),  # nothing waiting, replicas starting: keep the target
])
def test_ray_cold_start(overrides: dict[str, Any], target: int, queued: float, expected: int,
                        direction: str) -> None:
    cfg = config(min_replicas=0, upscale_delay_s=30.0, **overrides)
    decision = cold(cfg, target, queued)
    assert decision.target == expected
    assert decision.kind == direction
    assert decision.state == PolicyState()


def test_ray_cold_start_sees_queued_requests_before_the_next_push() -> None:
    # The pipeline alone reads 0 at 12.3 s (the last push, at 10 s, saw nothing)...
    samples = [*steady(0, 12.3)[:-1], bucket(123, queued=3)]
    assert ray_total_requests(samples, 12.3, RAY) == 0.0
    # ...but Ray's handle pushes at once when the deployment has no replica.
    decision = cold(config(min_replicas=0), queued=3.0)
    assert decision.signals["total_requests"] == 3.0
    assert decision.reason == "up: cold start with 3 requests waiting"


@pytest.mark.parametrize(("overrides", "running", "total", "expected"), [
    ({"upscaling_factor": 2.0}, 2, 10, 8),  # desired 5: ceil(2 + 2 x 3)
    ({"downscaling_factor": 0.5}, 8, 4, 5),  # desired 2: ceil(8 + 0.5 x -6)
    ({"downscaling_factor": 0.1}, 2, 2, 1),  # desired 1: ceil(1.9) == 2 is stuck -> 1
    ({"downscaling_factor": 0.5}, 2, 3, 2),  # desired 1.5: ceil(1.5) == 2, not stuck
    ({"smoothing_factor": 0.5}, 2, 10, 4),  # the fallback: ceil(2 + 0.5 x 3)
    ({"upscale_smoothing_factor": 3.0}, 2, 6, 5),  # desired 3: ceil(2 + 3 x 1)
    ({"downscale_smoothing_factor": 0.5}, 6, 4, 4),  # desired 2: ceil(6 - 2)
    ({}, 2, 100, 10),  # desired 50, max_replicas 10
    ({"min_replicas": 3}, 5, 0, 3),  # desired 0 -> 1 (n -> 0 clamp) -> min_replicas 3
])
def test_ray_scaling_factors_and_bounds(overrides: dict[str, Any], running: int, total: float,
                                        expected: int) -> None:
    cfg = config(upscale_delay_s=0.0, downscale_delay_s=0.0, **overrides)
    decision = ray_default(ScalingInputs(100.0, running, running, steady(total, 100.0)), cfg,
                           PolicyState())
    assert decision.target == expected


def test_ray_target_outside_new_bounds_is_clamped() -> None:
    # A redeploy lowered max_replicas below the current target.
    decision = ray_default(ScalingInputs(100.0, 8, 8, steady(16, 100.0)), config(max_replicas=5),
                           PolicyState())
    assert (decision.target, decision.kind) == (5, "down")


# -- Ray's metric pipeline ------------------------------------------------------------------


def test_ray_total_requests_without_samples_or_before_the_first_push() -> None:
    assert ray_total_requests([], 100.0, RAY) == 0.0
    samples = gauge(lambda t: 4.0, 1, 99)  # 0.1 .. 9.9 s
    assert ray_total_requests(samples, 9.9, RAY) == 0.0  # the first push is at 10 s
    assert ray_total_requests([*samples, bucket(100, ongoing=4)], 10.0, RAY) == 4.0


def test_ray_total_requests_one_point_reads_that_point() -> None:
    # Samples from 17.5 s: the only handle sample before the 20 s push is at 18 s.
    samples = gauge(lambda t: 7.0 if t <= 18.0 else 1.0, 175, 200)
    assert ray_total_requests(samples, 20.0, RAY) == 7.0


def test_ray_total_requests_skips_a_handle_tick_before_the_first_sample() -> None:
    # A first bucket ending just after the 18 s handle tick is not seen by it.
    samples = [LoadSample(18.05, 0, 0, 0, 0, 7.0), *gauge(lambda t: 1.0, 181, 240)]
    assert ray_total_requests(samples, 30.0, RAY) == 1.0  # points 24 and 30, both 1


def test_ray_total_requests_time_weighted_mean_of_handle_samples() -> None:
    # Handle samples every 6 s, read at 0, 6, 12, 18, 24, 30 s: 1, 2, 3, 4, 5, 6.
    samples = gauge(lambda t: math.floor(t / 6) + 1.0, -100, 300)
    assert ray_total_requests(samples, 30.0, RAY) == (1 + 2 + 3 + 4 + 5) * 6 / 30
    # At 39.9 s the controller still has the 30 s push; 6 is held until now.
    samples = gauge(lambda t: math.floor(t / 6) + 1.0, -100, 399)
    expected = ((1 + 2 + 3 + 4 + 5) * 6 + 6 * 9.9) / 39.9
    assert ray_total_requests(samples, 39.9, RAY) == pytest.approx(expected, rel=1e-12)


def burst(t: float) -> float:
    """50x the base load of 1 for the 5 s ending at 18 s (buckets 13.1 .. 18.0)."""
    return 50.0 if 13.0 < t <= 18.0 + 1e-9 else 1.0


def test_a_burst_shorter_than_the_push_interval_is_invisible_until_the_next_push() -> None:
    def seen(now: float) -> float:
        return ray_total_requests(gauge(burst, -400, round(now * 10)), now, RAY)

    assert seen(17.0) == 1.0
    assert seen(19.9) == 1.0  # the 18 s handle sample caught it; the 10 s push did not
    # The 20 s push: points -6, 0, 6, 12 (1 each) and 18 (50, held until now).
    assert seen(20.0) == pytest.approx((1 * 24 + 50 * 2) / 26, rel=1e-12)
    assert seen(29.9) == pytest.approx((1 * 24 + 50 * 11.9) / 35.9, rel=1e-12)


def test_a_5s_burst_of_50x_in_a_30s_window_reads_about_9x() -> None:
    # Dense handle samples (every 0.5 s): the continuous mean, (25 x 1 + 5 x 50) / 30.
    dense = config(metrics_interval_s=0.5)
    assert ray_total_requests(gauge(burst, -400, 300), 30.0, dense) == pytest.approx(
        275 / 30, rel=1e-12)
    # Ray's default 6 s handle samples: the one sample in the burst carries 6 s of
    # weight, (4 x 6 x 1 + 6 x 50) / 30 = 10.8x ...
    assert ray_total_requests(gauge(burst, -400, 300), 30.0, RAY) == pytest.approx(10.8)
    # ... and a burst that falls between two handle samples is never seen at all.
    shifted = gauge(lambda t: burst(t + 0.5), -400, 300)  # buckets 12.6 .. 17.5
    assert ray_total_requests(shifted, 30.0, RAY) == 1.0


# -- proactive -------------------------------------------------------------------------------

SURGE = config(max_replicas=100, upscale_delay_s=30.0, downscale_delay_s=60.0)


def decide(samples: list[LoadSample], now: float, running: int, target: int,
           cfg: AutoscalingConfig = SURGE, state: PolicyState | None = None,
           lead: float = 1.0, settings_: ProactiveSettings | None = None) -> Decision:
    return proactive(ScalingInputs(now, running, target, samples, lead), cfg,
                     state or PolicyState(), settings_)


def test_measurements_on_steady_traffic() -> None:
    samples = traffic([(-1e9, 700.0)], 10.0)
    assert arrival_rate(samples, 10.0, 0.3) == pytest.approx(700.0)
    assert arrival_slope(samples, 10.0, 1.0) == pytest.approx(0.0, abs=1e-6)
    assert service_time_s(samples, 10.0, 0.5) == pytest.approx(SERVICE_S)


def test_windows_hold_exactly_their_buckets() -> None:
    # 0.3 s is three 0.1 s buckets: the one ending at now - 0.3 lies outside.
    samples = [bucket(97, arrivals=1000.0), *[bucket(i, arrivals=10.0) for i in (98, 99, 100)]]
    assert arrival_rate(samples, 10.0, 0.3) == pytest.approx(100.0)
    # Little's law over 1 s: ten buckets, not eleven.
    samples = [bucket(90, completions=1000.0, ongoing=1000.0),
               *[bucket(i, completions=10.0, ongoing=2.0) for i in range(91, 101)]]
    assert service_time_s(samples, 10.0, 0.5) == pytest.approx(2.0 / 100.0)


def test_a_short_open_bucket_weighs_by_its_length_in_an_llm_deployments_slope() -> None:
    """A decision between ticks reads the open bucket: for an LLM deployment (`weighted`)
    one request 10 ms into it counts as one request, not as a rate of 100/s."""
    samples = [bucket(i, arrivals=1.0 if i % 10 == 0 else 0.0) for i in range(291, 301)]
    tick = [*samples[1:], bucket(301, arrivals=1.0)]
    opened = [*samples, LoadSample(30.01, 1.0, 0, 0, 0, 0, duration_s=0.01)]
    # a request in a tick's bucket after the one in the bucket before, and the same
    # request 10 ms into the open bucket: about the same slope weighted...
    assert arrival_slope(tick, 30.1, 1.0, weighted=True) == pytest.approx(9.70, abs=0.01)
    assert arrival_slope(opened, 30.01, 1.0, weighted=True) == pytest.approx(11.11, abs=0.01)
    # ... and unweighted, 4.6 times as steep
    assert arrival_slope(tick, 30.1, 1.0) == pytest.approx(9.70, abs=0.01)
    assert arrival_slope(opened, 30.01, 1.0) == pytest.approx(45.12, abs=0.01)
    # equal buckets: the plain least squares of their rates either way
    ramp = [bucket(i, arrivals=i - 90.0) for i in range(91, 101)]
    assert arrival_slope(ramp, 10.0, 1.0, weighted=True) == pytest.approx(100.0)
    assert arrival_slope(ramp, 10.0, 1.0) == pytest.approx(100.0)


def test_measurements_without_enough_data() -> None:
    assert arrival_rate([], 1.0, 0.3) == 0.0
    assert arrival_slope([bucket(9, arrivals=1), bucket(10, arrivals=5)], 1.0, 1.0) == 0.0
    same_time = [bucket(10, arrivals=n) for n in (1.0, 5.0, 9.0)]
    assert arrival_slope(same_time, 1.0, 1.0) == 0.0
    assert arrival_slope(same_time, 1.0, 1.0, weighted=True) == 0.0
    no_time = [LoadSample(1.0, n, 0, 0, 0, 0, duration_s=0.0) for n in (1.0, 5.0, 9.0)]
    assert arrival_slope(no_time, 1.0, 1.0, weighted=True) == 0.0
    few_done = [bucket(i, completions=1.0, ongoing=3.0) for i in range(1, 5)]
    assert service_time_s(few_done, 0.4, 0.25) == 0.25  # 4 completions: not enough
    assert service_time_s([], 0.4, 0.25) == 0.25


def test_a_long_service_time_is_measured_over_a_longer_window() -> None:
    # 12 s requests at 2 req/s: 2 completions in 1 s (too few), 60 in 30 s
    samples = [bucket(i, arrivals=0.2, completions=0.2, ongoing=24.0) for i in range(1, 301)]
    assert service_time_s(samples, 30.0, 0.01) == 0.01  # over 1 s: the default
    assert service_time_s(samples, 30.0, 0.01, seconds=30.0) == pytest.approx(12.0)
    assert service_time_s(samples[-20:], 30.0, 0.01, seconds=30.0) == 0.01  # 4 in 2 s


def llm_burst() -> list[LoadSample]:
    """30 s of 2 req/s of 12 s requests (24 in flight), then 10 arrivals in 0.3 s."""
    return [bucket(i, arrivals=10 / 3 if i > 297 else 0.2, completions=0.2, ongoing=24.0)
            for i in range(1, 301)]


def test_an_llm_deployments_rate_is_read_over_its_service_time() -> None:
    # Its engines report: the 12 s service time is measured over its window, and the
    # rate and slope over 12 s, so the burst is a few requests more in flight a lead from
    # now, not 33 req/s that last (33 x 12 / 8 = 50 replicas): the 24 in flight relax
    # towards the projected rate x 12 s with time constant 12 s, for the 2 s lead, plus
    # 1.5 standard deviations of that (llm_in_flight_spread).
    llm = config(max_replicas=64, target_ongoing_requests=8, upscale_delay_s=30.0)
    inputs = ScalingInputs(30.0, 3, 3, llm_burst(), 2.0, engine=EngineLoad(3, 0, 24, 0.1))
    decision = proactive(inputs, llm, PolicyState())
    assert decision.signals["service_time_s"] == pytest.approx(12.0)
    assert decision.signals["rate_window_s"] == decision.signals["slope_window_s"] == \
        pytest.approx(12.0)
    assert decision.signals["rate"] == pytest.approx(2.7833, abs=1e-4)
    projected = decision.signals["projected_rate"]
    assert projected == pytest.approx(3.5471, abs=1e-4)
    ahead = (projected * 12.0 - 24.0) * (1 - math.exp(-2.0 / 12.0))
    assert decision.signals["in_flight_ahead"] == pytest.approx(ahead)
    gone = 1 - math.exp(-2.0 / 12.0)
    spread = 1.5 * math.sqrt(24.0 * gone * (1 - gone) + projected * 12.0 * gone)
    assert decision.signals["in_flight_headroom"] == pytest.approx(spread)
    assert decision.signals["demand_replicas"] == pytest.approx((24.0 + ahead + spread) / 8)
    # 3.94 replicas of 3: up at once (no surge band for an LLM deployment)
    assert (decision.target, decision.kind) == (4, "up")
    # Without engines the 1 s window sees 2 completions: the default service time.
    bare = proactive(ScalingInputs(30.0, 3, 3, llm_burst(), 2.0), llm, PolicyState())
    assert bare.signals["rate_window_s"] == 0.3
    assert bare.signals["service_time_s"] == 0.01
    assert bare.signals["in_flight_headroom"] == 0.0


def test_steady_load_below_capacity_holds() -> None:
    # 700 req/s at 200 req/s per replica: 3.5 replicas, inside (0.7 x 4, 4].
    state = PolicyState()
    for now in (10.0, 10.1, 40.0, 500.0):
        decision = decide(traffic([(-1e9, 700.0)], now), now, 4, 4, state=state)
        assert (decision.target, decision.kind, *timers(decision)) == (4, "hold", None,
                                                                            None)
        assert decision.signals["demand_replicas"] == pytest.approx(3.5)
        state = decision.state


STEP = [(-1e9, 100.0), (10.0, 2000.0)]  # 100 -> 2000 req/s; the first 2000 bucket ends 10.1


def test_step_up_is_sized_on_the_first_tick_without_delay() -> None:
    before = decide(traffic(STEP, 10.0), 10.0, 4, 4)
    assert before.target == 4
    after = decide(traffic(STEP, 10.1), 10.1, 4, 4, state=before.state)
    # rate (10 + 10 + 200) / 0.3 = 733.3 req/s; slope over the last ten buckets
    # 855 / 0.825 = 1036.4 req/s^2; projected over 1 s: 1769.7 req/s; service 10 ms
    # -> 200 req/s per replica -> 8.85 replicas. The 20 requests in flight already say
    # 20 / 2 = 10 replicas: the step's full size, on its first tick.
    assert after.signals["rate"] == pytest.approx(2200 / 3)
    assert after.signals["slope"] == pytest.approx(855 / 0.825)
    assert after.signals["projected_rate"] == pytest.approx(2200 / 3 + 855 / 0.825)
    assert after.signals["service_time_s"] == pytest.approx(SERVICE_S)
    assert after.signals["demand_replicas"] == pytest.approx(10.0)
    assert (after.target, after.kind, *timers(after)) == (10, "up", None, None)
    assert after.reason.startswith("up: 733 req/s offered, slope +1036/s, projected 1770 "
                                   "over 1.00s lead, 200 req/s per replica -> 10.0 replicas")
    settled = decide(traffic(STEP, 11.0), 11.0, 4, 10, state=after.state)
    assert (settled.target, settled.kind) == (10, "hold")


def test_step_up_is_capped_by_max_step_factor() -> None:
    assert decide(traffic(STEP, 10.1), 10.1, 1, 1).target == 4  # 1 x 4, not 10
    settings_ = ProactiveSettings(max_step_factor=2.0)
    assert decide(traffic(STEP, 10.1), 10.1, 1, 1, settings_=settings_).target == 2
    # running above the target (a shrink in progress) sets the base of the cap
    assert decide(traffic(STEP, 10.1), 10.1, 2, 1, settings_=settings_).target == 4
    # an upscaling_factor above max_step_factor widens the cap
    cfg = config(max_replicas=100, upscaling_factor=3.0)
    assert decide(traffic(STEP, 10.1), 10.1, 1, 1, cfg, settings_=settings_).target == 3


def test_step_up_never_exceeds_max_replicas() -> None:
    cfg = config(max_replicas=6)
    assert decide(traffic(STEP, 10.1), 10.1, 4, 4, cfg).target == 6
    assert decide(traffic(STEP, 11.0), 11.0, 6, 6, cfg).target == 6


def ramp(t: float) -> float:
    """100 req/s until 10 s, then growing by 1000 req/s every second."""
    return 100.0 + 1000.0 * max(0.0, t - 10.0)


def ramp_traffic(now: float) -> list[LoadSample]:
    end = round(now * 10)
    return [bucket(i, arrivals=ramp(i / 10) / 10, completions=ramp(i / 10) / 10,
                   ongoing=ramp(i / 10) * SERVICE_S) for i in range(end - 19, end + 1)]


@pytest.mark.parametrize(("lead", "expected"), [
    (0.0, 6),  # lead floored at 0.1 s: 1100 req/s -> 5.5; the 11 in flight say 5.5 too
    (1.0, 10),  # 1000 + 1000 x 1 = 2000 req/s -> 10
    (2.0, 15),  # 3000 req/s -> 15
])
def test_a_ramp_is_projected_over_the_startup_lead(lead: float, expected: int) -> None:
    # At 11 s the last three buckets offered 900, 1000, 1100 req/s: rate 1000, slope 1000.
    decision = decide(ramp_traffic(11.0), 11.0, 4, 4, lead=lead)
    assert decision.signals["rate"] == pytest.approx(1000.0)
    assert decision.signals["slope"] == pytest.approx(1000.0)
    assert decision.signals["projected_rate"] == pytest.approx(1000.0 + 1000.0 * max(lead,
                                                                                      0.1))
    assert (decision.target, decision.kind) == (expected, "up")


def bumped(now: float) -> list[LoadSample]:
    """700 req/s for 10 s, the last three buckets 770 (a late burst of reports)."""
    end = round(now * 10)
    arrivals = [77.0 if i > end - 3 else 70.0 for i in range(end - 99, end + 1)]
    return [bucket(i, arrivals=a, completions=a, ongoing=a * 10 * SERVICE_S)
            for i, a in zip(range(end - 99, end + 1), arrivals, strict=True)]


def test_the_slope_is_fit_over_at_least_a_quarter_of_the_lead_it_is_projected_over() -> None:
    # A lead of 20 s (a herd's): fit over 5 s, the bump reads +4.7 req/s per s and the
    # projection 4.3 replicas, inside the surge band (wait upscale_delay_s). Over 1 s it
    # would read +89 and project 12.8 replicas: a surge on a blip.
    decision = decide(bumped(20.0), 20.0, 4, 4, lead=20.0)
    assert decision.signals["slope_window_s"] == 5.0
    assert decision.signals["slope"] == pytest.approx(4.7395, abs=1e-4)
    assert decision.signals["demand_replicas"] == pytest.approx(4.3239, abs=1e-4)
    assert (decision.target, decision.kind) == (4, "hold")
    one_second = ProactiveSettings(lead_per_slope_window=20.0)
    blip = decide(bumped(20.0), 20.0, 4, 4, lead=20.0, settings_=one_second)
    assert blip.signals["slope_window_s"] == 1.0
    assert blip.signals["slope"] == pytest.approx(89.0909, abs=1e-4)
    assert (blip.target, blip.kind) == (13, "up")
    # Leads up to 4 s keep the 1 s window (every table above); past 40 s it stays 10 s.
    assert decide(bumped(20.0), 20.0, 4, 4, lead=4.0).signals["slope_window_s"] == 1.0
    assert decide(bumped(20.0), 20.0, 4, 4, lead=90.0).signals["slope_window_s"] == 10.0


def test_a_step_with_a_long_lead_is_still_sized_on_its_first_tick() -> None:
    # The 20 requests in flight say 10 replicas, whatever the slope's window.
    decision = decide(traffic(STEP, 10.1, seconds=6.0), 10.1, 4, 4, lead=20.0)
    assert decision.signals["slope_window_s"] == 5.0
    assert (decision.target, decision.kind) == (10, "up")


def test_falling_rate_is_not_projected_downwards() -> None:
    samples = traffic([(-1e9, 2000.0), (10.0, 100.0)], 10.1)
    decision = decide(samples, 10.1, 10, 10)
    assert decision.signals["slope"] < 0
    assert decision.signals["projected_rate"] == decision.signals["rate"]


def test_growth_inside_the_surge_band_waits_upscale_delay() -> None:
    # 900 req/s: 4.5 replicas wanted, not above 4 x 1.2 = 4.8: wait 30 s.
    rows = [(10.0, 4, 10.0), (25.0, 4, 10.0), (39.9, 4, 10.0), (40.0, 5, None)]
    state = PolicyState()
    for now, want, up in rows:
        decision = decide(traffic([(-1e9, 900.0)], now), now, 4, 4, state=state)
        assert (decision.target, *timers(decision)) == (want, up, None), f"at now={now}"
        state = decision.state
    assert "waiting upscale_delay_s=30" in decide(traffic([(-1e9, 900.0)], 10.0), 10.0, 4,
                                                  4).reason


def test_a_surge_clears_a_pending_scale_down() -> None:
    waiting = decide(traffic([(-1e9, 100.0)], 5.0), 5.0, 4, 4)
    assert timers(waiting) == (None, 5.0)
    surge = decide(traffic(STEP, 10.1), 10.1, 4, 4, state=waiting.state)
    assert (surge.target, *timers(surge)) == (10, None, None)


@pytest.mark.parametrize(("in_flight", "rate", "service_s", "lead_s", "expected"), [
    (24.0, 2.0, 12.0, 2.0, 0.0),  # settled: 2 req/s x 12 s is what it holds
    (24.0, 12.0, 12.0, 2.0, 120.0 * (1 - math.exp(-2.0 / 12.0))),  # a step 2 -> 12 req/s
    (0.0, 10.0, 1.0, 50.0, 10.0 * (1 - math.exp(-50.0))),  # short requests: rate x service
    (40.0, 2.0, 12.0, 2.0, 0.0),  # more than settles: never below now
    (5.0, 3.0, 0.0, 2.0, 0.0),  # no service time measured
])
def test_llm_in_flight_ahead_relaxes_towards_rate_times_service(
        in_flight: float, rate: float, service_s: float, lead_s: float,
        expected: float) -> None:
    assert llm_in_flight_ahead(in_flight, rate, service_s, lead_s) == pytest.approx(expected)


@pytest.mark.parametrize(("in_flight", "rate", "service_s", "lead_s", "expected"), [
    # 24 of 12 s requests, 2 req/s, 2 s lead: gone = 1 - e^(-1/6) = 0.1535;
    # 24 x 0.1535 x 0.8465 (binomial) + 2 x 12 x 0.1535 (Poisson) = 6.80
    (24.0, 2.0, 12.0, 2.0, math.sqrt(6.80)),
    (0.0, 0.0, 12.0, 2.0, 0.0),  # idle
    (24.0, 2.0, 0.0, 2.0, 0.0),  # no service time measured
    (0.0, 10.0, 1.0, 50.0, math.sqrt(10.0)),  # short requests: Poisson(rate x service)
    (-1.0, -1.0, 12.0, 2.0, 0.0),  # never the root of a negative
])
def test_llm_in_flight_spread_is_the_m_g_inf_standard_deviation_over_the_lead(
        in_flight: float, rate: float, service_s: float, lead_s: float,
        expected: float) -> None:
    assert llm_in_flight_spread(in_flight, rate, service_s, lead_s) == \
        pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize(("in_flight", "replicas", "lead", "target", "headroom"), [
    # 12 s requests, settled (as many arriving as finishing), batches of 8:
    # headroom 1.5 standard deviations (llm_spread_sd), 2.6 requests at 24 in flight
    (13.0, 2, 2.0, 2, 2.879),  # 1.99 replicas: held
    (14.0, 2, 2.0, 3, 2.988),  # 2.12: up with 2 slots free (before: 1.75, held)
    (16.0, 2, 2.0, 3, 3.195),  # full batches (before: 2.0, held until one more came)
    (20.0, 3, 2.0, 3, 3.572),
    (24.0, 3, 2.0, 4, 3.912),  # the ramp of bench/llm_sim_vs_real.py's trace: 23-24 of 24
    (180.0, 24, 2.0, 24, 10.715),  # a square root: 11 slots of 192 held free
    (190.0, 24, 2.0, 26, 11.008),  # 25.13
    # a 0.5 s start-up: the spread over a slot's turn, 12 s / 8 = 1.5 s (3.31, 3.16
    # replicas), not over the lead (2.0, 3.0: held, and a burst waits for a slot)
    (22.0, 3, 0.5, 4, 3.309),
])
def test_an_llm_deployment_scales_up_before_its_batches_are_full(
        in_flight: float, replicas: int, lead: float, target: int, headroom: float) -> None:
    # Sized on the mean alone, each scale-up of bench/llm_sim_vs_real.py's ramp came
    # once the batches were full (16 of 16, 23 of 24, 30 of 32 in flight) and what
    # arrived in the 2 s start-up waited seconds for a slot (TTFT p99 2.1 s, simulator).
    llm = config(max_replicas=64, target_ongoing_requests=8)
    inputs = ScalingInputs(40.0, replicas, replicas, llm_steady(in_flight, 40.0), lead,
                           engine=EngineLoad(replicas, 0, in_flight, 0.1))
    decision = proactive(inputs, llm, PolicyState())
    assert decision.signals["in_flight_ahead"] == pytest.approx(0.0)
    assert decision.signals["in_flight_headroom"] == pytest.approx(headroom, abs=5e-3)
    assert decision.target == target
    assert decision.kind == ("up" if target > replicas else "hold")
    # ... none with llm_spread_sd 0 (the mean alone, as before)
    mean = proactive(inputs, llm, PolicyState(), ProactiveSettings(llm_spread_sd=0.0))
    assert mean.target == replicas


def llm_steady(in_flight: float, now: float) -> list[LoadSample]:
    """40 s of an LLM deployment holding `in_flight` 12 s requests, 1 / 12 of them
    arriving and as many finishing a second (settled: nothing ahead)."""
    end = round(now * 10)
    return [bucket(i, arrivals=in_flight / 120, completions=in_flight / 120, ongoing=in_flight)
            for i in range(end - 399, end + 1)]


def test_an_llm_deployment_scales_up_on_any_excess_at_once() -> None:
    # 34 requests in flight at 8 a replica: 4.25 replicas of 4, inside the 20% band;
    # without engines it waits upscale_delay_s, with them it acts now (a request
    # beyond the batches waits for a sequence to finish, a TTFT miss in the making),
    # sized with 1.5 standard deviations of its in flight a lead from now (4.7 more).
    llm = config(max_replicas=64, target_ongoing_requests=8)
    samples = llm_steady(34.0, 40.0)
    bare = proactive(ScalingInputs(40.0, 4, 4, samples, 2.0), llm, PolicyState())
    assert (bare.target, bare.kind) == (4, "hold")
    inputs = ScalingInputs(40.0, 4, 4, samples, 2.0, engine=EngineLoad(4, 2, 32, 0.1))
    decision = proactive(inputs, llm, PolicyState())
    assert decision.signals["in_flight_ahead"] == pytest.approx(0.0)
    spread = llm_in_flight_spread(34.0, 34.0 / 12, 12.0, 2.0)
    assert spread == pytest.approx(3.104, abs=1e-3)
    assert decision.signals["demand_replicas"] == pytest.approx((34.0 + 1.5 * spread) / 8)
    assert (decision.target, decision.kind, *timers(decision)) == (5, "up", None, None)
    # ... unless told otherwise (4.83 replicas: inside 4 x 1.25)
    banded = proactive(inputs, llm, PolicyState(), ProactiveSettings(llm_surge_threshold=0.25))
    assert (banded.target, banded.kind) == (4, "hold")


def test_an_llm_scale_up_says_what_it_was_sized_on() -> None:
    # in flight + ahead + the spread margin against a replica's batch, not a rate per
    # replica (the sizing since the in-flight model); the engines' queues when they ask
    # for more; with objectives, what bound them first
    llm = config(max_replicas=64, target_ongoing_requests=8)
    samples = llm_steady(34.0, 40.0)
    engines = EngineLoad(4, 2, 32, 0.1)
    levels = proactive(ScalingInputs(40.0, 4, 4, samples, 2.0, engine=engines), llm,
                       PolicyState())
    assert levels.reason == (
        "up: 34 in flight + 0.0 ahead over 2.00s lead + 4.7 spread margin (1.5 sd) at 8 a "
        "replica -> 4.8 replicas (2.8 req/s offered, projected 2.8, 12.0s a request)")
    queues = proactive(ScalingInputs(40.0, 4, 4, samples, 2.0, engine_demand=9.0,
                                     engine=engines), llm, PolicyState())
    assert queues.reason == (
        "up: 34 in flight + 0.0 ahead over 2.00s lead + 4.7 spread margin (1.5 sd) at 8 a "
        "replica (4.8), the engines' queues 9.0 -> 9.0 replicas (2.8 req/s offered, "
        "projected 2.8, 12.0s a request)")
    ttft = config(max_replicas=64, target_ongoing_requests=8, objectives={"ttft_ms": 1000})
    backlog = EngineLoad(4, 2, 32, 0.1, prefill_backlog_tokens=60_000,
                         prefill_tokens_per_s=10_000, prompt_tokens=1_000)
    bound = proactive(ScalingInputs(40.0, 4, 4, samples, 2.0, engine=backlog), ttft,
                      PolicyState())
    assert bound.kind == "up_prefill"
    assert bound.reason.startswith("up: TTFT: 60000 prompt tokens waiting, 1000 a prompt at "
                                   "10000 tokens/s a replica -> ")
    assert bound.reason.endswith(
        " replicas (prefill-bound; KV 10%); 34 in flight + 0.0 ahead over 2.00s lead + 4.7 "
        "spread margin (1.5 sd); 2.8 req/s offered, projected 2.8, 12.0s a request")
    assert "per replica" not in levels.reason + queues.reason + bound.reason


def test_an_llm_deployment_scales_down_below_its_own_band() -> None:
    # 26 in flight of 10 replicas at 8: 3.25 replicas, 0.325 of 10 (below 0.6 and 0.7):
    # the wait starts; 52 in flight (6.5 replicas, 0.65 of 10) is below 0.7 but not
    # 0.6: an LLM deployment holds, timers cleared, where another would wait to go down.
    llm = config(max_replicas=64, target_ongoing_requests=8, downscale_delay_s=60.0)
    engines = EngineLoad(10, 0, 26, 0.1)
    low = proactive(ScalingInputs(40.0, 10, 10, llm_steady(26.0, 40.0), 2.0, engine=engines),
                    llm, PolicyState())
    assert (low.target, low.kind, *timers(low)) == (10, "hold", None, 40.0)
    assert "waiting downscale_delay_s=60" in low.reason
    later = proactive(ScalingInputs(100.0, 10, 10, llm_steady(26.0, 100.0), 2.0,
                                    engine=engines), llm, low.state)
    assert (later.target, later.kind) == (7, "down")  # half the gap to ceil(3.25)
    assert "below 60% of 10 for 60s" in later.reason
    mid = llm_steady(52.0, 40.0)
    held = proactive(ScalingInputs(40.0, 10, 10, mid, 2.0, engine=EngineLoad(10, 0, 52, 0.3)),
                     llm, PolicyState())
    assert (held.target, held.kind, *timers(held)) == (10, "hold", None, None)
    bare = proactive(ScalingInputs(40.0, 10, 10, mid, 2.0), llm, PolicyState())
    assert timers(bare) == (None, 40.0)


def test_drop_in_load_holds_until_downscale_delay_then_steps_down() -> None:
    # 100 req/s: 0.5 replicas wanted, below 0.7 x target. Each step halves the gap to
    # ceil(0.5) = 1 (at least one replica) and waits another downscale_delay_s (60 s).
    rows = [(20.0, 10, 20.0), (79.9, 10, 20.0), (80.0, 6, None),
            (80.1, 6, 80.1), (140.1, 4, None),
            (140.2, 4, 140.2), (200.2, 3, None),
            (200.3, 3, 200.3), (260.3, 2, None),
            (260.4, 2, 260.4), (320.4, 1, None),
            (320.5, 1, None), (1000.0, 1, None)]
    state, target = PolicyState(), 10
    for now, want, down in rows:
        samples = traffic([(-1e9, 100.0)], now)
        decision = decide(samples, now, target, target, state=state)
        assert (decision.target, *timers(decision)) == (want, None, down), f"at now={now}"
        state, target = decision.state, decision.target
    assert decision.kind == "hold"


def test_a_scale_down_goes_no_lower_than_the_most_its_delay_needed() -> None:
    # 10 replicas; the load falls to 100 req/s (0.5 replicas) but for one bucket at 30 s
    # asks for 5 (1000 req/s): after 60 s below the band it steps halfway to 5, the most
    # the delay needed, not halfway to its last moment's 1 (6): a lull's depth would be
    # the next burst's change of direction.
    state, target = PolicyState(), 10
    for now, rate in ((20.0, 100.0), (30.0, 1000.0), (50.0, 100.0), (80.0, 100.0)):
        decision = decide(traffic([(-1e9, rate)], now), now, target, target, state=state)
        state = decision.state
    assert (decision.target, decision.kind) == (8, "down")
    assert decision.reason.startswith("down: demand 0.5 replicas (at most 5.0) below")
    state = PolicyState(down_since=20.0, down_peak=8.2)
    decision = decide(traffic([(-1e9, 100.0)], 80.0), 80.0, 10, 10, state=state)
    assert decision.target == 9  # ceil(8.2)


def test_scale_down_never_goes_below_min_replicas() -> None:
    cfg = config(min_replicas=3, max_replicas=100, downscale_delay_s=60.0)
    state = decide(traffic([(-1e9, 100.0)], 0.0), 0.0, 4, 4, cfg).state
    decision = decide(traffic([(-1e9, 100.0)], 60.0), 60.0, 4, 4, cfg, state)
    assert (decision.target, decision.kind) == (3, "down")
    assert decision.reason == "down: demand 0.5 replicas (at most 0.5) below 70% of 4 for 60s"
    at_min = decide(traffic([(-1e9, 100.0)], 60.1), 60.1, 3, 3, cfg)
    assert (at_min.target, *timers(at_min)) == (3, None, None)
    # From 10 the step halves the gap to min_replicas (3), not to the demand (1).
    state = decide(traffic([(-1e9, 100.0)], 0.0), 0.0, 10, 10, cfg).state
    assert decide(traffic([(-1e9, 100.0)], 60.0), 60.0, 10, 10, cfg, state).target == 7


def test_queued_requests_count_as_demand() -> None:
    # No arrivals measured, but 30 requests in the system: 30 / 2 = 15 replicas.
    samples = [bucket(i, ongoing=10.0, queued=20.0) for i in range(80, 101)]
    decision = decide(samples, 10.0, 4, 4)
    assert decision.signals["demand_replicas"] == 15.0
    assert decision.target == 15


@pytest.mark.parametrize(("rate", "queued", "expected"), [
    (100.0, 0.0, 1),  # 0.5 replicas wanted: at least one
    (2000.0, 0.0, 10),  # sized for the demand at once, no step cap from zero
    (0.0, 5.0, 3),  # queued only: 5 / 2 = 2.5
])
def test_proactive_cold_start(rate: float, queued: float, expected: int) -> None:
    samples = [bucket(i, arrivals=rate / 10, queued=queued) for i in range(91, 101)]
    decision = decide(samples, 10.0, 0, 0, config(min_replicas=0, max_replicas=100),
                      PolicyState(up_since=1.0, user={"kept": 1}))
    assert (decision.target, decision.kind) == (expected, "cold_start")
    assert decision.state == PolicyState(user={"kept": 1})


def test_proactive_stays_at_zero_without_traffic() -> None:
    samples = [bucket(i) for i in range(91, 101)]
    decision = decide(samples, 10.0, 0, 0, config(min_replicas=0))
    assert (decision.target, decision.kind) == (0, "hold")
    assert decide([], 10.0, 0, 0, config(min_replicas=0)).target == 0


def test_proactive_respects_bounds_that_moved_under_the_target() -> None:
    # A schedule window raised min_replicas to 5 while the target is 4 and demand is
    # inside the surge band (4.5 replicas): the floor applies at once.
    cfg = config(min_replicas=5, max_replicas=10, upscale_delay_s=30.0)
    assert decide(traffic([(-1e9, 900.0)], 10.0), 10.0, 4, 4, cfg).target == 5
    # max_replicas lowered to 3 under a target of 4 with demand far below it.
    cfg = config(min_replicas=1, max_replicas=3, downscale_delay_s=60.0)
    assert decide(traffic([(-1e9, 100.0)], 10.0), 10.0, 4, 4, cfg).target == 3
    # ... and with demand inside the band.
    assert decide(traffic([(-1e9, 700.0)], 10.0), 10.0, 4, 4, cfg).target == 3


def test_proactive_settings_from_kwargs() -> None:
    assert ProactiveSettings.from_kwargs({"max_step_factor": 2.0}).max_step_factor == 2.0
    with pytest.raises(ValueError, match=r"unknown proactive policy_kwargs \['max_step'\]"):
        ProactiveSettings.from_kwargs({"max_step": 2.0})


def test_a_negative_llm_spread_is_refused() -> None:
    assert ProactiveSettings.from_kwargs({"llm_spread_sd": 0}).llm_spread_sd == 0
    for bad in (-0.5, "1.5", float("nan")):
        with pytest.raises(ConfigError, match=r"llm_spread_sd must be a number >= 0, got "):
            ProactiveSettings.from_kwargs({"llm_spread_sd": bad})


def test_default_service_time_is_used_until_completions_measure_it() -> None:
    # 50 req/s arriving, nothing completed yet: 50 x 0.1 s / 2 = 2.5 replicas.
    samples = [bucket(i, arrivals=5.0) for i in range(91, 101)]
    settings_ = ProactiveSettings(default_service_time_s=0.1)
    decision = decide(samples, 10.0, 4, 4, settings_=settings_)
    assert decision.signals["service_time_s"] == 0.1
    assert decision.signals["demand_replicas"] == pytest.approx(2.5)


# -- custom ----------------------------------------------------------------------------------


@dataclass
class Recorder:
    """A user policy returning fixed answers and keeping the contexts it saw."""

    desired: float = 3.0
    state: Mapping[str, Any] | None = None
    seen: list[AutoscalingContext] | None = None

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, Mapping[str, Any]]:
        if self.seen is None:
            self.seen = []
        self.seen.append(ctx)
        return self.desired, self.state if self.state is not None else {}


def test_custom_policy_sees_rays_context() -> None:
    user = Recorder()
    samples = [*steady(6, 30.0)[:-1], bucket(300, ongoing=6, queued=4, arrivals=5.0)]
    inputs = ScalingInputs(30.0, running=3, target=4, samples=samples)
    custom(user, inputs, config(max_replicas=7, min_replicas=2), PolicyState(user={"n": 1}),
           "model", "app")
    assert user.seen is not None
    ctx = user.seen[0]
    assert (ctx.deployment_name, ctx.app_name) == ("model", "app")
    assert (ctx.current_num_replicas, ctx.running_replicas, ctx.target_num_replicas) == (3, 3,
                                                                                        4)
    # The 30 s push: handle samples at 0..24 read 6, the one at 30 s reads 6 + 4.
    assert ctx.total_num_requests == 6.0
    assert ctx.total_queued_requests == 4.0
    assert (ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas) == (2, 7)
    assert ctx.policy_state == {"n": 1}
    assert ctx.current_time == 30.0
    assert ctx.arrival_rate == pytest.approx(10.0)  # 5 requests in the last 0.5 s


def test_custom_policy_state_round_trips_and_the_wrapper_applies_delays() -> None:
    def counting(ctx: AutoscalingContext) -> tuple[float, Mapping[str, Any]]:
        return 5.5, {"calls": ctx.policy_state.get("calls", 0) + 1}

    cfg = config(upscale_delay_s=30.0)
    state = PolicyState()
    for now, want, up in [(0.0, 2, 0.0), (29.9, 2, 0.0), (30.0, 6, None)]:
        decision = custom(counting, ScalingInputs(now, 2, 2, steady(1, now)), cfg, state)
        assert (decision.target, *timers(decision)) == (want, up, None)
        state = decision.state
    assert state.user == {"calls": 3}
    assert decision.reason == "up: custom policy wants 5.5"


@pytest.mark.parametrize(("desired", "expected"), [(1000.0, 10), (0.0, 1), (3, 3)])
def test_custom_policy_result_is_bounded(desired: float, expected: int) -> None:
    cfg = config(upscale_delay_s=0.0, downscale_delay_s=0.0)
    decision = custom(Recorder(desired, None), ScalingInputs(5.0, 4, 4, []), cfg,
                      PolicyState(user={"old": 1}))
    assert decision.target == expected
    assert decision.state.user == {}


@pytest.mark.parametrize("desired", [True, math.nan, math.inf, "3", None])
def test_custom_policy_must_return_a_finite_number(desired: Any) -> None:
    with pytest.raises(ValueError, match="it must return \\(number of replicas, state dict\\)"):
        custom(Recorder(desired), ScalingInputs(5.0, 1, 1, []), config(), PolicyState())


def test_custom_policy_at_zero_replicas_follows_rays_wrapper() -> None:
    # No delays: whatever the user policy wants would apply at once if it were asked.
    cfg = config(min_replicas=0, upscale_delay_s=0.0, downscale_delay_s=0.0)
    # Requests waiting: the cold-start fast path, whatever the user policy says.
    samples = [*steady(0, 12.3)[:-1], bucket(123, queued=2)]
    started = custom(Recorder(0.0), ScalingInputs(12.3, 0, 0, samples), cfg, PolicyState())
    assert (started.target, started.kind) == (1, "cold_start")
    # Nothing waiting: Ray keeps the target while no replica runs.
    idle = custom(Recorder(5.0), ScalingInputs(12.3, 0, 0, steady(0, 12.3)), cfg,
                  PolicyState(up_since=3.0))
    assert (idle.target, idle.kind) == (0, "hold")
    assert idle.state == PolicyState(up_since=3.0)  # Ray leaves its state alone
    assert idle.reason.endswith("(no replica running)")
    starting = custom(Recorder(0.0), ScalingInputs(12.3, 0, 2, steady(0, 12.3)), cfg,
                      PolicyState())
    assert (starting.target, starting.kind) == (2, "hold")


# -- properties ------------------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> AutoscalingConfig:
    low = draw(st.integers(0, 4))
    factor = st.none() | st.floats(0.1, 3.0)
    return AutoscalingConfig(
        min_replicas=low, max_replicas=max(1, low + draw(st.integers(0, 8))),
        target_ongoing_requests=draw(st.sampled_from([0.5, 1.0, 2.0, 5.0])),
        metrics_interval_s=draw(st.sampled_from([0.5, 1.0, 2.0])),
        look_back_period_s=draw(st.sampled_from([1.0, 2.0, 5.0])),
        upscale_delay_s=draw(st.sampled_from([0.0, 0.3, 2.0])),
        downscale_delay_s=draw(st.sampled_from([0.0, 0.5, 3.0])),
        downscale_to_zero_delay_s=draw(st.none() | st.sampled_from([0.0, 1.0])),
        upscaling_factor=draw(factor), downscaling_factor=draw(factor))


load_buckets = st.lists(st.tuples(*(st.integers(0, 300) for _ in range(5))), max_size=40)
steps = st.lists(st.tuples(st.sampled_from([0.1, 0.2, 0.5, 1.0, 2.5]), st.integers(0, 12)),
                 min_size=1, max_size=8)
Policy = Callable[[ScalingInputs, AutoscalingConfig, PolicyState], Decision]


def _user(ctx: AutoscalingContext) -> tuple[float, Mapping[str, Any]]:
    return ctx.total_num_requests / 3 + ctx.arrival_rate / 100, {"t": ctx.current_time}


POLICIES: dict[str, Policy] = {
    "ray_default": ray_default,
    "proactive": lambda i, c, s: proactive(i, c, s),
    "proactive_aggressive": lambda i, c, s: proactive(
        i, c, s, ProactiveSettings(max_step_factor=1.5, surge_threshold=0.0,
                                   downscale_band=0.95)),
    "custom": lambda i, c, s: custom(_user, i, c, s),
}


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(POLICIES)), cfg=configs(), loads=load_buckets,
       steps=steps, start=st.integers(0, 12), lead=st.sampled_from([0.0, 0.5, 3.0]))
def test_policies_stay_in_bounds_deterministic_one_timer(
        name: str, cfg: AutoscalingConfig, loads: list[tuple[int, ...]],
        steps: list[tuple[float, int]], start: int, lead: float) -> None:
    policy = POLICIES[name]
    series = [LoadSample((i + 1) / 10, a, c, r, q, o)
              for i, (a, c, r, q, o) in enumerate(loads)]
    now, target, state = len(series) / 10, start, PolicyState()
    for dt, running in steps:
        samples = [s for s in series if s.t <= now + 1e-9]
        inputs = ScalingInputs(now, running, target, samples, lead)
        decision = policy(inputs, cfg, state)
        assert cfg.min_replicas <= decision.target <= cfg.max_replicas, decision
        assert decision.state.up_since is None or decision.state.down_since is None, decision
        assert policy(inputs, cfg, state) == decision
        assert decision.kind in {"up", "down", "hold", "cold_start"}
        state, target = decision.state, decision.target
        now += dt


@settings(max_examples=100, deadline=None)
@given(cfg=configs(), loads=st.lists(st.integers(0, 100), min_size=1, max_size=80),
       now=st.floats(0.0, 12.0))
def test_ray_total_requests_lies_within_the_sampled_values(
        cfg: AutoscalingConfig, loads: list[int], now: float) -> None:
    series = [bucket(i + 1, ongoing=v) for i, v in enumerate(loads)]
    seen = ray_total_requests([s for s in series if s.t <= now], now, cfg)
    assert seen == 0.0 or min(loads) - 1e-9 <= seen <= max(loads) + 1e-9


@pytest.mark.parametrize(("aggregation", "expected"), [("max", 9.0), ("min", 1.0)])
def test_ray_total_requests_honours_max_and_min_aggregation(aggregation: str,
                                                            expected: float) -> None:
    config = AutoscalingConfig(metrics_interval_s=1.0, look_back_period_s=2.0,
                               aggregation_function=aggregation)
    samples = [LoadSample(t=round(0.1 * i, 1), arrivals=0, completions=0, rejections=0,
                          queued=0, ongoing=9.0 if i in (15, 16) else 1.0)
               for i in range(1, 31)]
    assert ray_total_requests(samples, 3.0, config) == expected


@pytest.mark.parametrize(("jump_rate", "engine", "rate", "target"), [
    # 2 req/s of 12 s requests on 3 replicas of 8, their batches full: 24 + 1.5 x 2.6
    # (llm_in_flight_spread) / 8 a replica
    (0.0, True, 2.0, 4),
    (1.0, True, 2.0, 4),  # a jump slower than the buckets' rate: the buckets'
    # 4 req/s: the 24 in flight relax towards 4 x 12 s = 48 over the 2 s lead:
    # 24 + 24 x (1 - e^(-2/12)) = 27.7, + 1.5 x 3.2, / 8 a replica = 4.07
    (4.0, True, 4.0, 5),
    (100.0, True, 100.0, 12),  # 25.5 replicas asked: max_step_factor's 4x
    (100.0, False, 2.0, 3),  # not an LLM deployment: no jump rate is read
])
def test_an_llm_deployment_sizes_on_the_rate_its_jump_implied(
        jump_rate: float, engine: bool, rate: float, target: int) -> None:
    """An urgent decision on a jump in an LLM router's arrivals (policy/arrival_jump.py)
    reads at least the rate the jump implied, as now and as projected."""
    llm = config(max_replicas=64, target_ongoing_requests=8, upscale_delay_s=30.0)
    samples = [bucket(i, arrivals=0.2, completions=0.2, ongoing=24.0) for i in range(1, 301)]
    load = EngineLoad(3, 0, 24, 0.1) if engine else None
    inputs = ScalingInputs(30.0, 3, 3, samples, 2.0, engine=load, jump_rate=jump_rate)
    decision = proactive(inputs, llm, PolicyState())
    assert decision.signals["rate"] == pytest.approx(rate)
    assert decision.signals["projected_rate"] == pytest.approx(rate)
    assert decision.target == target
