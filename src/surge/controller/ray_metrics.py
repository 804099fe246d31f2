"""The same snapshot in Ray's exported names, and the users' `serve.metrics`.

Ray's metrics agent exports every metric as `ray_<name>` (its OpenTelemetry recorder's
NAMESPACE) through OpenTelemetry's Prometheus exporter: counters end in `_total`,
histograms in `_bucket` (`le` written as a float, "1.0"), `_sum` and `_count`, and labels
are the metric's tag keys, sorted. Ray's Grafana dashboards query those names, so
surge renders each Ray Serve metric it has a second time from the same snapshot, with
Ray's tag keys (ray/serve/_private/request_ingress_metrics.py, replica.py, router.py,
deployment_state.py) and Ray's meaning where surge's own name differs: the request
counter counts requests that did not raise, the target gauge covers every deployment.
Where surge has no such detail the label is empty: routers are summed per deployment
(`handle`, `actor_id`, the router's `route`). Ray's process labels (SessionName,
WorkerId, ...) are not rendered; the dashboards do not filter on them. The users'
serve.metrics go out the same way, `ray_<name>`, with their tag keys as labels
(sanitized as OpenTelemetry's exporter does) and their own boundaries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from surge.controller.observer import MetricsSnapshot
from surge.controller.user_metrics import UserFamily
from surge.observability.recorder import LATENCY_BUCKETS_MS, Histogram
from surge.observability.user_metrics import COUNTER, HISTOGRAM, RESERVED_NAMES, Buckets

__all__ = ["RAY_LATENCY_BUCKETS_MS", "RAY_METRIC_NAMES", "RAY_PREFIX", "ray_families",
           "user_families"]

RAY_PREFIX = "ray_"
RAY_METRIC_NAMES = tuple(sorted(RAY_PREFIX + name for name in RESERVED_NAMES))

# Ray Serve's latency buckets (DEFAULT_LATENCY_BUCKET_MS, ray/serve/_private/constants.py),
# a subset of surge's: the counts at its bounds are exact, and a scrape renders 20 lines
# per series here instead of 30. Ray's exporter writes bounds as str(float): le="1.0".
RAY_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1_000, 2_000, 5_000,
                          10_000, 60_000, 120_000, 300_000, 600_000)
_RAY_LATENCY = tuple((str(float(bound)), LATENCY_BUCKETS_MS.index(bound))
                     for bound in RAY_LATENCY_BUCKETS_MS)
_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def _counter(name: str, doc: str, labels: list[str], data: Mapping[Any, float]) -> Metric:
    family = CounterMetricFamily(RAY_PREFIX + name, doc, labels=labels)
    for key, value in sorted(data.items()):
        family.add_metric(key, float(value))
    return family


def _gauge(name: str, doc: str, labels: list[str], data: Mapping[Any, float]) -> Metric:
    family = GaugeMetricFamily(RAY_PREFIX + name, doc, labels=labels)
    for key, value in sorted(data.items()):
        family.add_metric(key, float(value))
    return family


def _cumulative(counts: list[int], le: tuple[str, ...]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, count in zip(le, counts, strict=True):
        running += count
        out.append((bound, float(running)))
    return out


def _ray_buckets(counts: list[int]) -> list[tuple[str, float]]:
    cumulative, running = [], 0
    for count in counts:
        running += count
        cumulative.append(running)
    return [*((le, float(cumulative[index])) for le, index in _RAY_LATENCY),
            ("+Inf", float(running))]


def _latency(name: str, doc: str, labels: list[str],
             data: Mapping[Any, Histogram]) -> Metric:
    family = HistogramMetricFamily(RAY_PREFIX + name, doc, labels=labels)
    for key, histogram in sorted(data.items()):
        family.add_metric(key, _ray_buckets(histogram.counts), histogram.sum)
    return family


def _add(into: dict[tuple[str, ...], float], key: tuple[str, ...], value: float) -> None:
    into[key] = into.get(key, 0) + value


# One proxy call class: (application, deployment, method, route, status code), its
# latency histogram, whether it failed.
_Calls = Iterable[tuple[tuple[str, str, str, str, str], Histogram, bool]]


def _http(s: MetricsSnapshot) -> Iterator[Metric]:
    yield from _proxy("http", "HTTP", (
        ((app, dep, method, route, str(code)), histogram, code >= 400)
        for (app, dep, route, method, code), histogram in s.http.items()), s)


def _grpc(s: MetricsSnapshot) -> Iterator[Metric]:
    """Ray's gRPC proxy metrics: `route` is the application, `method` the RPC's path."""
    yield from _proxy("grpc", "gRPC", (
        ((app, dep, method, app, code), histogram, code != "OK")
        for (app, dep, method, code), histogram in s.grpc.items()), s)


def _proxy(kind: str, title: str, calls: _Calls, s: MetricsSnapshot) -> Iterator[Metric]:
    """Ray's proxy families of one protocol (`kind` in their names, `title` in their help)."""
    # Ray's proxy counts per application, not per deployment: add deployments up.
    requests: dict[tuple[str, ...], float] = {}
    errors: dict[tuple[str, ...], float] = {}
    deployment_errors: dict[tuple[str, ...], float] = {}
    latency: dict[tuple[str, ...], Histogram] = {}
    for (app, dep, method, route, code), histogram, failed in calls:
        key = (app, method, route, code)
        _add(requests, key, histogram.count)
        merged = latency.get(key)
        if merged is None:
            merged = latency[key] = Histogram()
        merged.merge(histogram)
        if failed:
            _add(errors, (app, code, method, route), histogram.count)
            _add(deployment_errors, (app, dep, code, method, route), histogram.count)
    yield _counter(f"serve_num_{kind}_requests", f"The number of {title} requests processed.",
                   ["application", "method", "route", "status_code"], requests)
    yield _counter(f"serve_num_{kind}_error_requests",
                   f"The number of errored {title} responses.",
                   ["application", "error_code", "method", "route"], errors)
    yield _counter(f"serve_num_deployment_{kind}_error_requests", f"The number of errored "
                   f"{title} responses returned by each deployment.",
                   ["application", "deployment", "error_code", "method", "route"],
                   deployment_errors)
    yield _latency(f"serve_{kind}_request_latency_ms", f"The end-to-end latency of {title} "
                   f"requests (measured from the Serve {title} proxy).",
                   ["application", "method", "route", "status_code"], latency)
    ongoing: dict[tuple[str, ...], float] = {}
    for proxy, gauges in s.proxies.items():
        node = s.proxy_nodes.get(proxy, ("", ""))
        _add(ongoing, node, gauges.get(f"ongoing_{kind}_requests", 0))
    yield _gauge(f"serve_num_ongoing_{kind}_requests", "The number of ongoing requests in "
                 f"this {title} proxy.", ["node_id", "node_ip_address"], ongoing)


