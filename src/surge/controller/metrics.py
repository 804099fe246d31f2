"""Prometheus text for a `MetricsSnapshot`, with Ray Serve's metric names where Ray has one.

The snapshot's label tuples become prometheus_client metric families at scrape time,
written out by `exposition` (generate_latest's bytes at a fraction of its cost); nothing
is registered per request, so a scrape costs O(series) and the data path never touches
prometheus_client. surge's own names are Ray's without the `ray_` prefix Ray's metrics
agent adds, with labels of surge's choosing; the same snapshot is rendered again in
Ray's exported names and labels (`ray_serve_*`, controller/ray_metrics.py), followed
by the users' serve.metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from surge.controller.observer import MetricsSnapshot
from surge.controller.ray_metrics import RAY_METRIC_NAMES, ray_families, user_families
from surge.observability.recorder import Histogram

__all__ = ["CONTENT_TYPE", "METRIC_NAMES", "RAY_METRIC_NAMES", "exposition", "render",
           "surge_families"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_number: Callable[[float], str] = floatToGoString  # Go's float format, as the client writes it

APP_DEP = ["application", "deployment"]
HTTP = ["application", "deployment", "route", "method", "status_code"]
HTTP_ERRORS = ["application", "route", "method", "error_code"]
GRPC = ["application", "deployment", "method", "status_code"]
GRPC_ERRORS = ["application", "method", "error_code"]
DEPLOYMENT_GRPC_ERRORS = ["application", "deployment", "method", "error_code"]
DEPLOYMENT_HTTP_ERRORS = ["application", "deployment", "route", "method", "error_code"]
REPLICA_ROUTE = ["application", "deployment", "replica", "route"]
REPLICA = ["application", "deployment", "replica"]

# The policy signals with a metric of their own; others go to surge_autoscaling_signal.
SIGNALS = {
    "rate": ("surge_autoscaling_arrival_rate",
             "Offered requests/s the autoscaling policy saw at its last decision."),
    "slope": ("surge_autoscaling_arrival_slope",
              "Trend of the offered rate (requests/s per second) at the last decision."),
    "projected_rate": ("surge_autoscaling_projected_rate",
                       "Offered rate projected over the replica start-up lead time."),
    "demand_replicas": ("surge_autoscaling_demand_replicas",
                        "Replicas the projected demand needs (before bounds)."),
    "service_time_s": ("surge_autoscaling_service_time_seconds",
                       "Mean service time measured by Little's law."),
}

METRIC_NAMES = (
    "serve_num_http_requests", "serve_num_http_error_requests",
    "serve_num_deployment_http_error_requests", "serve_http_request_latency_ms",
    "serve_num_ongoing_http_requests", "serve_deployment_request_counter",
    "serve_deployment_error_counter", "serve_deployment_processing_latency_ms",
    "serve_replica_processing_queries", "serve_deployment_replica_healthy",
    "serve_deployment_replica_starts", "serve_deployment_queued_queries",
    "serve_num_ongoing_requests_at_replicas", "serve_num_router_requests",
    "serve_autoscaling_target_replicas", "serve_num_grpc_requests",
    "serve_num_grpc_error_requests", "serve_num_deployment_grpc_error_requests",
    "serve_grpc_request_latency_ms", "serve_num_ongoing_grpc_requests",
    "surge_completed_requests",
    "surge_rejected_requests", "surge_replicas", "surge_target_replicas",
    "surge_autoscaling_decisions", "surge_proxy_connections", "surge_node_cpu_busy_ratio",
    "surge_node_saturated",
    *(name for name, _ in SIGNALS.values()), "surge_autoscaling_signal",
)


def _histogram(name: str, doc: str, labels: list[str],
               data: Mapping[Any, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, histogram in sorted(data.items(), key=lambda item: str(item[0])):
        family.add_metric([str(v) for v in key], histogram.cumulative(), histogram.sum)
    return family


def _values(family: CounterMetricFamily | GaugeMetricFamily,
            data: Mapping[Any, float]) -> CounterMetricFamily | GaugeMetricFamily:
    for key, value in sorted(data.items(), key=lambda item: str(item[0])):
        family.add_metric([str(v) for v in key], float(value))
    return family


def _counter(name: str, doc: str, labels: list[str],
             data: Mapping[Any, float]) -> Metric:
    return _values(CounterMetricFamily(name, doc, labels=labels), data)


def _gauge(name: str, doc: str, labels: list[str],
           data: Mapping[Any, float]) -> Metric:
    return _values(GaugeMetricFamily(name, doc, labels=labels), data)


def _http_families(s: MetricsSnapshot) -> Iterator[Metric]:
    counts = {key: h.count for key, h in s.http.items()}
    errors: dict[tuple[object, ...], float] = {}
    deployment_errors: dict[tuple[object, ...], float] = {}
    for (app, dep, route, method, code), count in counts.items():
        if code >= 400:
            short = (app, route, method, code)
            errors[short] = errors.get(short, 0) + count
            full = (app, dep, route, method, code)
            deployment_errors[full] = deployment_errors.get(full, 0) + count
    yield _counter("serve_num_http_requests", "HTTP requests answered by the proxies "
                   "(every status; 499: the client went away).", HTTP, counts)
    yield _counter("serve_num_http_error_requests", "HTTP responses with status >= 400.",
                   HTTP_ERRORS, errors)
    yield _counter("serve_num_deployment_http_error_requests", "HTTP responses with status "
                   ">= 400, by deployment.", DEPLOYMENT_HTTP_ERRORS, deployment_errors)
    yield _histogram("serve_http_request_latency_ms", "End-to-end latency at the proxy, "
                     "from the request's first byte to its response, in ms.", HTTP, s.http)
    yield _gauge("serve_num_ongoing_http_requests", "Requests a proxy worker holds now.",
                 ["proxy"], {(p, ): g.get("ongoing_http_requests", 0)
                             for p, g in s.proxies.items()})
    yield _gauge("surge_proxy_connections", "Open client connections per proxy worker.",
                 ["proxy"], {(p, ): g.get("connections", 0) for p, g in s.proxies.items()})


def _grpc_families(s: MetricsSnapshot) -> Iterator[Metric]:
    counts = {key: h.count for key, h in s.grpc.items()}
    errors: dict[tuple[object, ...], float] = {}
    deployment_errors: dict[tuple[object, ...], float] = {}
    for (app, dep, method, code), count in counts.items():
        if code != "OK":
            errors[(app, method, code)] = errors.get((app, method, code), 0) + count
            full = (app, dep, method, code)
            deployment_errors[full] = deployment_errors.get(full, 0) + count
    yield _counter("serve_num_grpc_requests", "gRPC calls answered by the proxies, by status "
                   "(CANCELLED: the client went away).", GRPC, counts)
    yield _counter("serve_num_grpc_error_requests", "gRPC calls that ended with a status "
                   "other than OK.", GRPC_ERRORS, errors)
    yield _counter("serve_num_deployment_grpc_error_requests", "gRPC calls that ended with "
                   "a status other than OK, by deployment.", DEPLOYMENT_GRPC_ERRORS,
                   deployment_errors)
    yield _histogram("serve_grpc_request_latency_ms", "End-to-end latency of a gRPC call at "
                     "the proxy, from its start to its status, in ms.", GRPC, s.grpc)
    yield _gauge("serve_num_ongoing_grpc_requests", "gRPC calls a proxy worker holds now.",
                 ["proxy"], {(p, ): g.get("ongoing_grpc_requests", 0)
                             for p, g in s.proxies.items()})


def _replica_families(s: MetricsSnapshot) -> Iterator[Metric]:
    yield _counter("serve_deployment_request_counter", "Requests a replica processed, by "
                   "route (HTTP) or method (handle calls).", REPLICA_ROUTE,
                   {key: h.count for key, h in s.processing.items()})
    errors = {key: 0 for key in s.processing} | dict(s.errors)  # 0 until the first one
    yield _counter("serve_deployment_error_counter", "Exceptions raised by user code.",
                   REPLICA_ROUTE, errors)
    yield _histogram("serve_deployment_processing_latency_ms", "Time a replica spent on a "
                     "request, in ms.", REPLICA_ROUTE, s.processing)
    yield _gauge("serve_replica_processing_queries", "Requests a replica is processing now.",
                 REPLICA, s.replica_processing)
    yield _gauge("serve_deployment_replica_healthy", "1 if the replica passes its health "
                 "checks, else 0 (RUNNING and STANDBY replicas).", REPLICA, s.replica_healthy)
    yield _counter("serve_deployment_replica_starts", "Replicas that came up (constructed).",
                   APP_DEP, s.replica_starts)


def _deployment_families(s: MetricsSnapshot) -> Iterator[Metric]:
    yield _gauge("serve_deployment_queued_queries", "Requests waiting in routers (proxies "
                 "and handles) for a replica.", APP_DEP, s.queued)
    yield _gauge("serve_num_ongoing_requests_at_replicas", "Requests sent to replicas and "
                 "not yet answered.", APP_DEP, s.ongoing)
    yield _counter("serve_num_router_requests", "Requests offered to the deployment's "
                   "routers, rejected ones included.", APP_DEP, s.offered)
    yield _counter("surge_completed_requests", "Requests the deployment's replicas "
                   "served (their own 429 and 503 answers, refusals, not counted).",
                   APP_DEP, s.completed)
    yield _counter("surge_rejected_requests", "Requests refused at once, by reason "
                   "(queue_full: the queue budget was used up, 503; connection_limit, "
                   "no_route, unavailable, malformed, header_timeout, body_timeout, "
                   "body_too_large, headers_too_large at the proxy).", [*APP_DEP, "reason"],
                   s.rejections)
    yield _gauge("surge_replicas", "Replicas by lifecycle state.", [*APP_DEP, "state"],
                 s.replicas_by_state)
    yield _gauge("surge_target_replicas", "The replica count the controller works towards.",
                 APP_DEP, s.target_replicas)
    yield _gauge("serve_autoscaling_target_replicas", "The autoscaler's target.", APP_DEP,
                 {k: v for k, v in s.target_replicas.items() if k in s.autoscaled})
    yield _counter("surge_autoscaling_decisions", "Autoscaling decisions that changed the "
                   "target, by kind (up, down, cold_start), and node_saturated once per "
                   "episode of a saturated node CPU that kept the target.",
                   [*APP_DEP, "reason"], s.decisions)
    yield _gauge("surge_node_cpu_busy_ratio", "Busy share of all the cores of the "
                 "controller's node, 0 to 1 (absent where not read).", [],
                 {} if s.node_cpu is None else {(): s.node_cpu})
    yield _gauge("surge_node_saturated", "1 while the node's CPU is saturated and the "
                 "replicas added last did not raise the deployment's throughput: the "
                 "autoscaler adds none there.", APP_DEP, s.saturated)
    named: dict[str, dict[tuple[object, ...], float]] = {name: {} for name in SIGNALS}
    other: dict[tuple[object, ...], float] = {}
    for (app, dep, signal), value in s.signals.items():
        if signal in named:
            named[signal][(app, dep)] = value
        else:
            other[(app, dep, signal)] = value
    for signal, (name, doc) in SIGNALS.items():
        yield _gauge(name, doc, APP_DEP, named[signal])
    yield _gauge("surge_autoscaling_signal", "Other inputs the policy reported at its last "
                 "decision.", [*APP_DEP, "signal"], other)


def surge_families(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    """The families in surge's names (METRIC_NAMES)."""
    yield from _http_families(snapshot)
    yield from _grpc_families(snapshot)
    yield from _replica_families(snapshot)
    yield from _deployment_families(snapshot)


def render(snapshot: MetricsSnapshot) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of `snapshot`."""
    return exposition([*surge_families(snapshot), *ray_families(snapshot),
                       *user_families(snapshot.user)])


def exposition(families: Iterable[Metric]) -> bytes:
    """What prometheus_client's generate_latest writes for these families, byte for byte,
    at a quarter of its cost: it checks and escapes every label of every sample, and a
    scrape is mostly histogram buckets that repeat their series' labels; here each label
    value is escaped once per scrape. (Families of our own making: no timestamps, no
    `_created` samples, label names valid.)"""
    out: list[str] = []
    escaped: dict[str, str] = {}
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            labels = sample.labels
            if not labels:
                out.append(f"{sample.name} {_number(sample.value)}\n")
                continue
            parts = []
            for key in sorted(labels):
                value = labels[key]
                text = escaped.get(value)
                if text is None:
                    text = escaped[value] = (value.replace("\\", r"\\")
                                             .replace("\n", r"\n").replace('"', r'\"'))
                parts.append(f'{key}="{text}"')
            out.append(f"{sample.name}{{{','.join(parts)}}} {_number(sample.value)}\n")
    return "".join(out).encode()
