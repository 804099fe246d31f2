"""The `ray_serve_*` families are Ray 2.60's exported names, types and labels.

VERIFIED was read off Ray 2.60's source: the metric's name and tag_keys where it is
defined (ray/serve/_private/...), plus `ray_` (NAMESPACE in
ray/_private/telemetry/open_telemetry_metric_recorder.py), `_total` for counters and
labels sorted (OpenTelemetry's Prometheus exporter, which Ray's agent runs). Replica
metrics come from `ray.serve.metrics`, which adds deployment, replica and application.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from surge.backends.base import Placement
from surge.config import DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.metrics import METRIC_NAMES, RAY_METRIC_NAMES, render
from surge.controller.observer import GONE_REPLICA_KEEP_S, MetricsSnapshot, Observer
from surge.controller.state import ControllerState, DeploymentRecord, ReplicaRecord
from surge.model import DeploymentId
from surge.observability.recorder import Histogram, Recorder
from surge.policy.lifecycle import ReplicaState
from surge.testing import FakeClock

DID = DeploymentId("shop", "Model")
REPLICAS = ("Model-1", "Model-2")

# DEFAULT_LATENCY_BUCKET_MS, ray/serve/_private/constants.py
RAY_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000,
                          10000, 60000, 120000, 300000, 600000)
REPLICA = {"application", "deployment", "replica"}
ROUTER = {"deployment", "application", "handle", "actor_id"}
# family (as exported) -> (type, labels); the comment says where Ray defines it.
VERIFIED: dict[str, tuple[str, set[str]]] = {
    # request_ingress_metrics.py, RequestIngressMetrics (the proxy's, protocol HTTP)
    "ray_serve_num_http_requests_total": (
        "counter", {"route", "method", "application", "status_code"}),
    "ray_serve_num_http_error_requests_total": (
        "counter", {"route", "error_code", "method", "application"}),
    "ray_serve_num_deployment_http_error_requests_total": (
        "counter", {"deployment", "error_code", "method", "route", "application"}),
    "ray_serve_http_request_latency_ms": (
        "histogram", {"method", "route", "application", "status_code"}),
    "ray_serve_num_ongoing_http_requests": ("gauge", {"node_id", "node_ip_address"}),
    # the same class, protocol GRPC (route: the application; method: the RPC's path)
    "ray_serve_num_grpc_requests_total": (
        "counter", {"route", "method", "application", "status_code"}),
    "ray_serve_num_grpc_error_requests_total": (
        "counter", {"route", "error_code", "method", "application"}),
    "ray_serve_num_deployment_grpc_error_requests_total": (
        "counter", {"deployment", "error_code", "method", "route", "application"}),
    "ray_serve_grpc_request_latency_ms": (
        "histogram", {"method", "route", "application", "status_code"}),
    "ray_serve_num_ongoing_grpc_requests": ("gauge", {"node_id", "node_ip_address"}),
    # replica.py, ReplicaMetricsManager (ray.serve.metrics: + deployment/replica/app)
    "ray_serve_deployment_request_counter_total": ("counter", REPLICA | {"route"}),
    "ray_serve_deployment_error_counter_total": (
        "counter", REPLICA | {"route", "exception_type"}),
    "ray_serve_deployment_processing_latency_ms": ("histogram", REPLICA | {"route"}),
    "ray_serve_replica_processing_queries": ("gauge", REPLICA),
    "ray_serve_deployment_replica_starts_total": ("counter", REPLICA),
    # deployment_state.py (RAY_SERVE_CONTROLLER_METRICS_INCLUDE_HIGH_CARDINALITY_TAGS=1)
    "ray_serve_deployment_replica_healthy": ("gauge", REPLICA),
    "ray_serve_autoscaling_target_replicas": ("gauge", {"deployment", "application"}),
    # router.py, Router.__init__ -> RouterMetricsManager
    "ray_serve_num_router_requests_total": ("counter", ROUTER | {"route"}),
    "ray_serve_deployment_queued_queries": ("gauge", ROUTER),
    "ray_serve_num_ongoing_requests_at_replicas": ("gauge", ROUTER),
}


def histogram(*values: float) -> Histogram:
    h = Histogram()
    for value in values:
        h.observe(value)
    return h


FULL = MetricsSnapshot(
    http={("shop", "Model", "/shop", "GET", 200): histogram(3),
          ("shop", "Model", "/shop", "GET", 500): histogram(9),
          ("shop", "Other", "/shop", "GET", 200): histogram(1)},
    grpc={("shop", "Model", "/shop.Model/Predict", "OK"): histogram(2),
          ("shop", "Model", "/shop.Model/Predict", "INTERNAL"): histogram(4)},
    processing={("shop", "Model", "r1", "/shop"): histogram(2, 5)},
    errors={("shop", "Model", "r1", "/shop"): 1},
    exceptions={("shop", "Model", "r1", "/shop", "KeyError"): 1},
    replica_processing={("shop", "Model", "r1"): 2}, replica_healthy={("shop", "Model", "r1"): 1},
    replica_starts={("shop", "Model"): 1}, replica_started={("shop", "Model", "r1"): 1},
    target_replicas={("shop", "Model"): 2}, queued={("shop", "Model"): 3},
    ongoing={("shop", "Model"): 4}, offered={("shop", "Model"): 10},
    proxies={"proxy-0": {"ongoing_http_requests": 2, "ongoing_grpc_requests": 1},
             "proxy-1": {"ongoing_http_requests": 1}},
    proxy_nodes={"proxy-0": ("local", "127.0.0.1"), "proxy-1": ("local", "127.0.0.1")})


def families(snapshot: MetricsSnapshot) -> dict[str, tuple[str, list[dict[str, str]],
                                                            list[tuple[str, float]]]]:
    """name as in `# TYPE` -> (type, label sets, (sample name, value))."""
    out = {}
    text = render(snapshot).decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = (types[name], [dict(s.labels) for s in family.samples],
                     [(s.name, s.value) for s in family.samples])
    return out


def test_every_ray_serve_family_is_rays_name_type_and_labels() -> None:
    rendered = families(FULL)
    ray = {name: found for name, found in rendered.items() if name.startswith("ray_serve_")}
    assert set(ray) == set(VERIFIED)
    for name, (kind, labels) in VERIFIED.items():
        found_kind, label_sets, _ = ray[name]
        assert found_kind == kind, name
        assert label_sets, f"{name} has no samples"
        for found in label_sets:
            assert set(found) - {"le"} == labels, name


def test_the_ray_names_are_surges_names_with_rays_prefix() -> None:
    base = {re.sub(r"_total$", "", name) for name in VERIFIED}
    assert set(RAY_METRIC_NAMES) == base
    assert {"ray_" + name for name in METRIC_NAMES if name.startswith("serve_")} == base


def test_ray_values_follow_rays_meaning() -> None:
    rendered = families(FULL)

    def values(name: str) -> list[tuple[str, float]]:
        return rendered[name][2]

    # The proxy's counters are per application: two deployments' 200s add up.
    assert sorted(v for _, v in values("ray_serve_num_http_requests_total")) == [1.0, 2.0]
    # Ray's request counter counts what did not raise; the error counter has the type.
    assert values("ray_serve_deployment_request_counter_total") == [
        ("ray_serve_deployment_request_counter_total", 1.0)]
    assert rendered["ray_serve_deployment_error_counter_total"][1] == [
        {"application": "shop", "deployment": "Model", "exception_type": "KeyError",
         "replica": "r1", "route": "/shop"}]
    # One proxy per node in Ray: surge's workers on a node add up.
    assert rendered["ray_serve_num_ongoing_http_requests"][1:] == (
        [{"node_id": "local", "node_ip_address": "127.0.0.1"}],
        [("ray_serve_num_ongoing_http_requests", 3.0)])
    # Histograms as Ray exports them: Ray's buckets, le="1.0", +Inf, _sum and _count.
    latency = values("ray_serve_deployment_processing_latency_ms")
    assert ("ray_serve_deployment_processing_latency_ms_count", 2.0) in latency
    assert ("ray_serve_deployment_processing_latency_ms_sum", 7.0) in latency
    bounds = [labels["le"] for labels in
              rendered["ray_serve_deployment_processing_latency_ms"][1] if "le" in labels]
    assert bounds == [*(str(float(b)) for b in RAY_LATENCY_BUCKETS_MS), "+Inf"]
    cumulative = dict(zip(bounds, [v for n, v in latency if n.endswith("_bucket")],
                          strict=True))  # of 2 ms and 5 ms
    assert [cumulative[le] for le in ("1.0", "2.0", "5.0", "+Inf")] == [0, 1, 2, 2]


def test_surges_own_names_stay_beside_rays() -> None:
    rendered = families(FULL)
    for name in METRIC_NAMES:
        assert name in rendered or f"{name}_total" in rendered, name


def test_the_observer_keeps_exception_types_and_starts_per_replica() -> None:
    clock = FakeClock(monotonic=0.0)
    state = ControllerState("127.0.0.1:1", HTTPOptions(), 1, head=Placement("local", "x"))
    spec = DeploymentSpec(config=DeploymentConfig(name="Model"), target_blob=b"",
                          init_blob=b"")
    state.deployments[DID] = DeploymentRecord(DID, spec, 1, spec.code_version, target=2)
    for replica_id in REPLICAS:
        state.add_replica(ReplicaRecord(replica_id, DID, 1, 0.0, ReplicaState.RUNNING, pid=1))
    observer = Observer(state, LoadTracker(0.1), Autoscaler(), clock)
    for replica_id in REPLICAS:
        recorder = Recorder("replica", replica_id, "shop", "Model")
        recorder.processed("/shop", 1.0, ok=False)
        recorder.exception("/shop", "KeyError")
        observer.telemetry(recorder.drain({}))
    snapshot = observer.snapshot()
    assert snapshot.exceptions == {("shop", "Model", r, "/shop", "KeyError"): 1
                                   for r in REPLICAS}
    assert snapshot.replica_started == {("shop", "Model", r): 1 for r in REPLICAS}
    state.remove_replica("Model-2")
    clock.advance(GONE_REPLICA_KEEP_S + 1)
    observer.sample()
    snapshot = observer.snapshot()
    assert list(snapshot.exceptions) == [("shop", "Model", "Model-1", "/shop", "KeyError")]
    assert list(snapshot.replica_started) == [("shop", "Model", "Model-1")]
