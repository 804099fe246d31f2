"""serve.metrics at the controller: added up across replicas, bounded, pruned, rendered
as Ray exports them (`ray_<name>`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from surge.backends.base import Placement
from surge.config import DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.metrics import render
from surge.controller.observer import GONE_REPLICA_KEEP_S, Observer
from surge.controller.state import ControllerState, DeploymentRecord, ReplicaRecord
from surge.controller.user_metrics import UserMetrics
from surge.model import DeploymentId
from surge.observability.recorder import Recorder, TelemetryReport
from surge.observability.user_metrics import (
    MAX_SERIES_PER_METRIC,
    REGISTRY,
    Buckets,
    MetricInfo,
)
from surge.policy.lifecycle import ReplicaState
from surge.replica.context import ReplicaContext, ReplicaID, set_replica_context
from surge.serve.metrics import Counter, Gauge, Histogram
from surge.testing import FakeClock

DID = DeploymentId("shop", "Model")
REPLICAS = ("Model-1", "Model-2")


@pytest.fixture
def observer() -> Iterator[Observer]:
    """An observer of a controller state with two running replicas of shop#Model."""
    REGISTRY.drain()  # what earlier tests left
    state = ControllerState("127.0.0.1:1", HTTPOptions(), 1, head=Placement("local", "x"))
    spec = DeploymentSpec(config=DeploymentConfig(name="Model"), target_blob=b"",
                          init_blob=b"")
    state.deployments[DID] = DeploymentRecord(DID, spec, 1, spec.code_version, target=2)
    for replica_id in REPLICAS:
        state.add_replica(ReplicaRecord(replica_id, DID, 1, 0.0, ReplicaState.RUNNING, pid=1))
    yield Observer(state, LoadTracker(0.1), Autoscaler(), FakeClock(monotonic=0.0))
    set_replica_context(None)


def in_replica(replica_id: str) -> None:
    set_replica_context(ReplicaContext(ReplicaID(replica_id, "Model", "shop"), None))


def report(replica_id: str) -> TelemetryReport:
    """What the replica's telemetry would push now (this process plays the replica)."""
    return Recorder("replica", replica_id, "shop", "Model").drain({}, user=REGISTRY.drain())


