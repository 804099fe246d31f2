"""The controller's side: folding reports and load samples, and the Prometheus text."""

from __future__ import annotations

import json
import re
from collections import deque
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from surge.backends.base import Placement
from surge.config import AutoscalingConfig, DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller.autoscaler import Autoscaler, DecisionRecord, LoadTracker
from surge.controller.metrics import METRIC_NAMES, render
from surge.controller.observer import MetricsSnapshot, Observer
from surge.controller.state import ControllerState, DeploymentRecord, ReplicaRecord
from surge.model import DeploymentId
from surge.observability.recorder import Histogram, Recorder
from surge.policy.autoscaling import Decision, DecisionKind, LoadSample, PolicyState
from surge.policy.lifecycle import ReplicaState
from surge.testing import FakeClock

DID = DeploymentId("shop", "Model")


def parse(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def histogram(*values: float) -> Histogram:
    h = Histogram()
    for value in values:
        h.observe(value)
    return h


def test_render_names_labels_and_values() -> None:
    snapshot = MetricsSnapshot(
        http={("shop", "Model", "/shop", "GET", 200): histogram(0.3, 4),
              ("shop", "Model", "/shop", "GET", 503): histogram(0.1)},
        processing={("shop", "Model", "r1", "/shop"): histogram(3)},
        errors={}, replica_healthy={("shop", "Model", "r1"): 1},
        replicas_by_state={("shop", "Model", "RUNNING"): 1},
        target_replicas={("shop", "Model"): 2}, autoscaled=frozenset({("shop", "Model")}),
        rejections={("shop", "Model", "queue_full"): 1},
        decisions={("shop", "Model", "up"): 1},
        signals={("shop", "Model", "rate"): 12.5, ("shop", "Model", "custom"): 1.0},
        proxies={"proxy-0": {"ongoing_http_requests": 3, "connections": 5}})
    m = parse(render(snapshot))
    assert ({"application": "shop", "deployment": "Model", "route": "/shop", "method": "GET",
             "status_code": "200"}, 2.0) in m["serve_num_http_requests_total"]
    assert m["serve_num_http_error_requests_total"] == [
        ({"application": "shop", "route": "/shop", "method": "GET", "error_code": "503"}, 1.0)]
    buckets = [(labels["le"], value) for labels, value in m["serve_http_request_latency_ms_bucket"]
               if labels["status_code"] == "200"]
    assert ("0.1", 0.0) in buckets and ("0.5", 1.0) in buckets and ("5", 2.0) in buckets
    assert buckets[-1] == ("+Inf", 2.0)
    assert m["serve_deployment_error_counter_total"][0][1] == 0.0  # zero before any error
    assert m["serve_num_ongoing_http_requests"] == [({"proxy": "proxy-0"}, 3.0)]
    assert m["surge_autoscaling_arrival_rate"][0][1] == 12.5
    assert m["surge_autoscaling_signal"][0][0]["signal"] == "custom"
    assert m["serve_autoscaling_target_replicas"][0][1] == 2.0
    assert m["surge_rejected_requests_total"][0][0]["reason"] == "queue_full"


def test_every_documented_family_is_rendered_even_when_empty() -> None:
    text = render(MetricsSnapshot()).decode()
    for name in METRIC_NAMES:
        assert re.search(rf"^# TYPE {name}(_total)? (counter|gauge|histogram)$", text, re.M)


def observer_of(samples: list[LoadSample], decisions: list[DecisionRecord],
                clock: FakeClock) -> Observer:
    """An observer of a real controller state: one deployment, a running replica and a
    starting one, the given load samples and autoscaling decisions."""
    state = ControllerState("127.0.0.1:1", HTTPOptions(), 1, head=Placement("local", "x"))
    state.proxy_address = "127.0.0.1:2"
    config = DeploymentConfig(name="Model", autoscaling_config=AutoscalingConfig())
    spec = DeploymentSpec(config=config, target_blob=b"", init_blob=b"")
    state.deployments[DID] = DeploymentRecord(DID, spec, 1, spec.code_version, target=2)
    for replica_id, replica_state in (("Model-1", ReplicaState.RUNNING),
                                      ("Model-2", ReplicaState.STARTING)):
        state.add_replica(ReplicaRecord(replica_id, DID, 1, 0.0, replica_state, pid=1))
    load = LoadTracker(0.1)
    load.series[DID] = deque(samples)
    autoscaler = Autoscaler()
    autoscaler.decisions.extend(decisions)
    autoscaler.last[DID] = Decision(2, DecisionKind.UP, "up: x", PolicyState(),
                                    {"rate": 30.0, "slope": 5.0})
    return Observer(state, load, autoscaler, clock)


def test_the_observer_folds_reports_samples_and_decisions_into_points_and_totals() -> None:
    clock = FakeClock(monotonic=100.0, wall=1100.0)
    samples = [LoadSample(t=99.1 + i / 10, arrivals=3, completions=2, rejections=1, queued=4,
                          ongoing=2) for i in range(10)]
    decision = DecisionRecord(99.5, DID, 1, 2, DecisionKind.UP, "up: 30 req/s offered",
                              {"rate": 30.0})
    observer = observer_of(samples, [decision], clock)
    proxy = Recorder("proxy", "proxy-0")
    for _ in range(9):
        proxy.http_request(("shop", "Model", "/shop", "GET", 200), 2.0)
    proxy.http_request(("shop", "Model", "/shop", "GET", 408), 900.0)
    observer.telemetry(proxy.drain({"ongoing_http_requests": 1}))
    replica = Recorder("replica", "Model-1", "shop", "Model")
    replica.processed("/shop", 1.5, ok=False)
    observer.telemetry(replica.drain({"processing": 1}))
    point = observer.sample()["deployments"]["shop#Model"]
    assert point["offered"] == 30.0 and point["served"] == 20.0 and point["rejected"] == 10.0
    assert point["timeouts"] == 1.0 and point["queued"] == 4
    assert point["running"] == 1 and point["starting"] == 1 and point["target"] == 2
    assert point["p50_ms"] is not None and 1 < point["p50_ms"] <= 2
    timeline = observer.timeline_since(None)
    assert timeline["decisions"][0]["to"] == 2 and timeline["decisions"][0]["t"] == 1099.5
    assert observer.timeline_since(timeline["samples"][-1]["t"])["samples"] == []
    snapshot = observer.snapshot()
    assert snapshot.offered == {("shop", "Model"): 30}
    assert snapshot.completed == {("shop", "Model"): 20}
    assert snapshot.rejections[("shop", "Model", "queue_full")] == 10
    assert snapshot.decisions == {("shop", "Model", "up"): 1}
    assert snapshot.replica_starts == {("shop", "Model"): 1}
    assert snapshot.errors == {("shop", "Model", "Model-1", "/shop"): 1}
    assert snapshot.replica_healthy == {("shop", "Model", "Model-1"): 1}
    assert snapshot.replicas_by_state[("shop", "Model", "STARTING")] == 1
    assert snapshot.signals[("shop", "Model", "slope")] == 5.0
    clock.advance(1.0)  # nothing new: totals stay, the next point is idle
    assert observer.sample()["deployments"]["shop#Model"]["offered"] == 0.0
    assert observer.snapshot().offered == {("shop", "Model"): 30}


def test_gone_replicas_leave_the_gauges_at_once_and_the_counters_later() -> None:
    clock = FakeClock(monotonic=0.0)
    observer = observer_of([], [], clock)
    replica = Recorder("replica", "Model-9", "shop", "Model")
    replica.processed("/shop", 1.0, ok=True)
    observer.telemetry(replica.drain({"processing": 1}))
    observer.sample()
    assert ("shop", "Model", "Model-9") not in observer.snapshot().replica_processing
    assert ("shop", "Model", "Model-9", "/shop") in observer.snapshot().processing
    clock.advance(61.0)
    observer.sample()
    assert not observer.snapshot().processing


def test_the_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    path = Path(__file__).resolve().parents[2] / "docs" / "grafana-surge.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    used = {m for e in exprs for m in re.findall(r"\b((?:serve|surge)_[a-z_]+)", e)}
    known = set(METRIC_NAMES)
    for name in used:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert base in known, f"{name} in docs/grafana-surge.json is not exported"
    assert len(used) >= 15


def test_the_exposition_is_what_prometheus_client_writes_byte_for_byte() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from surge.controller.metrics import exposition, surge_families
    from surge.controller.ray_metrics import ray_families

    odd = 'a "quoted" \\ back\nline é'
    snapshot = MetricsSnapshot(
        http={("shop", "Model", odd, "GET", 200): histogram(0.3, 4e9)},
        processing={("shop", "Model", "r1", odd): histogram(3)},
        replica_healthy={("shop", "Model", "r1"): 1}, target_replicas={("shop", "Model"): 2},
        signals={("shop", "Model", "rate"): 1e-9, ("shop", "Model", "x"): float("nan")},
        proxies={"proxy-0": {"ongoing_http_requests": 3}})

    class Families:
        def collect(self) -> list[object]:
            return [*surge_families(snapshot), *ray_families(snapshot)]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())  # type: ignore[arg-type]
    assert exposition(Families().collect()) == generate_latest(registry)  # type: ignore[arg-type]
