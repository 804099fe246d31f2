"""The Record and the summary, driven on a fake timeline with exact counts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from surge.loadtest.schedule import Schedule, Segment, pulse
from surge.loadtest.stats import (
    Record,
    ReplicaSample,
    interpolated_percentile,
    latency_key,
    merge_histograms,
    percentile,
    point_of,
    replica_points,
)
from surge.loadtest.summary import _metric, series, summarize


class FakeRun:
    """Plays requests onto a Record as the generator would, at explicit times."""

    def __init__(self) -> None:
        self.record = Record()

    def request(self, at: float, latency: float | None, status: str = "200",
                lag: float = 0.0) -> None:
        self.record.sent_at(point_of(at), lag)
        if latency is None:
            self.record.unanswered += 1
        elif status == "200":
            self.record.ok_at(point_of(at), point_of(at + latency), latency)
        else:
            self.record.error_at(status, point_of(at), point_of(at + latency))
            if status in ("503", "429"):  # as the generator does
                self.record.refused_at(point_of(at), latency)

    def steady(self, start: float, seconds: float, rps: int, latency: float,
               status: str = "200") -> None:
        for i in range(round(seconds * rps)):
            self.request(start + i / rps, latency, status)


def test_point_of_tolerates_float_dust() -> None:
    assert [point_of(t) for t in (0.0, 0.0999, 0.1, 0.30000000000000004, 0.2999999999999)] \
        == [0, 0, 1, 3, 3]
    assert point_of(-0.01) == 0


@pytest.mark.parametrize("seconds, key", [
    (0.0, 0), (0.000001, 1), (0.002047, 2047), (0.0020479, 2047), (0.004097, 4096),
    (1.0, 999936), (-1.0, 0)])
def test_latency_key(seconds: float, key: int) -> None:
    assert latency_key(seconds) == key


def test_latency_key_relative_error_is_below_a_thousandth() -> None:
    for us in range(2048, 10_000_000, 997):
        assert 0 <= us - latency_key(us / 1e6) < us / 1024 + 1


def test_percentile_is_nearest_rank() -> None:
    histogram = {1000: 50, 2000: 40, 5000: 9, 90000: 1}
    assert percentile(histogram, 0.5) == 1.0
    assert percentile(histogram, 0.51) == 2.0
    assert percentile(histogram, 0.9) == 2.0
    assert percentile(histogram, 0.99) == 5.0
    assert percentile(histogram, 0.999) == 90.0
    assert percentile(histogram, 0.0) == 1.0
    assert percentile({}, 0.5) is None


_SEEDED = random.Random(3)


@pytest.mark.parametrize("seconds", [
    [0.010, 0.020],  # vLLM's median 15 ms where the nearest rank says 10
    [0.100, 0.100, 0.100, 1.000],
    [0.0005, 0.001, 0.0015, 0.002],  # kept exactly (below 2.048 ms)
    [0.042],
    [_SEEDED.lognormvariate(-3, 1) for _ in range(257)],
])
def test_vllms_percentiles_interpolate_as_numpy_does(seconds: list[float]) -> None:
    histogram = merge_histograms({latency_key(s): 1} for s in seconds)
    kept = [latency_key(s) / 1000.0 for s in seconds]  # ms, within 0.1 %
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        got = interpolated_percentile(histogram, q)
        assert got == pytest.approx(float(np.percentile(kept, q * 100)), rel=1e-12)
        assert got == pytest.approx(float(np.percentile(seconds, q * 100)) * 1000, rel=1e-3)
    assert interpolated_percentile({}, 0.5) is None
    metric = _metric("ttft", histogram)
    assert metric["median_ttft_ms"] == round(float(np.percentile(kept, 50)), 3)
    assert metric["p99_ttft_ms"] == round(float(np.percentile(kept, 99)), 3)


def test_merge_histograms() -> None:
    assert merge_histograms([{1: 2, 3: 4}, {3: 1, 5: 1}, {}]) == {1: 2, 3: 5, 5: 1}


def test_counts_per_point_on_a_fake_timeline() -> None:
    run = FakeRun()
    run.steady(0.0, 1.0, 100, 0.005)  # 100 ok, 5 ms each
    run.steady(1.0, 0.5, 40, 0.001, status="503")  # 20 fast 503s
    run.request(1.5, 0.25, status="timeout")
    run.request(1.55, None)  # unanswered
    record = run.record
    assert record.sent == 122
    assert record.total_ok == 100
    assert record.error_totals() == {"503": 20, "timeout": 1, "connection": 0}
    assert record.unanswered == 1
    record.check()
    assert record.offered[:10] == [10] * 10
    assert record.offered[10:16] == [4, 4, 4, 4, 4, 2]
    # completions: the 5 ms latency moves nothing across points except none; the
    # timeout completes at 1.75 s (point 17)
    assert record.ok[:10] == [10] * 10
    assert record.errors["timeout"][17] == 1 and record.errors_sent["timeout"][15] == 1
    assert record.points == 18
    assert "sent=122 ok=100" in repr(record)


def test_check_catches_a_lost_request() -> None:
    record = Record()
    record.sent_at(0, 0.0)
    with pytest.raises(AssertionError, match="accounting"):
        record.check()


def test_series_rates_are_per_second() -> None:
    run = FakeRun()
    run.steady(0.0, 0.3, 100, 0.004)
    run.request(0.05, 0.02, status="503")
    points = series(run.record, [ReplicaSample(0.05, 2, 3), None, None])
    assert [p["t"] for p in points] == [0.0, 0.1, 0.2]
    assert [p["offered"] for p in points] == [110.0, 100.0, 100.0]
    assert [p["ok"] for p in points] == [100.0, 100.0, 100.0]
    assert points[0]["errors"] == {"503": 10.0} and points[1]["errors"] == {}
    assert points[0]["p50_ms"] == points[0]["p99_ms"] == 4.0
    assert points[0]["replicas"] == 2 and points[0]["target_replicas"] == 3
    assert points[1]["replicas"] is None
    assert series(run.record)[0]["replicas"] is None


def test_reserve_does_not_add_points() -> None:
    record = Record()
    record.reserve(100)
    assert record.points == 0
    record.sent_at(3, 0.0)
    record.ok_at(3, 4, 0.05)
    assert record.points == 5


def test_hot_path_grows_lists_beyond_the_reservation() -> None:
    record = Record()
    record.reserve(2)
    record.sent_at(5, 0.002)
    record.ok_at(5, 7, 0.2)
    assert record.offered[5] == 1 and record.ok[7] == 1 and record.latency[5] == {199936: 1}
    assert record.lag == {2000: 1} and record.lag_max[5] == 0.002


def test_merge_adds_workers_records() -> None:
    a, b, both = FakeRun(), FakeRun(), FakeRun()
    for run in (a, both):
        run.steady(0.0, 1.0, 50, 0.003)
        run.request(0.5, 0.1, status="500")
    for run in (b, both):
        run.steady(0.01, 2.0, 50, 0.007)
        run.request(1.9, None)
    a.record.connections_peak, b.record.connections_peak = 3, 4
    merged = Record()
    merged.merge(a.record)
    merged.merge(b.record)
    assert merged.offered == both.record.offered
    assert merged.ok == both.record.ok
    assert merged.errors == both.record.errors
    assert merged.latency == both.record.latency
    assert merged.unanswered == 1 and merged.connections_peak == 7
    merged.check()


def test_refusals_are_timed_and_merged() -> None:
    a, b = FakeRun(), FakeRun()
    a.steady(0.0, 1.0, 100, 0.020)
    a.steady(1.0, 1.0, 100, 0.002, status="503")  # refused at once
    b.steady(1.0, 1.0, 100, 0.004, status="429")
    b.request(1.5, 0.5, status="500")  # a 500 is an error, not a refusal
    merged = Record()
    merged.merge(a.record)
    merged.merge(b.record)
    assert sum(sum(h.values()) for h in merged.refused) == 200
    summary = summarize(merged, Schedule((Segment(2.0, 100.0, 100.0),)), slo_ms=100)
    assert summary["refused_p99_ms"] == latency_key(0.004) / 1000
    assert summary["baseline"]["refused_p99_ms"] == latency_key(0.004) / 1000
    assert summarize(a.record, Schedule((Segment(1.0, 100.0, 100.0),)),
                     slo_ms=100)["baseline"]["refused_p99_ms"] is None


def test_window_for_the_progress_line() -> None:
    run = FakeRun()
    run.steady(0.0, 2.0, 100, 0.01)
    run.request(1.5, 0.01, status="503")
    window = run.record.window(10, 20)
    assert (window.offered, window.ok, window.errors) == (101, 100, 1)
    assert window.seconds == pytest.approx(1.0)
    assert window.p99_ms == 10.0
    assert run.record.window(-5, 0).offered == 0


# -- replicas --------------------------------------------------------------------------


def test_replica_points_take_the_latest_fresh_sample() -> None:
    samples = [ReplicaSample(0.02, 1, 1), ReplicaSample(0.13, 1, 4), ReplicaSample(0.24, 4, 4)]
    points = replica_points(samples, 10)
    assert [p.running if p else None for p in points] == [1, 1, 4, 4, 4, 4, 4, None, None,
                                                          None]
    assert points[1] == ReplicaSample(0.13, 1, 4)
    assert replica_points([], 2) == [None, None]


# -- summary ---------------------------------------------------------------------------

SCHEDULE = pulse(100, 1000, baseline_s=1, ramp_s=0, hold_s=1, ramp_down_s=0, after_s=1)


def pulse_run(slow_points: int) -> FakeRun:
    """Baseline 100/s at 2 ms; the pulse 1,000/s at 300 ms for `slow_points`, then 5 ms."""
    run = FakeRun()
    run.steady(0.0, 1.0, 100, 0.002)
    for i in range(1000):
        at = 1.0 + i / 1000
        slow = point_of(at) - 10 < slow_points
        if i % 100 == 0:
            run.request(at, 0.001, status="503")
        else:
            run.request(at, 0.3 if slow else 0.005)
    run.steady(2.0, 1.0, 100, 0.002)
    return run


def test_summary_of_a_pulse() -> None:
    samples = [ReplicaSample(t / 10, 1 if t < 13 else 3 if t < 16 else 5, 5) for t in range(40)]
    summary = summarize(pulse_run(slow_points=4).record, SCHEDULE, slo_ms=100,
                        replicas=samples)
    assert summary["sent"] == 1200
    assert summary["ok"] == 1190
    assert summary["errors"] == {"503": 10, "timeout": 0, "connection": 0}
    assert summary["unanswered"] == 0
    assert summary["success_pct"] == pytest.approx(100 * 1190 / 1200, abs=1e-3)
    assert summary["rate_503_pct"] == pytest.approx(100 * 10 / 1200, abs=1e-3)
    assert summary["peak_offered_rps"] == 1000.0
    assert summary["baseline"]["sent"] == 100 and summary["baseline"]["p99_ms"] == 2.0
    assert summary["baseline"]["from_s"] == 0.0 and summary["baseline"]["to_s"] == 1.0
    pulse_phase = summary["pulse"]
    assert pulse_phase["sent"] == 1000 and pulse_phase["ok"] == 990
    assert pulse_phase["errors"] == {"503": 10}
    assert pulse_phase["p50_ms"] == 5.0
    assert pulse_phase["p99_ms"] == latency_key(0.3) / 1000
    assert summary["recovery_s"] == 0.4
    assert summary["over_slo_s"] == 0.4
    assert summary["max_replicas"] == 5 and summary["start_replicas"] == 1
    assert summary["replicas_added_after_s"] == 0.3
    assert summary["max_replicas_after_s"] == 0.6
    assert summary["generator"]["behind"] is False


def test_recovery_when_never_over_and_never_back() -> None:
    fine = summarize(pulse_run(slow_points=0).record, SCHEDULE, slo_ms=100)
    assert (fine["recovery_s"], fine["over_slo_s"]) == (0.0, 0.0)
    assert fine["max_replicas"] is None
    stuck = summarize(pulse_run(slow_points=10).record, SCHEDULE, slo_ms=100)
    assert stuck["recovery_s"] is None and stuck["over_slo_s"] == 1.0
    relaxed = summarize(pulse_run(slow_points=10).record, SCHEDULE, slo_ms=500)
    assert relaxed["recovery_s"] == 0.0


def test_timeouts_keep_a_point_over_the_slo() -> None:
    run = pulse_run(slow_points=0)
    run.request(1.95, 10.0, status="timeout")
    summary = summarize(run.record, SCHEDULE, slo_ms=100)
    assert summary["recovery_s"] is None  # the last pulse point lost a request
    assert summary["errors"]["timeout"] == 1


def test_generator_lag_is_reported() -> None:
    run = FakeRun()
    run.request(0.0, 0.001, lag=0.0004)
    run.request(0.5, 0.001, lag=0.035)
    run.record.waited = 3
    summary = summarize(run.record, Schedule((Segment(1, 2, 2),)), slo_ms=100)
    generator = summary["generator"]
    assert generator["behind"] is True and generator["behind_s"] == 0.1
    assert generator["lag_max_ms"] == 35.0 and generator["lag_p50_ms"] == 0.4
    assert generator["waited_for_connection"] == 3
    assert summary["pulse"] is None and summary["recovery_s"] is None


# -- the node's CPU ----------------------------------------------------------------------------


def cpu_samples(pulse_cpu: float) -> list[ReplicaSample]:
    """Half the cores busy, `pulse_cpu` during the pulse (points 10-19)."""
    return [ReplicaSample(t / 10, 2, 2, pulse_cpu if 10 <= t < 20 else 0.5) for t in range(40)]


def test_the_machine_was_the_limit_while_its_cpu_was_saturated_and_requests_suffered() -> None:
    run = pulse_run(slow_points=4)  # each pulse point has a 503; four are over the SLO
    summary = summarize(run.record, SCHEDULE, slo_ms=100, replicas=cpu_samples(0.97))
    assert (summary["node_cpu_peak_pct"], summary["node_saturated_s"],
            summary["machine_limited"]) == (97.0, 1.0, True)
    points = series(run.record, replica_points(cpu_samples(0.97), run.record.points))
    assert [p["node_cpu_pct"] for p in points[9:11]] == [50.0, 97.0]


def test_429_refusals_count_as_suffering_as_503s_do() -> None:
    run = FakeRun()
    run.steady(0.0, 3.0, 100, 0.002)
    for i in range(10):  # backpressure_config status_code 429, fast, within the SLO
        run.request(1.0 + i / 10, 0.002, status="429")
    summary = summarize(run.record, SCHEDULE, slo_ms=100, replicas=cpu_samples(0.97))
    assert (summary["node_saturated_s"], summary["machine_limited"]) == (1.0, True)


def test_a_busy_cpu_alone_or_suffering_alone_is_no_machine_limit() -> None:
    room = summarize(pulse_run(slow_points=4).record, SCHEDULE, slo_ms=100,
                     replicas=cpu_samples(0.85))
    assert (room["node_cpu_peak_pct"], room["node_saturated_s"], room["machine_limited"]) == (
        85.0, 0.0, False)
    run = FakeRun()
    run.steady(0.0, 3.0, 100, 0.002)  # all served in time, however busy the CPU
    fine = summarize(run.record, SCHEDULE, slo_ms=100, replicas=cpu_samples(0.99))
    assert (fine["node_cpu_peak_pct"], fine["machine_limited"]) == (99.0, False)


def test_no_cpu_reading_means_no_node_summary() -> None:
    summary = summarize(pulse_run(slow_points=4).record, SCHEDULE, slo_ms=100,
                        replicas=[ReplicaSample(t / 10, 2, 2) for t in range(40)])
    assert (summary["node_cpu_peak_pct"], summary["node_saturated_s"],
            summary["machine_limited"]) == (None, None, None)
