"""Hot-path recording: histogram bucketing, quantiles, and drains that hand over deltas."""

from __future__ import annotations

import math

import pytest

from surge.observability.recorder import (
    LATENCY_BUCKETS_MS,
    Histogram,
    Recorder,
    status_class,
)


@pytest.mark.parametrize(("value", "bucket"), [
    (0.0, 0), (0.1, 0), (0.11, 1), (0.25, 1), (1.0, 3), (1.5, 4), (600_000, 28),
    (600_001, 29), (math.inf, 29)])
def test_a_value_lands_in_the_first_bucket_whose_bound_holds_it(value: float,
                                                                bucket: int) -> None:
    histogram = Histogram()
    histogram.observe(value)
    assert histogram.counts.index(1) == bucket
    assert len(histogram.counts) == len(LATENCY_BUCKETS_MS) + 1


def test_ray_buckets_are_kept_and_sorted() -> None:
    ray = (1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000, 10000, 60000,
           120000, 300000, 600000)
    assert set(ray) <= set(LATENCY_BUCKETS_MS)
    assert list(LATENCY_BUCKETS_MS) == sorted(LATENCY_BUCKETS_MS)


def test_cumulative_buckets_end_with_inf_and_the_count() -> None:
    histogram = Histogram()
    for value in (0.05, 0.3, 0.3, 7, 10**9):
        histogram.observe(value)
    cumulative = histogram.cumulative()
    assert cumulative[0] == ("0.1", 1) and cumulative[2] == ("0.5", 3)
    assert ("10", 4) in cumulative
    assert cumulative[-1] == ("+Inf", 5) and histogram.count == 5
    assert histogram.sum == pytest.approx(0.05 + 0.6 + 7 + 10**9)


def test_quantiles_interpolate_inside_a_bucket_like_histogram_quantile() -> None:
    histogram = Histogram()
    assert histogram.quantile(0.5) is None
    for _ in range(100):
        histogram.observe(17)  # all in (15, 20]
    assert histogram.quantile(0.5) == pytest.approx(17.5)
    assert histogram.quantile(0.99) == pytest.approx(19.95)
    histogram.observe(10**9)
    assert histogram.quantile(1.0) == LATENCY_BUCKETS_MS[-1]


def test_merge_adds_counts_and_sums() -> None:
    a, b = Histogram(), Histogram()
    a.observe(1)
    b.observe(1)
    b.observe(100)
    a.merge(b)
    assert a.count == 3 and a.sum == 102 and a == Histogram(a.counts, 102)


def test_a_drain_hands_over_what_happened_since_the_last_one() -> None:
    recorder = Recorder("replica", "r-1", "app", "dep")
    recorder.processed("/x", 3.0, ok=True)
    recorder.processed("/x", 4.0, ok=False)
    recorder.rejected("app", "dep", "no_route")
    first = recorder.drain({"processing": 2})
    assert first.first and first.source == "r-1" and first.app == "app"
    assert first.processing["/x"].count == 2 and first.errors == {"/x": 1}
    assert first.rejections == {("app", "dep", "no_route"): 1}
    assert first.gauges == {"processing": 2} and not first.empty
    second = recorder.drain()
    assert not second.first and second.empty and first.processing["/x"].count == 2


def test_http_requests_are_keyed_by_labels_and_status() -> None:
    recorder = Recorder("proxy", "proxy-0")
    key = ("app", "dep", "/r", "GET", 200)
    recorder.http_request(key, 0.4)
    recorder.http_request(key, 0.6)
    recorder.http_request(("app", "dep", "/r", "GET", 503), 0.1)
    report = recorder.drain()
    assert report.http[key].count == 2 and len(report.http) == 2
    assert status_class(503) == "5xx" and status_class(200) == "2xx"



def test_exception_types_travel_with_the_report() -> None:
    recorder = Recorder("replica", "r1", "shop", "Model")
    recorder.processed("/shop", 1.0, ok=False)
    recorder.exception("/shop", "KeyError")
    report = recorder.drain({})
    assert report.errors == {"/shop": 1}
    assert report.exceptions == {("/shop", "KeyError"): 1}
    assert recorder.drain().exceptions == {}


def test_user_metrics_travel_with_the_report() -> None:
    from surge.observability.user_metrics import MetricInfo

    recorder = Recorder("replica", "r1", "shop", "Model")
    info = MetricInfo("m", "counter", "", ())
    report = recorder.drain({}, user={info: {(): 1.0}})
    assert report.user == {info: {(): 1.0}} and not report.empty
    after = recorder.drain()
    assert after.user == {} and after.empty
