"""User metrics (`serve.metrics`): the per-process registry and what it ships.

The metric classes (surge.replica.metrics) check their arguments as Ray does and
resolve the tags; each record then takes this module's lock once and updates one
value in a dict keyed by the label tuple. A replica's telemetry (about once a second,
with its request counters) drains the registry: counter increments and histogram
counts since the last drain, and the gauges set since then. The controller adds those
up per label set (controller/user_metrics.py) and exports them as Ray does,
`ray_<name>` (controller/ray_metrics.py). Outside a replica nothing drains the
registry: a driver's metrics record into it and are never exported.

Label sets per metric are capped for the life of the process (MAX_SERIES_PER_METRIC),
and so is the number of metrics (MAX_METRICS): a tag fed from request data (a user id)
must not grow a replica, its reports and the controller without bound. What is beyond
a cap is dropped with one warning per metric.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "MAX_METRICS",
    "MAX_SERIES_PER_METRIC",
    "REGISTRY",
    "RESERVED_NAMES",
    "Buckets",
    "Family",
    "Labels",
    "MetricInfo",
    "Registry",
    "UserReport",
    "Value",
]

log = logging.getLogger("surge.metrics")

# OpenTelemetry's default cardinality limit per metric, the one Ray's Prometheus
# exporter runs with: a scrape renders every series, each ~200 B at the controller.
MAX_SERIES_PER_METRIC = 2000
# Metric names per process (and at the controller): names made from data are a bug.
MAX_METRICS = 1000

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# Ray Serve's own metrics that surge exports as ray_<name> (controller/ray_metrics.py):
# a user metric of one of these names would clash with them, so it is refused.
RESERVED_NAMES = frozenset({
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
})

Labels = tuple[str, ...]  # tag values in MetricInfo.tag_keys order


@dataclass(frozen=True)
class MetricInfo:
    """What a metric is; sent with its values, so the controller needs no registration."""

    name: str
    kind: str  # COUNTER | GAUGE | HISTOGRAM
    description: str
    tag_keys: tuple[str, ...]  # sorted, as Ray's exporter orders labels
    boundaries: tuple[float, ...] = ()  # histograms: increasing upper bounds

    @property
    def shape(self) -> tuple[str, tuple[str, ...], tuple[float, ...]]:
        """What must agree between two definitions of one name (not the description)."""
        return self.kind, self.tag_keys, self.boundaries


class Buckets:
    """A histogram of one label set: `counts[i]` values <= boundaries[i], last +Inf."""

    __slots__ = ("counts", "sum")

    def __init__(self, size: int, counts: list[int] | None = None, total: float = 0.0) -> None:
        self.counts = counts if counts is not None else [0] * (size + 1)
        self.sum = total

    def __repr__(self) -> str:
        return f"<Buckets count={self.count} sum={self.sum:g}>"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Buckets) and self.counts == other.counts
                and self.sum == other.sum)

    def observe(self, value: float, boundaries: tuple[float, ...]) -> None:
        self.counts[bisect_left(boundaries, value)] += 1
        self.sum += value

    def merge(self, other: Buckets) -> None:
        counts = self.counts
        for index, count in enumerate(other.counts):
            counts[index] += count
        self.sum += other.sum

    def copy(self) -> Buckets:
        return Buckets(0, list(self.counts), self.sum)

    @property
    def count(self) -> int:
        return sum(self.counts)


Value = float | Buckets
UserReport = Mapping[MetricInfo, Mapping[Labels, Value]]  # one drain: metric -> series


class Family:
    """One metric of this process: its values since the last drain, and every label
    set it ever recorded (up to the cap, so the cap holds across drains)."""

    __slots__ = ("_warned", "info", "seen", "values")

    def __init__(self, info: MetricInfo) -> None:
        self.info = info
        self.values: dict[Labels, Value] = {}
        self.seen: set[Labels] = set()
        self._warned = False

    def __repr__(self) -> str:
        return f"<Family {self.info.kind} {self.info.name} series={len(self.seen)}>"

    def record(self, labels: Labels, value: float) -> None:
        """Add (counter), set (gauge) or observe (histogram) `value`; caller holds the lock."""
        values = self.values
        current = values.get(labels)
        if current is None and labels not in self.seen:
            if len(self.seen) >= MAX_SERIES_PER_METRIC:
                if not self._warned:
                    self._warned = True
                    log.warning("metric %s: more than %d label sets; dropping new ones",
                                self.info.name, MAX_SERIES_PER_METRIC)
                return
            self.seen.add(labels)
        kind = self.info.kind
        if kind == HISTOGRAM:
            if not isinstance(current, Buckets):
                current = values[labels] = Buckets(len(self.info.boundaries))
            current.observe(value, self.info.boundaries)
        elif kind == COUNTER:
            values[labels] = (current if isinstance(current, float) else 0.0) + value
        else:
            values[labels] = float(value)


class Registry:
    """The user metrics of one process; records may come from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, Family] = {}

    def __repr__(self) -> str:
        return f"<Registry metrics={len(self.families)}>"

    def define(self, info: MetricInfo) -> Family | None:
        """The family `info` records into (shared by metrics of one name and shape);
        None, with a warning, when the name is taken by another shape or is one too many."""
        with self.lock:
            family = self.families.get(info.name)
            if family is not None:
                if family.info.shape == info.shape:
                    return family
                log.warning("metric %s is already defined as a %s with tag_keys %s%s; this "
                            "definition records nothing", info.name, family.info.kind,
                            family.info.tag_keys, _bounds(family.info))
                return None
            if len(self.families) >= MAX_METRICS:
                log.warning("more than %d metrics in this process: %s records nothing",
                            MAX_METRICS, info.name)
                return None
            family = self.families[info.name] = Family(info)
            return family

    def drain(self) -> dict[MetricInfo, dict[Labels, Value]]:
        """What was recorded since the last drain, per metric; the values start over."""
        out: dict[MetricInfo, dict[Labels, Value]] = {}
        with self.lock:
            for family in self.families.values():
                if family.values:
                    out[family.info] = family.values
                    family.values = {}
        return out


def _bounds(info: MetricInfo) -> str:
    return f" and boundaries {list(info.boundaries)}" if info.boundaries else ""


REGISTRY = Registry()
