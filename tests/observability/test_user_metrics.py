"""serve.metrics: Ray's arguments, errors and default tags, and the process registry.

The classes record into the process's registry, so each test uses metric names of its
own and reads them back with `drained(name)`.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from surge.observability.user_metrics import (
    MAX_METRICS,
    MAX_SERIES_PER_METRIC,
    REGISTRY,
    Buckets,
    MetricInfo,
    Registry,
)
from surge.replica.context import (
    ReplicaContext,
    ReplicaID,
    RequestContext,
    request_context_var,
    set_replica_context,
)
from surge.serve import metrics
from surge.serve.metrics import Counter, Gauge, Histogram


def drained(name: str) -> tuple[MetricInfo, dict[tuple[str, ...], Any]] | None:
    for info, values in REGISTRY.drain().items():
        if info.name == name:
            return info, dict(values)
    return None


def series(name: str) -> dict[tuple[tuple[str, str], ...], Any]:
    """{((tag, value), ...): value} of what `name` recorded since the last drain."""
    found = drained(name)
    if found is None:
        return {}
    info, values = found
    return {tuple(zip(info.tag_keys, labels, strict=True)): v for labels, v in values.items()}


@pytest.fixture
def in_replica() -> Iterator[ReplicaContext]:
    context = ReplicaContext(ReplicaID("Model-abc", "Model", "shop"), None)
    set_replica_context(context)
    yield context
    set_replica_context(None)


def test_the_module_is_rays_spelling() -> None:
    assert metrics.Counter is Counter and metrics.Gauge is Gauge
    assert metrics.Histogram is Histogram


ERRORS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("empty name", lambda: Counter(""), ValueError, "Empty name is not allowed"),
    ("tag_keys a list", lambda: Counter("m", tag_keys=["a"]),  # type: ignore[arg-type]
     TypeError, "tag_keys should be a tuple type, got: <class 'list'>"),
    ("tag key not str", lambda: Gauge("m", tag_keys=(1,)),  # type: ignore[arg-type]
     TypeError, "Tag keys must be str, got <class 'int'>."),
    ("default tag not declared", lambda: Counter("m", tag_keys=("a",)).set_default_tags(
        {"b": "x"}), ValueError, "Unrecognized tag key b."),
    ("default tag value not str", lambda: Counter("m", tag_keys=("a",)).set_default_tags(
        {"a": 1}), TypeError, "Tag values must be str, got <class 'int'>."),  # type: ignore[dict-item]
    ("tag value not str", lambda: Counter("m", tag_keys=("a",)).inc(
        tags={"a": 2}), TypeError, "Tag values must be str, got <class 'int'>."),  # type: ignore[dict-item]
    ("missing tags", lambda: Counter("m", tag_keys=("a", "b", "c")).inc(tags={"b": "x"}),
     ValueError, "Missing value for tag key(s): a,c."),
    ("missing tags, none given", lambda: Gauge("m", tag_keys=("a",)).set(1), ValueError,
     "Missing value for tag key(s): a."),
    ("counter by 0", lambda: Counter("m").inc(0), ValueError, "value must be >0, got 0"),
    ("counter down", lambda: Counter("m").inc(-1.5), ValueError, "value must be >0, got -1.5"),
    ("counter by a str", lambda: Counter("m").inc("1"),  # type: ignore[arg-type]
     TypeError, "value must be int or float, got <class 'str'>."),
    ("gauge to a str", lambda: Gauge("m").set("1"),  # type: ignore[arg-type]
     TypeError, "value must be int or float, got <class 'str'>."),
    ("observe a str", lambda: Histogram("m", boundaries=[1]).observe("1"),  # type: ignore[arg-type]
     TypeError, "value must be int or float, got <class 'str'>."),
    ("no boundaries", lambda: Histogram("m"), ValueError,
     "boundaries argument should be provided when using the Histogram class"),
    ("empty boundaries", lambda: Histogram("m", boundaries=[]), ValueError,
     "boundaries argument should be provided"),
    ("a boundary of 0", lambda: Histogram("m", boundaries=[1, 0]), ValueError,
     "Invalid `boundaries` argument at index 1, [1, 0]. Use positive values"),
    ("boundaries that do not increase", lambda: Histogram("m", boundaries=[1, 5, 5]),
     ValueError, "they must increase"),
]


@pytest.mark.parametrize(("case", "make", "error", "message"), ERRORS,
                         ids=[case[0] for case in ERRORS])
def test_rays_errors(case: str, make: Callable[[], object], error: type[Exception],
                     message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_what_ray_accepts_records() -> None:
    counter = Counter("ok_counter", "requests", tag_keys=("model",))
    assert counter.set_default_tags({"model": "a"}) is counter
    counter.inc()
    counter.inc(2, tags={"model": "b"})
    counter.inc(0.5)
    Gauge("ok_gauge").set(None)  # Ray: None does nothing
    assert series("ok_counter") == {(("model", "a"),): 1.5, (("model", "b"),): 2.0}
    assert series("ok_gauge") == {}
    assert counter.info == {"name": "ok_counter", "description": "requests",
                            "tag_keys": ("model",), "default_tags": {"model": "a"}}


def test_an_invalid_name_warns_and_records_nothing_as_ray() -> None:
    with pytest.warns(UserWarning, match="Invalid metric name: 9lives. Metric will be "
                                         "discarded"):
        counter = Counter("9lives", tag_keys=("a",))
    counter.inc(tags={"a": "x"})
    counter.inc()  # a discarded metric does not check its tags either
    with pytest.raises(ValueError, match="value must be >0"):
        counter.inc(-1)  # ... but still checks the value, as Ray's inc does first
    assert drained("9lives") is None


def test_a_colon_warns_of_the_future_and_still_records() -> None:
    with pytest.warns(FutureWarning, match="contains a : character"):
        Gauge("colon:gauge").set(3)
    assert series("colon:gauge") == {(): 3.0}


def test_outside_a_replica_there_are_no_serve_tags() -> None:
    counter = Counter("driver_requests", tag_keys=("deployment", "route"))
    counter.inc(tags={"deployment": "mine"})  # reserved only inside replicas
    assert series("driver_requests") == {(("deployment", "mine"), ("route", "")): 1.0}


def test_inside_a_replica_the_serve_tags_come_first_and_route_from_the_request(
        in_replica: ReplicaContext) -> None:
    counter = Counter("replica_requests", tag_keys=("model", "route"))
    assert counter.info["tag_keys"] == ("deployment", "replica", "application", "model",
                                        "route")
    assert counter.info["default_tags"] == {"deployment": "Model", "replica": "Model-abc",
                                            "application": "shop"}
    counter.set_default_tags({"model": "m1"})
    token = request_context_var.set(RequestContext("/shop", "rid", "shop"))
    try:
        counter.inc()
        counter.inc(tags={"route": "/given"})
    finally:
        request_context_var.reset(token)
    counter.inc(3)  # outside a request: route ""
    serve_tags = (("application", "shop"), ("deployment", "Model"))
    assert series("replica_requests") == {
        (*serve_tags, ("model", "m1"), ("replica", "Model-abc"), ("route", "/shop")): 1.0,
        (*serve_tags, ("model", "m1"), ("replica", "Model-abc"), ("route", "/given")): 1.0,
        (*serve_tags, ("model", "m1"), ("replica", "Model-abc"), ("route", "")): 3.0}


@pytest.mark.parametrize("tag", ["deployment", "replica", "application"])
def test_inside_a_replica_the_serve_tags_are_reserved(in_replica: ReplicaContext,
                                                      tag: str) -> None:
    with pytest.raises(ValueError, match=f"'{tag}' tag is reserved for Ray Serve metrics"):
        Counter("reserved", tag_keys=("a", tag))
    gauge = Gauge("reserved_default", tag_keys=("a",))
    with pytest.raises(ValueError, match=f"'{tag}' tag is reserved"):
        gauge.set_default_tags({tag: "x"})


def test_an_application_without_a_name_gets_no_application_tag() -> None:
    set_replica_context(ReplicaContext(ReplicaID("r", "Model", ""), None))
    try:
        gauge = Gauge("no_app_gauge")
    finally:
        set_replica_context(None)
    gauge.set(2)
    assert series("no_app_gauge") == {(("deployment", "Model"), ("replica", "r")): 2.0}


def test_a_histogram_counts_per_bucket_with_le_inclusive() -> None:
    histogram = Histogram("sizes", "bytes", boundaries=[10, 100], tag_keys=("kind",))
    for value in (0, 10, 11, 100, 1e9):
        histogram.observe(value, tags={"kind": "a"})
    info, values = drained("sizes") or (None, {})
    assert info == MetricInfo("sizes", "histogram", "bytes", ("kind",), (10.0, 100.0))
    assert values == {("a",): Buckets(2, [2, 2, 1], 1e9 + 121)}
    assert histogram.info["boundaries"] == [10, 100]


def test_undeclared_tags_are_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    counter = Counter("undeclared", tag_keys=("a",))
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        counter.inc(tags={"a": "x", "b": "y"})
        counter.inc(tags={"a": "x", "b": "z"})
    assert series("undeclared") == {(("a", "x"),): 2.0}
    assert [r.getMessage() for r in caplog.records] == [
        "metric undeclared: tags ['b'] are not in its tag_keys ('a',); they are dropped"]


def test_metrics_of_one_name_share_values_and_another_shape_records_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    Counter("shared", tag_keys=("a",)).inc(tags={"a": "x"})
    Counter("shared", "same shape", tag_keys=("a",)).inc(tags={"a": "x"})
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        other = Gauge("shared", tag_keys=("a",))
    other.set(5, tags={"a": "x"})
    assert series("shared") == {(("a", "x"),): 2.0}
    assert "already defined as a counter" in caplog.text


def test_ray_serves_own_names_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        counter = Counter("serve_num_http_requests")
    counter.inc()
    assert drained("serve_num_http_requests") is None
    assert "one of Ray Serve's own metrics" in caplog.text


def test_a_metric_travels_as_its_definition() -> None:
    histogram = Histogram("pickled", "d", boundaries=[1, 2], tag_keys=("a",))
    histogram.set_default_tags({"a": "x"})
    copy = pickle.loads(pickle.dumps(histogram))
    assert copy.info == {"name": "pickled", "description": "d", "tag_keys": ("a",),
                         "default_tags": {}, "boundaries": [1, 2]}  # as Ray: no defaults
    copy.observe(1, tags={"a": "y"})
    assert series("pickled") == {(("a", "y"),): Buckets(2, [1, 0, 0], 1.0)}


def test_label_sets_are_capped_per_metric_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    counter = Counter("capped", tag_keys=("user",))
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        for user in range(MAX_SERIES_PER_METRIC + 5):
            counter.inc(tags={"user": str(user)})
        counter.inc(tags={"user": "0"})  # a known label set still counts
    values = series("capped")
    assert len(values) == MAX_SERIES_PER_METRIC
    assert values[(("user", "0"),)] == 2.0
    counter.inc(tags={"user": str(MAX_SERIES_PER_METRIC)})  # the cap outlives a drain
    assert series("capped") == {}
    assert caplog.text.count("more than 2000 label sets") == 1


def test_the_registry_caps_the_number_of_metrics(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()
    for index in range(MAX_METRICS):
        assert registry.define(MetricInfo(f"m{index}", "gauge", "", ())) is not None
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        assert registry.define(MetricInfo("one_more", "gauge", "", ())) is None
    assert registry.define(MetricInfo("m0", "gauge", "", ())) is not None  # known: fine
    assert f"more than {MAX_METRICS} metrics" in caplog.text


def test_a_drain_hands_over_deltas_and_starts_over() -> None:
    counter = Counter("deltas")
    counter.inc(2)
    assert series("deltas") == {(): 2.0}
    assert series("deltas") == {}
    counter.inc()
    assert series("deltas") == {(): 1.0}


def test_a_tag_key_declared_twice_is_one_label() -> None:
    Counter("twice", tag_keys=("a", "a")).inc(tags={"a": "x"})
    assert series("twice") == {(("a", "x"),): 1.0}
