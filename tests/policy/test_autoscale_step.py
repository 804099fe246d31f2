"""policy.autoscale_step: the lead the policy projects over is a ready standby's, and the
cold start's for what the standbys cannot give."""

from __future__ import annotations

import pytest

from surge.config import AutoscalingConfig
from surge.policy.autoscale_step import (
    STANDBY_LEAD_S,
    URGENT_DECISION_INTERVAL_S,
    StepInputs,
    autoscale_step,
    urgent_decision_due,
    urgent_decision_wait,
)
from surge.policy.autoscaling import LoadSample, PolicyState, proactive
from surge.policy.engine_load import EngineLoad

CONFIG = AutoscalingConfig(min_replicas=1, max_replicas=100, target_ongoing_requests=2,
                           upscale_delay_s=30.0, downscale_delay_s=60.0)


def ramp(t: float) -> float:
    """100 req/s until 10 s, then growing by 1000 req/s every second (10 ms requests)."""
    return 100.0 + 1000.0 * max(0.0, t - 10.0)


SAMPLES = [LoadSample(t=i / 10, arrivals=ramp(i / 10) / 10, completions=ramp(i / 10) / 10,
                      rejections=0, queued=0, ongoing=ramp(i / 10) * 0.01)
           for i in range(91, 111)]


@pytest.mark.parametrize(("standbys", "target", "projected", "why"), [
    (0, 15, 3000.0, "no standby: 1000 req/s + 1000/s over the 2 s cold start"),
    (2, 6, 1100.0, "2 ready: they serve in 50 ms (floored at 0.1 s): 1100 req/s, 4 -> 6"),
    (20, 6, 1100.0, "more ready than needed: the same"),
    (1, 15, 3000.0, "1 ready, 2 wanted over its lead: the rest start cold, sized over 2 s"),
])
def test_the_lead_is_a_ready_standbys(standbys: int, target: int, projected: float,
                                      why: str) -> None:
    step = autoscale_step(proactive, CONFIG, PolicyState(), StepInputs(
        now=11.0, second_of_day=0.0, running=4, target=4, samples=SAMPLES,
        startup_lead_s=2.0, standbys=standbys))
    assert step.target == target, why
    assert step.decision.signals["projected_rate"] == pytest.approx(projected), why


def test_a_cold_start_shorter_than_the_activation_keeps_its_own_lead() -> None:
    inputs = StepInputs(now=11.0, second_of_day=0.0, running=4, target=4, samples=SAMPLES,
                        startup_lead_s=STANDBY_LEAD_S / 2, standbys=3)
    assert autoscale_step(proactive, CONFIG, PolicyState(), inputs).target == 6


QUIET = [LoadSample(t=i / 10, arrivals=1.0, completions=1.0, rejections=0, queued=0,
                    ongoing=0.1) for i in range(91, 111)]  # 10 req/s, 10 ms each
WAITING = PolicyState(down_since=1.0, down_peak=0.5)  # below the band since 1 s


@pytest.mark.parametrize(("samples", "state", "urgent", "target", "kind", "down_since"), [
    # a surge: up, at a tick or between ticks
    (SAMPLES, PolicyState(), False, 15, "up", None),
    (SAMPLES, PolicyState(), True, 15, "up", None),
    # 10 replicas for 10 req/s: a tick starts the wait before a scale-down; between
    # ticks nothing is decided, the state stays as it was
    (QUIET, PolicyState(), False, 10, "hold", 11.0),
    (QUIET, PolicyState(), True, 10, "hold", None),
    # the wait (5 s) is over: a tick scales down, between ticks it is left to the tick
    (QUIET, WAITING, False, 6, "down", None),
    (QUIET, WAITING, True, 10, "hold", 1.0),
])
def test_an_urgent_step_only_scales_up(samples: list[LoadSample], state: PolicyState,
                                       urgent: bool, target: int, kind: str,
                                       down_since: float | None) -> None:
    config = AutoscalingConfig(min_replicas=1, max_replicas=100, target_ongoing_requests=2,
                               upscale_delay_s=30.0, downscale_delay_s=5.0)
    inputs = StepInputs(now=11.0, second_of_day=0.0, running=10, target=10,
                        samples=samples, startup_lead_s=2.0, urgent=urgent)
    step = autoscale_step(proactive, config, state, inputs)
    assert (step.target, step.decision.kind.value) == (target, kind)
    assert step.decision.state.down_since == down_since
    if urgent and kind == "hold":
        assert step.decision.state is state
        assert step.decision.reason.startswith("hold (between ticks only a scale-up")


@pytest.mark.parametrize(("urgent", "target"), [(True, 12), (False, 4)])
def test_only_an_urgent_step_reads_the_rate_a_jump_implied(urgent: bool, target: int) -> None:
    """2 req/s of 12 s requests on 3 replicas of 8, an LLM router's jump implying
    100 req/s: urgent, it is sized on (max_step_factor's 4x); at a tick, not read (the
    24 in flight and their spread a lead from now, policy.autoscaling.llm_in_flight_spread:
    4)."""
    config = AutoscalingConfig(min_replicas=1, max_replicas=64, target_ongoing_requests=8,
                               upscale_delay_s=30.0, downscale_delay_s=60.0)
    samples = [LoadSample(t=i / 10, arrivals=0.2, completions=0.2, rejections=0, queued=0,
                          ongoing=24.0) for i in range(1, 301)]
    inputs = StepInputs(now=30.0, second_of_day=0.0, running=3, target=3, samples=samples,
                        startup_lead_s=2.0, engine=EngineLoad(3, 0, 24, 0.1), urgent=urgent,
                        jump_rate=100.0)
    assert autoscale_step(proactive, config, PolicyState(), inputs).target == target


@pytest.mark.parametrize(("last_at", "now", "due", "wait"), [
    (0.0, 0.0, False, URGENT_DECISION_INTERVAL_S),  # decided just now: the whole interval
    (0.0, URGENT_DECISION_INTERVAL_S / 4, False, 0.75 * URGENT_DECISION_INTERVAL_S),
    (0.0, URGENT_DECISION_INTERVAL_S, True, 0.0),  # due at the interval's end
    (10.0, 11.0, True, 0.0),  # long past: due, never a negative wait
    (float("-inf"), 0.0, True, 0.0),  # never decided
])
def test_an_urgent_decision_not_yet_due_waits_out_the_interval(
        last_at: float, now: float, due: bool, wait: float) -> None:
    assert urgent_decision_due(last_at, now) is due
    assert urgent_decision_wait(last_at, now) == pytest.approx(wait)
