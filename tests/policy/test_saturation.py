"""Node CPU saturation on virtual time: when replicas added did not raise throughput.

Load is given as rates: `load(now, offered, completed)` is one second of buckets ending
at `now` at those rates, exactly what `rates` reads. Buckets last 1/8 s and times are
multiples of it, so every sum is exact in binary floating point.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.config import AutoscalingConfig
from surge.policy.autoscale_step import StepInputs, autoscale_step
from surge.policy.autoscaling import (
    Decision,
    DecisionKind,
    LoadSample,
    PolicyState,
    ScalingInputs,
)
from surge.policy.resolve import Policy
from surge.policy.saturation import (
    CLEAR_CPU,
    MAX_RISES,
    RECENT_S,
    SATURATED_CPU,
    SaturationState,
    hold_on_saturation,
    observe,
    rates,
)


def load(now: float, offered: float, completed: float) -> list[LoadSample]:
    """One second of buckets ending at `now` at these rates (per second)."""
    end = round(now * 8)
    return [LoadSample(t=i / 8, arrivals=offered / 8, completions=completed / 8,
                       rejections=0.0, queued=0.0, ongoing=0.0, duration_s=0.125)
            for i in range(end - 7, end + 1)]


def grown(at: float = 10.0, before: int = 2, after: int = 4,
          rate: float = 1000.0) -> SaturationState:
    """`before` replicas served `rate` req/s; at `at` there are `after` running."""
    return observe(SaturationState(running=before), at, after, 0.95, load(at, 2 * rate, rate))


# -- rates -----------------------------------------------------------------------------------


def test_rates_are_per_second_over_the_window_and_zero_without_samples() -> None:
    assert rates(load(5.0, 300, 200), 5.0) == (300, 200)
    assert rates(load(5.0, 300, 200), 5.5) == (300, 200)  # 0.5 s of it
    assert rates([], 5.0) == (0.0, 0.0)
    assert rates(load(5.0, 300, 200), 7.0) == (0.0, 0.0)  # all older than the window


# -- tracking additions ------------------------------------------------------------------------


def test_the_first_addition_takes_the_rate_and_replicas_before_it_as_the_base() -> None:
    state = grown()
    assert state == SaturationState(running=4, base_at=10.0, base_running=2, base_rate=1000.0,
                                    rises=((10.0, 4),))


def test_more_additions_within_recent_s_join_the_run_and_keep_its_base() -> None:
    state = observe(grown(), 12.0, 6, 0.5, load(12.0, 2000, 1100))
    assert (state.base_at, state.base_running, state.base_rate) == (10.0, 2, 1000.0)
    assert state.rises == ((10.0, 4), (12.0, 6))


def test_an_addition_after_recent_s_starts_a_new_run_from_the_current_rate() -> None:
    state = observe(grown(), 10.0 + RECENT_S + 0.125, 6, 0.5, load(15.125, 2000, 1900))
    assert (state.base_at, state.base_running, state.base_rate) == (15.125, 4, 1900.0)
    assert state.rises == ((15.125, 6),)


def test_an_addition_from_no_throughput_rebases_at_the_next_one() -> None:
    cold = observe(SaturationState(), 1.0, 1, 0.5, [])  # cold start: nothing served yet
    assert (cold.base_running, cold.base_rate) == (0, 0.0)
    state = observe(cold, 2.0, 3, 0.5, load(2.0, 900, 500))
    assert (state.base_at, state.base_running, state.base_rate) == (2.0, 1, 500.0)
    # from no replica (with completions of replicas that were draining): the same
    from_none = observe(SaturationState(), 1.0, 1, 0.5, load(1.0, 900, 400))
    assert (from_none.base_running, from_none.base_rate) == (0, 400.0)
    state = observe(from_none, 2.0, 3, 0.5, load(2.0, 900, 500))
    assert (state.base_at, state.base_running, state.base_rate) == (2.0, 1, 500.0)


def test_a_removal_ends_the_run_and_no_change_changes_nothing() -> None:
    state = grown()
    assert observe(state, 10.5, 4, 0.95, load(10.5, 2000, 1000)) == state
    assert observe(state, 10.5, 3, 0.5, load(10.5, 2000, 1000)) == SaturationState(running=3)


def test_a_run_remembers_at_most_max_rises_additions() -> None:
    state = grown()
    for i in range(1, MAX_RISES + 5):
        state = observe(state, 10.0 + i * 0.01, 4 + i, 0.5, load(10.0, 2000, 1000))
    assert len(state.rises) == MAX_RISES
    assert state.rises[-1][1] == 4 + MAX_RISES + 4


# -- the verdict -----------------------------------------------------------------------------


@pytest.mark.parametrize(("cpu", "dt", "offered", "completed", "saturated"), [
    (0.95, 1.0, 2000, 1050, True),    # 2 -> 4 replicas, +5 % throughput, demand unmet
    (0.95, 1.0, 2000, 1249, True),    # under a quarter of the +100 % they would add
    (0.95, 1.0, 2000, 1250, False),   # a quarter: they did raise it
    (SATURATED_CPU, 1.0, 2000, 1050, True),
    (0.89, 1.0, 2000, 1050, False),   # the CPU has room: something else limits
    (None, 1.0, 2000, 1050, False),   # no reading, no verdict
    (0.95, 1.0, 1155, 1050, False),   # demand met: nothing more was needed
    (0.95, 1.0, 1156, 1050, True),
    (0.95, 0.875, 2000, 1050, False),   # the added replicas have not served a window yet
    (0.95, RECENT_S, 2000, 1050, True),
    (0.95, RECENT_S + 0.125, 2000, 1050, False),  # added too long ago to blame
])
def test_the_verdict(cpu: float | None, dt: float, offered: float, completed: float,
                     saturated: bool) -> None:
    now = 10.0 + dt
    state = observe(grown(), now, 4, cpu, load(now, offered, completed))
    assert state.saturated is saturated
    assert (state.since == now) is saturated


def test_the_reason_carries_the_numbers() -> None:
    state = observe(grown(), 11.0, 4, 0.97, load(11.0, 2000, 1050))
    assert state.reason == ("node CPU 97% busy: 2 -> 4 replicas served 1000 -> 1050 req/s "
                            "of 2000 offered")


def test_only_replicas_that_served_a_whole_window_are_expected_to_add() -> None:
    state = observe(grown(), 10.5, 10, 0.95, load(10.5, 2000, 1000))  # 6 more at 10.5
    # At 11.0 only the first two added served a whole second: +1000 req/s expected of
    # them (a quarter: 250), so 1300 is enough; with all eight counted it would not be.
    assert not observe(state, 11.0, 10, 0.95, load(11.0, 2000, 1300)).saturated
    assert observe(state, 11.0, 10, 0.95, load(11.0, 2000, 1200)).saturated


def test_no_verdict_without_replicas_or_throughput_before_the_run() -> None:
    from_none = observe(SaturationState(running=0), 10.0, 2, 0.95, load(10.0, 900, 500))
    assert from_none.base_running == 0  # completions of replicas that were draining
    assert not observe(from_none, 11.0, 2, 0.95, load(11.0, 2000, 500)).saturated
    idle = replace(grown(), base_rate=0.0)
    assert not observe(idle, 11.0, 4, 0.95, load(11.0, 2000, 500)).saturated


def test_an_episode_holds_while_the_cpu_stays_busy_and_ends_below_clear_cpu() -> None:
    state = observe(grown(), 11.0, 4, 0.95, load(11.0, 2000, 1050))
    assert state.since == 11.0
    # Long after the additions, still busy: the episode lasts (no run is needed).
    later = observe(state, 30.0, 4, CLEAR_CPU, load(30.0, 2000, 1050))
    assert (later.since, later.reason) == (11.0, state.reason)
    assert observe(later, 31.0, 4, CLEAR_CPU - 0.01, []) == SaturationState(running=4)
    assert observe(later, 31.0, 4, None, []) == SaturationState(running=4)


# -- holding a decision ---------------------------------------------------------------------


def decision(target: int, kind: DecisionKind = DecisionKind.UP) -> Decision:
    return Decision(target, kind, f"{kind.value}: because", PolicyState(up_since=3.0),
                    {"rate": 5.0})


SATURATED = SaturationState(running=4, since=11.0, reason="node CPU 95% busy: ...")


def test_a_saturated_node_keeps_the_target_instead_of_adding() -> None:
    held = hold_on_saturation(decision(9), SATURATED, 4, 0.95)
    assert held == Decision(4, DecisionKind.NODE_SATURATED,
                            "hold: node CPU 95% busy: ...; not adding replicas on this node "
                            "(the policy asked for 9)", PolicyState(up_since=3.0),
                            {"rate": 5.0, "node_cpu": 0.95})


def test_a_cold_start_or_a_floor_is_never_held() -> None:
    cold = hold_on_saturation(decision(1), SATURATED, 0, 0.95)
    assert (cold.target, cold.kind) == (1, DecisionKind.UP)
    floor = hold_on_saturation(decision(6), SATURATED, 4, 0.95, floor=6)
    assert (floor.target, floor.kind) == (6, DecisionKind.UP)
    above = hold_on_saturation(decision(9), SATURATED, 6, 0.95, floor=6)
    assert (above.target, above.kind) == (6, DecisionKind.NODE_SATURATED)


@pytest.mark.parametrize(("state", "wanted", "cpu"), [
    (SATURATED, 2, 0.95),          # scaling down on a saturated node is fine
    (SATURATED, 4, 0.95),          # so is holding
    (SaturationState(), 9, 0.95),  # not saturated: up as asked
    (SaturationState(), 9, None),
])
def test_other_decisions_pass_with_the_node_cpu_signal(state: SaturationState, wanted: int,
                                                       cpu: float | None) -> None:
    out = hold_on_saturation(decision(wanted), state, 4, cpu)
    assert (out.target, out.kind) == (wanted, DecisionKind.UP)
    assert out.signals == ({"rate": 5.0} if cpu is None else {"rate": 5.0, "node_cpu": cpu})


# -- in the autoscaling step ----------------------------------------------------------------

CONFIG = AutoscalingConfig(min_replicas=1, max_replicas=20, upscale_delay_s=0.0)


def wants(target: int) -> Policy:
    def policy(inputs: ScalingInputs, config: AutoscalingConfig,
               state: PolicyState) -> Decision:
        return Decision(target, DecisionKind.UP if target > inputs.target else
                        DecisionKind.HOLD, "asked", state)

    return policy


def step_inputs(now: float, running: int, cpu: float | None, saturation: SaturationState,
                samples: list[LoadSample]) -> StepInputs:
    return StepInputs(now=now, second_of_day=0.0, running=running, target=running,
                      samples=samples, node_cpu=cpu, saturation=saturation)


def test_the_step_holds_an_up_once_the_added_replicas_did_not_help() -> None:
    first = autoscale_step(wants(4), CONFIG, PolicyState(),
                           step_inputs(10.0, 4, 0.95, SaturationState(running=2),
                                       load(10.0, 2000, 1000)))
    assert (first.target, first.decision.kind, first.saturated) == (4, DecisionKind.HOLD,
                                                                    False)
    second = autoscale_step(wants(8), CONFIG, PolicyState(),
                            step_inputs(11.0, 4, 0.95, first.saturation,
                                        load(11.0, 2000, 1050)))
    assert (second.target, second.decision.kind, second.saturated) == (
        4, DecisionKind.NODE_SATURATED, True)
    assert second.decision.signals["node_cpu"] == 0.95


def test_a_failing_policy_leaves_the_saturation_state_as_it_was() -> None:
    def broken(*_: object) -> Decision:
        raise RuntimeError("boom")

    step = autoscale_step(broken, CONFIG, PolicyState(),
                          step_inputs(11.0, 4, 0.95, SATURATED, []))
    assert step.failed and step.saturation is SATURATED


# -- properties ------------------------------------------------------------------------------

moves = st.lists(st.tuples(
    st.sampled_from([0.125, 0.5, 1.0, 3.0]),        # seconds until the next decision
    st.integers(min_value=-2, max_value=4),       # replicas added (or removed)
    st.one_of(st.none(), st.floats(0.0, 1.0)),    # node CPU
    st.floats(0.0, 5000.0), st.floats(0.0, 5000.0),  # offered, completed per second
    st.integers(min_value=1, max_value=30),       # what the policy asks for
), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(moves)
def test_a_saturated_step_never_raises_the_target_and_none_begins_below_saturated_cpu(
        script: list[tuple[float, int, float | None, float, float, int]]) -> None:
    now, running, state = 100.0, 2, SaturationState(running=2)
    for dt, delta, cpu, offered, completed, asked in script:
        now += dt
        running = max(0, running + delta)
        step = autoscale_step(wants(asked), CONFIG, PolicyState(),
                              step_inputs(now, running, cpu, state,
                                          load(now, offered, completed)))
        if step.saturated:
            assert cpu is not None and cpu >= CLEAR_CPU
            held = running >= max(1, CONFIG.min_replicas)  # never a cold start, nor below
            assert step.target <= running if held else step.target == asked  # the floor
            if not state.saturated:
                assert cpu >= SATURATED_CPU and step.saturation.since == now
        else:
            assert step.target == asked
        if cpu is None:
            assert step.saturation == SaturationState(running=running)
        state = step.saturation
