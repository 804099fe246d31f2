"""Hot-path recording: plain int counters and fixed-bucket histograms, shipped as deltas.

A proxy or replica records each finished request into dicts keyed by label tuples (one
dict lookup, one `bisect` and two additions: no lock, no prometheus_client call). About
once a second `Recorder.drain()` hands the dicts over as a `TelemetryReport` and starts
new ones, so a report holds exactly what happened since the previous one; the
controller adds reports up and renders Prometheus text from the sums.

Buckets are a superset of Ray Serve's DEFAULT_LATENCY_BUCKET_MS, so Ray's queries keep
working: three below 1 ms (surge answers in well under one) and a few between Ray's,
so quantiles interpolated inside a bucket are off by less.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from surge.observability.user_metrics import UserReport

__all__ = [
    "LATENCY_BUCKETS_MS",
    "GrpcKey",
    "Histogram",
    "HttpKey",
    "Recorder",
    "TelemetryReport",
    "status_class",
]

LATENCY_BUCKETS_MS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 400, 500,
    750, 1_000, 2_000, 5_000, 10_000, 60_000, 120_000, 300_000, 600_000)

# (application, deployment, route, method, status code)
HttpKey = tuple[str, str, str, str, int]
# (application, deployment, method, grpc status name): a gRPC call at a proxy
GrpcKey = tuple[str, str, str, str]
# (application, deployment, reason)
RejectionKey = tuple[str, str, str]


class Histogram:
    """Counts per bucket (`counts[i]`: values <= LATENCY_BUCKETS_MS[i]; last: +Inf) and sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, counts: Iterable[int] | None = None, total: float = 0.0) -> None:
        self.counts = list(counts) if counts is not None else [0] * (len(LATENCY_BUCKETS_MS) + 1)
        self.sum = total

    def __repr__(self) -> str:
        return f"<Histogram count={self.count} sum={self.sum:.3f}>"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Histogram) and self.counts == other.counts
                and self.sum == other.sum)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_MS, value)] += 1
        self.sum += value

    def merge(self, other: Histogram) -> None:
        counts = self.counts
        for index, count in enumerate(other.counts):
            counts[index] += count
        self.sum += other.sum

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus `le` buckets: (upper bound, values at or below it), +Inf last."""
        out, running = [], 0
        for bound, count in zip((*LATENCY_BUCKETS_MS, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else f"{bound:g}", running))
        return out

    def quantile(self, q: float) -> float | None:
        """As PromQL's histogram_quantile: linear inside the bucket; None when empty."""
        total = self.count
        if total == 0:
            return None
        rank, seen, lower = q * total, 0, 0.0
        for index, count in enumerate(self.counts):
            if count and seen + count >= rank:
                if index == len(LATENCY_BUCKETS_MS):
                    return LATENCY_BUCKETS_MS[-1]  # in +Inf: the highest finite bound
                upper = LATENCY_BUCKETS_MS[index]
                return lower + (upper - lower) * (rank - seen) / count
            seen += count
            if index < len(LATENCY_BUCKETS_MS):
                lower = LATENCY_BUCKETS_MS[index]
        return LATENCY_BUCKETS_MS[-1]


def status_class(code: int) -> str:
    return f"{code // 100}xx"


@dataclass(frozen=True)
class TelemetryReport:
    """What one process recorded since its previous report (counters are deltas)."""

    role: str  # "proxy" | "replica"
    source: str  # proxy id or replica id
    app: str = ""  # a replica's application and deployment
    deployment: str = ""
    first: bool = False  # the first report of this process (a replica start, for Ray)
    http: Mapping[HttpKey, Histogram] = field(default_factory=dict)
    processing: Mapping[str, Histogram] = field(default_factory=dict)  # route -> latency
    errors: Mapping[str, int] = field(default_factory=dict)  # route -> user exceptions
    # (route, exception type) -> user exceptions: Ray's error counter has the type
    exceptions: Mapping[tuple[str, str], int] = field(default_factory=dict)
    rejections: Mapping[RejectionKey, int] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    user: UserReport = field(default_factory=dict)  # serve.metrics since the last report
    models: tuple[str, ...] = ()  # a multiplexed replica's models, held or loading
    grpc: Mapping[GrpcKey, Histogram] = field(default_factory=dict)  # a proxy's gRPC calls

    @property
    def empty(self) -> bool:
        return not (self.http or self.processing or self.errors or self.rejections
                    or self.user or self.grpc)


class Recorder:
    """One per process; every method is safe to call per request."""

    __slots__ = ("_first", "app", "deployment", "errors", "exceptions", "grpc", "http",
                 "processing", "rejections", "role", "source")

    def __init__(self, role: str, source: str, app: str = "", deployment: str = "") -> None:
        self.role, self.source, self.app, self.deployment = role, source, app, deployment
        self.http: dict[HttpKey, Histogram] = {}
        self.grpc: dict[GrpcKey, Histogram] = {}
        self.processing: dict[str, Histogram] = {}
        self.errors: dict[str, int] = {}
        self.exceptions: dict[tuple[str, str], int] = {}
        self.rejections: dict[RejectionKey, int] = {}
        self._first = True

    def __repr__(self) -> str:
        return (f"<Recorder {self.role} {self.source} http={len(self.http)} "
                f"processing={len(self.processing)}>")

    def http_request(self, key: HttpKey, latency_ms: float) -> None:
        histogram = self.http.get(key)
        if histogram is None:
            histogram = self.http[key] = Histogram()
        histogram.observe(latency_ms)

    def grpc_request(self, key: GrpcKey, latency_ms: float) -> None:
        histogram = self.grpc.get(key)
        if histogram is None:
            histogram = self.grpc[key] = Histogram()
        histogram.observe(latency_ms)

    def processed(self, route: str, latency_ms: float, ok: bool) -> None:
        histogram = self.processing.get(route)
        if histogram is None:
            histogram = self.processing[route] = Histogram()
        histogram.observe(latency_ms)
        if not ok:
            self.errors[route] = self.errors.get(route, 0) + 1

    def exception(self, route: str, exception_type: str) -> None:
        """What user code raised (besides `processed(..., ok=False)`), for Ray's label."""
        key = (route, exception_type)
        self.exceptions[key] = self.exceptions.get(key, 0) + 1

    def rejected(self, app: str, deployment: str, reason: str) -> None:
        key = (app, deployment, reason)
        self.rejections[key] = self.rejections.get(key, 0) + 1

    def drain(self, gauges: Mapping[str, float] | None = None,
              user: UserReport | None = None) -> TelemetryReport:
        """Everything since the last drain (with `user`, the user metrics' drain); the
        recorder starts over empty."""
        report = TelemetryReport(self.role, self.source, self.app, self.deployment,
                                 self._first, self.http, self.processing, self.errors,
                                 self.exceptions, self.rejections, dict(gauges or {}),
                                 user or {}, grpc=self.grpc)
        self.http, self.processing, self.errors, self.rejections = {}, {}, {}, {}
        self.exceptions, self.grpc = {}, {}
        self._first = False
        return report