def scrape(observer: Observer) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(render(observer.snapshot()).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def as_set(samples: list[tuple[dict[str, str], float]]) -> set[tuple[frozenset[object], float]]:
    return {(frozenset(labels.items()), value) for labels, value in samples}


def replica_tags(replica_id: str) -> dict[str, str]:
    return {"application": "shop", "deployment": "Model", "replica": replica_id}


def test_counters_add_up_per_label_set_and_keep_each_replica(observer: Observer) -> None:
    for replica_id, requests in zip(REPLICAS, (3, 2), strict=True):
        in_replica(replica_id)
        counter = Counter("requests", "Requests by model.", tag_keys=("model",))
        for _ in range(requests):
            counter.inc(tags={"model": "a"})
        counter.inc(5, tags={"model": "b"})
        observer.telemetry(report(replica_id))
    in_replica("Model-1")
    Counter("requests", tag_keys=("model",)).inc(tags={"model": "a"})  # a second report
    observer.telemetry(report("Model-1"))
    m = scrape(observer)
    assert as_set(m["ray_requests_total"]) == as_set([
        ({**replica_tags("Model-1"), "model": "a"}, 4.0),
        ({**replica_tags("Model-1"), "model": "b"}, 5.0),
        ({**replica_tags("Model-2"), "model": "a"}, 2.0),
        ({**replica_tags("Model-2"), "model": "b"}, 5.0)])


def test_replicas_that_share_a_label_set_share_the_series(observer: Observer) -> None:
    for replica_id in REPLICAS:  # the user overrides the replica tag: one series
        in_replica(replica_id)
        Counter("overridden").inc(2, tags={"replica": "all"})
        observer.telemetry(report(replica_id))
    assert scrape(observer)["ray_overridden_total"] == [
        ({"application": "shop", "deployment": "Model", "replica": "all"}, 4.0)]


def test_gauges_keep_the_last_value_per_replica(observer: Observer) -> None:
    for replica_id, value in zip(REPLICAS, (7, 9), strict=True):
        in_replica(replica_id)
        gauge = Gauge("queue_depth")
        gauge.set(1)
        gauge.set(value)
        observer.telemetry(report(replica_id))
    in_replica("Model-2")
    Gauge("queue_depth").set(4)
    observer.telemetry(report("Model-2"))
    observer.telemetry(report("Model-1"))  # nothing set since: the last value stays
    assert as_set(scrape(observer)["ray_queue_depth"]) == as_set([
        (replica_tags("Model-1"), 7.0), (replica_tags("Model-2"), 4.0)])


def test_histograms_merge_per_label_set(observer: Observer) -> None:
    for replica_id in REPLICAS:
        in_replica(replica_id)
        histogram = Histogram("tokens", "Tokens per request.", boundaries=[10, 100],
                              tag_keys=("model",))
        histogram.observe(5, tags={"model": "a"})
        histogram.observe(50, tags={"model": "a"})
        histogram.observe(500, tags={"model": "a", "replica": "x"})
        observer.telemetry(report(replica_id))
    m = scrape(observer)

    def buckets(replica: str) -> dict[str, float]:
        return {labels["le"]: value for labels, value in m["ray_tokens_bucket"]
                if labels["replica"] == replica}

    assert buckets("x") == {"10.0": 0.0, "100.0": 0.0, "+Inf": 2.0}  # both replicas'
    assert buckets("Model-1") == {"10.0": 1.0, "100.0": 2.0, "+Inf": 2.0}
    shared = {"application": "shop", "deployment": "Model", "model": "a", "replica": "x"}
    assert (shared, 1000.0) in m["ray_tokens_sum"]
    assert ({**replica_tags("Model-1"), "model": "a"}, 2.0) in m["ray_tokens_count"]


def test_a_stopped_replica_loses_its_gauges_at_once_and_its_counters_later(
        observer: Observer) -> None:
    in_replica("Model-2")
    Gauge("temperature").set(40)
    Counter("served").inc()
    observer.telemetry(report("Model-2"))
    in_replica("Model-1")
    Counter("served").inc()
    observer.telemetry(report("Model-1"))
    observer.state.remove_replica("Model-2")
    observer.sample()
    m = scrape(observer)
    assert m.get("ray_temperature", []) == []
    assert sorted(labels["replica"] for labels, _ in m["ray_served_total"]) == [*REPLICAS]
    clock = observer.clock
    assert isinstance(clock, FakeClock)
    clock.advance(GONE_REPLICA_KEEP_S + 1)
    observer.sample()
    assert [labels["replica"] for labels, _ in scrape(observer)["ray_served_total"]] == [
        "Model-1"]


def test_the_controller_caps_label_sets_across_replicas(
        caplog: pytest.LogCaptureFixture) -> None:
    info = MetricInfo("per_user", "counter", "", ("user",))
    store = UserMetrics()
    half = MAX_SERIES_PER_METRIC // 2
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        store.add("r1", {info: {(str(u),): 1.0 for u in range(half + 10)}})
        store.add("r2", {info: {(str(u),): 1.0 for u in range(half, 2 * half + 10)}})
    values = store.families["per_user"].values
    assert len(values) == MAX_SERIES_PER_METRIC
    assert values[(str(half),)] == 2.0  # seen by both
    assert caplog.text.count("more than 2000 label sets across replicas") == 1


def test_another_shape_of_a_known_name_is_dropped_until_the_old_series_are_gone(
        caplog: pytest.LogCaptureFixture) -> None:
    old = MetricInfo("latency", "histogram", "", ("model",), (1.0, 2.0))
    new = MetricInfo("latency", "histogram", "", ("model",), (1.0, 5.0))
    store = UserMetrics()
    store.add("r1", {old: {("a",): Buckets(2, [1, 0, 0], 0.5)}})
    with caplog.at_level(logging.WARNING, "surge.metrics"):
        store.add("r2", {new: {("a",): Buckets(2, [0, 1, 0], 3.0)}})
        store.add("r2", {new: {("a",): Buckets(2, [0, 1, 0], 3.0)}})
    assert store.families["latency"].info == old
    assert caplog.text.count("dropping that report") == 1
    store.forget({"r1"})  # the old version's replicas are gone: the new shape takes over
    store.add("r2", {new: {("a",): Buckets(2, [0, 1, 0], 3.0)}})
    assert store.families["latency"].info == new
    assert store.families["latency"].values == {("a",): Buckets(2, [0, 1, 0], 3.0)}


def test_a_metric_is_rendered_once_with_sorted_labels_and_rays_suffixes(
        observer: Observer) -> None:
    in_replica("Model-1")
    Counter("hits_total", "Already ends in _total.").inc()
    Histogram("size", boundaries=[0.5, 2]).observe(1)
    observer.telemetry(report("Model-1"))
    text = render(observer.snapshot()).decode()
    assert "# TYPE ray_hits_total counter" in text
    assert 'ray_hits_total{application="shop",deployment="Model",replica="Model-1"} 1.0' in text
    assert ('ray_size_bucket{application="shop",deployment="Model",le="0.5",'
            'replica="Model-1"} 0.0') in text
    assert text.count("# TYPE ray_size histogram") == 1

