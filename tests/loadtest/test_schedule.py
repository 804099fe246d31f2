"""Rate schedules and arrival times: exact counts per 100 ms point, Poisson, worker splits."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.loadtest.schedule import Schedule, Segment, arrival_times, pulse
from surge.loadtest.stats import point_of

# 100 -> 2,000 req/s: 1 s baseline, 0.5 s ramp, 2 s hold, 0.5 s down, 1 s after.
PULSE = pulse(100, 2000, baseline_s=1, ramp_s=0.5, hold_s=2)
# Per 100 ms point of the ramp: expected(t) = 100 + 100 dt + 3800 dt^2 / 2.
RAMP_POINTS = [29, 67, 105, 143, 181]


def per_point(times: np.ndarray) -> list[int]:
    counts = collections.Counter(point_of(t) for t in times.tolist())
    return [counts.get(p, 0) for p in range(max(counts) + 1)]


def all_times(schedule: Schedule, chunk_s: float = 0.1, **kwargs: object) -> np.ndarray:
    edges = np.arange(0, schedule.duration_s + chunk_s, chunk_s)
    parts = [arrival_times(schedule, a, b, **kwargs)  # type: ignore[arg-type]
             for a, b in itertools.pairwise(edges)]
    return np.concatenate(parts)


def test_pulse_shape() -> None:
    assert PULSE.segments == (
        Segment(1, 100, 100), Segment(0.5, 100, 2000), Segment(2, 2000, 2000),
        Segment(0.5, 2000, 100), Segment(1, 100, 100))
    assert PULSE.duration_s == 5.0
    assert PULSE.total == pytest.approx(5250)
    assert PULSE.peak_rps == 2000
    assert PULSE.pulse_window() == (1.0, 4.0)
    assert [PULSE.rate_at(t) for t in (0, 0.99, 1.25, 1.5, 3.9, 4.5, 5.0)] == \
        pytest.approx([100, 100, 1050, 2000, 100 + 1900 * 0.2, 100, 0])
    assert "5s 5250 requests" in repr(PULSE)


def test_uniform_arrivals_exact_counts_per_point() -> None:
    times = all_times(PULSE)
    assert len(times) == 5250
    assert np.all(np.diff(times) > 0)
    expected = [10] * 10 + RAMP_POINTS + [200] * 20 + RAMP_POINTS[::-1] + [10] * 10
    assert per_point(times) == expected


def test_uniform_times_are_evenly_spaced_and_start_at_zero() -> None:
    times = arrival_times(pulse(100, 100, baseline_s=1, ramp_s=0, hold_s=0), 0, 0.1)
    assert times.tolist() == pytest.approx([i / 100 for i in range(10)])


def test_chunking_does_not_change_the_times() -> None:
    fine = all_times(PULSE, chunk_s=0.1)
    coarse = all_times(PULSE, chunk_s=0.7)
    assert len(fine) == len(coarse)
    assert np.allclose(fine, coarse)


def test_uniform_workers_partition_the_requests() -> None:
    single = all_times(PULSE)
    shares = [all_times(PULSE, worker=w, workers=3) for w in range(3)]
    assert sum(len(s) for s in shares) == len(single)
    assert np.allclose(np.sort(np.concatenate(shares)), single)
    assert [len(s) for s in shares] == [1750, 1750, 1750]


def test_poisson_is_seeded_and_about_right() -> None:
    first = all_times(PULSE, arrivals="poisson", rng=np.random.default_rng(7))
    again = all_times(PULSE, arrivals="poisson", rng=np.random.default_rng(7))
    other = all_times(PULSE, arrivals="poisson", rng=np.random.default_rng(8))
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert abs(len(first) - 5250) < 5 * 5250 ** 0.5
    assert np.all(np.diff(first) >= 0)
    assert first.min() >= 0 and first.max() < PULSE.duration_s
    # the hold (2,000/s) is ~20x denser than the baseline (100/s)
    hold = ((first >= 2.0) & (first < 3.0)).sum()
    base = (first < 1.0).sum()
    assert 1700 < hold < 2300 and 60 < base < 140


def test_poisson_workers_share_the_rate() -> None:
    rngs = [np.random.default_rng([3, w]) for w in range(2)]
    shares = [all_times(PULSE, arrivals="poisson", rng=rngs[w], worker=w, workers=2)
              for w in range(2)]
    total = sum(len(s) for s in shares)
    assert abs(total - 5250) < 5 * 5250 ** 0.5
    assert all(abs(len(s) - 2625) < 5 * 2625 ** 0.5 for s in shares)


def test_windows_outside_the_schedule_are_empty() -> None:
    assert len(arrival_times(PULSE, 5.0, 6.0)) == 0
    assert len(arrival_times(PULSE, 4.95, 6.0)) == 5  # the last half point only


@pytest.mark.parametrize("bad", [
    {"arrivals": "bursty"}, {"worker": 2, "workers": 2}, {"arrivals": "poisson"}])
def test_bad_arrival_arguments(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        arrival_times(PULSE, 0, 1, **bad)  # type: ignore[arg-type]


def test_from_spec_pulse_and_steps() -> None:
    assert Schedule.from_spec({"baseline_rps": 100, "peak_rps": 2000, "baseline_s": 1,
                               "ramp_s": 0.5, "hold_s": 2}) == PULSE
    steps = Schedule.from_spec([{"rps": 100, "for_s": 1}, {"to_rps": 2000, "over_s": 0.5},
                                {"rps": 2000, "for_s": 2},
                                {"from_rps": 2000, "to_rps": 100, "for_s": 0.5},
                                {"rps": 100, "for_s": 1}])
    assert steps == PULSE
    assert Schedule.from_spec(PULSE.to_spec() and [
        {"from_rps": s["from_rps"], "to_rps": s["to_rps"], "for_s": s["for_s"]}
        for s in PULSE.to_spec()]) == PULSE


@pytest.mark.parametrize("spec, message", [
    ({"baseline_rps": 1}, "peak_rps"),
    ({"baseline_rps": 1, "peak_rps": 2, "hold": 3},
     "pulse: unknown key 'hold'. Did you mean 'hold_s'\\?"),
    ([{"rps": 1}], "step 1"),
    ([{"rps": 1, "for_s": 1}, 5], "step 2"),
    ("fast", "pulse mapping"),
    ([{"rps": -1, "for_s": 1}], "start_rps must be a number >= 0, got -1."),
    ([], "at least one segment"),
])
def test_from_spec_rejects(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Schedule.from_spec(spec)


def test_zero_length_pulse_is_rejected() -> None:
    with pytest.raises(ValueError, match="0 s"):
        pulse(1, 2, baseline_s=0, ramp_s=0, hold_s=0, after_s=0)


def test_flat_schedule_has_no_pulse_window() -> None:
    assert Schedule((Segment(2, 50, 50),)).pulse_window() is None


segments = st.lists(st.builds(Segment, st.floats(0.01, 5), st.floats(0, 5000),
                              st.floats(0, 5000)), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(segments, st.floats(0, 1))
def test_time_of_inverts_expected(parts: list[Segment], fraction: float) -> None:
    schedule = Schedule(tuple(parts))
    count = fraction * schedule.total
    t = float(schedule.time_of(np.array([count]))[0])
    assert 0 <= t <= schedule.duration_s + 1e-9
    assert schedule.expected(t) == pytest.approx(count, rel=1e-6, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(segments)
def test_uniform_count_is_the_ceiling_of_the_total(parts: list[Segment]) -> None:
    schedule = Schedule(tuple(parts))
    times = arrival_times(schedule, 0, schedule.duration_s)
    assert abs(len(times) - schedule.total) < 1 + 1e-6
    assert np.all(np.diff(times) >= -1e-12)


def test_time_of_stays_inside_the_segment_at_subnormal_rates() -> None:
    tiny = 1.1125369292536007e-308
    schedule = Schedule((Segment(1.0, tiny, tiny),))
    t = float(schedule.time_of(np.array([schedule.total]))[0])
    assert 0 <= t <= 1.0