def _replicas(s: MetricsSnapshot) -> Iterator[Metric]:
    replica = ["application", "deployment", "replica"]
    succeeded = {key: h.count - s.errors.get(key, 0) for key, h in s.processing.items()}
    yield _counter("serve_deployment_request_counter", "The number of queries that have "
                   "been processed in this replica.", [*replica, "route"], succeeded)
    errors = {(app, dep, kind, rep, route): n
              for (app, dep, rep, route, kind), n in s.exceptions.items()}
    yield _counter("serve_deployment_error_counter", "The number of exceptions that have "
                   "occurred in this replica.",
                   ["application", "deployment", "exception_type", "replica", "route"], errors)
    yield _latency("serve_deployment_processing_latency_ms", "The latency for queries to be "
                   "processed.", [*replica, "route"], s.processing)
    yield _gauge("serve_replica_processing_queries", "The current number of queries being "
                 "processed.", replica, s.replica_processing)
    yield _gauge("serve_deployment_replica_healthy", "Tracks healthy replicas. When source "
                 "tags are enabled, each replica series is 1 for healthy and 0 for unhealthy; "
                 "otherwise, the deployment/application series is the healthy replica count.",
                 replica, s.replica_healthy)
    yield _counter("serve_deployment_replica_starts", "The number of times this replica has "
                   "been restarted due to failure.", replica, s.replica_started)


def _routers(s: MetricsSnapshot) -> Iterator[Metric]:
    router = ["actor_id", "application", "deployment", "handle"]
    yield _gauge("serve_deployment_queued_queries", "The current number of queries to this "
                 "deployment waiting to be assigned to a replica.", router,
                 {("", app, dep, ""): v for (app, dep), v in s.queued.items()})
    yield _gauge("serve_num_ongoing_requests_at_replicas", "The current number of requests "
                 "to this deployment that have been submitted to a replica.", router,
                 {("", app, dep, ""): v for (app, dep), v in s.ongoing.items()})
    yield _counter("serve_num_router_requests", "The number of requests processed by the "
                   "router.", [*router, "route"],
                   {("", app, dep, "", ""): v for (app, dep), v in s.offered.items()})
    yield _gauge("serve_autoscaling_target_replicas", "The target number of replicas for "
                 "this deployment. This is the number the autoscaler is trying to reach.",
                 ["application", "deployment"], s.target_replicas)


def ray_families(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    """Ray Serve's metrics as Ray exports them (RAY_METRIC_NAMES)."""
    yield from _http(snapshot)
    yield from _grpc(snapshot)
    yield from _replicas(snapshot)
    yield from _routers(snapshot)


def user_families(families: Mapping[str, UserFamily]) -> Iterator[Metric]:
    """The users' serve.metrics as Ray exports them: `ray_<name>`."""
    for name, family in sorted(families.items()):
        if name not in RESERVED_NAMES:  # refused in the replicas already; never twice
            yield _user_family(RAY_PREFIX + name, family)


def _label(key: str) -> str:
    """A tag key as a Prometheus label name, as OpenTelemetry's exporter sanitizes it."""
    if key[:1].isdigit():
        key = "_" + key[1:]
    return _LABEL_CHARS.sub("_", key) or "_"


def _user_family(name: str, family: UserFamily) -> Metric:
    info = family.info
    labels = [_label(key) for key in info.tag_keys]
    series = sorted(family.values.items())
    if info.kind == HISTOGRAM:
        histogram = HistogramMetricFamily(name, info.description, labels=labels)
        le = (*(str(bound) for bound in info.boundaries), "+Inf")
        for key, value in series:
            if isinstance(value, Buckets):
                histogram.add_metric(key, _cumulative(value.counts, le), value.sum)
        return histogram
    values = (CounterMetricFamily if info.kind == COUNTER else GaugeMetricFamily)(
        name, info.description, labels=labels)
    for key, value in series:
        if not isinstance(value, Buckets):
            values.add_metric(key, value)
    return values
