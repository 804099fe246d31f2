"""What the controller shows operators: summed request metrics and a bounded timeline.

Proxies and replicas push `TelemetryReport`s (counter deltas, histograms, gauges, and
the replicas' serve.metrics) about once a second; `Observer.telemetry` adds them into
running totals (user metrics: controller/user_metrics.py). Routers' load
reports already reach the autoscaler (`LoadTracker`); once a second `Observer.sample`
adds the new 0.1 s samples into offered/completed/rejected totals, counts the
autoscaler's new decisions, and appends one point per deployment to a timeline of
the last `HISTORY_S` seconds (rates, p50/p99 latency, queue, replicas, the node's CPU
and whether it is saturated, policy/saturation.py; for LLM
deployments also TTFT, inter-token latency, tokens/s and the engine's gauges, from
their serve.metrics: controller/llm_timeline.py), which the dashboard polls.
`snapshot()` freezes everything for the Prometheus text (controller/metrics.py). Nothing
here is on the request path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surge.clock import SYSTEM, Clock
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.llm_timeline import LLMTimeline
from surge.controller.state import ControllerState, DeploymentRecord
from surge.controller.user_metrics import UserFamily, UserMetrics
from surge.model import DeploymentId
from surge.observability.recorder import GrpcKey, Histogram, HttpKey, TelemetryReport
from surge.policy.lifecycle import ReplicaState

__all__ = ["HISTORY_S", "SAMPLE_INTERVAL_S", "MetricsSnapshot", "Observer"]

# One timeline point per deployment per second, for ten minutes (~600 x 200 B each).
SAMPLE_INTERVAL_S = 1.0
HISTORY_S = 600.0
# A proxy that has not reported for this long is gone: its gauges leave /metrics.
STALE_GAUGE_S = 10.0
# Series of a replica that stopped stay this long, for a last scrape, then go.
GONE_REPLICA_KEEP_S = 60.0

ReplicaKey = tuple[str, str, str, str]  # application, deployment, replica, route
ExceptionKey = tuple[str, str, str, str, str]  # ReplicaKey + the exception's type


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything /metrics shows, frozen at one instant (label tuples -> values)."""

    http: Mapping[HttpKey, Histogram] = field(default_factory=dict)
    grpc: Mapping[GrpcKey, Histogram] = field(default_factory=dict)
    processing: Mapping[ReplicaKey, Histogram] = field(default_factory=dict)
    errors: Mapping[ReplicaKey, int] = field(default_factory=dict)
    exceptions: Mapping[ExceptionKey, int] = field(default_factory=dict)
    replica_processing: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    replica_healthy: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    replica_starts: Mapping[tuple[str, str], int] = field(default_factory=dict)
    replica_started: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    replicas_by_state: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    target_replicas: Mapping[tuple[str, str], int] = field(default_factory=dict)
    autoscaled: frozenset[tuple[str, str]] = frozenset()
    queued: Mapping[tuple[str, str], float] = field(default_factory=dict)
    ongoing: Mapping[tuple[str, str], float] = field(default_factory=dict)
    offered: Mapping[tuple[str, str], int] = field(default_factory=dict)
    completed: Mapping[tuple[str, str], int] = field(default_factory=dict)
    rejections: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    decisions: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    signals: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    proxies: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    proxy_nodes: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # node id, ip
    user: Mapping[str, UserFamily] = field(default_factory=dict)  # serve.metrics by name
    node_cpu: float | None = None  # busy share of the head node's CPU; None: not read
    saturated: Mapping[tuple[str, str], int] = field(default_factory=dict)  # 1: node saturated


# A gRPC status as the timeline's HTTP status classes count it.
GRPC_KINDS = {"OK": "2xx", "DEADLINE_EXCEEDED": "timeouts", "CANCELLED": "4xx",
              "NOT_FOUND": "4xx", "INVALID_ARGUMENT": "4xx", "ALREADY_EXISTS": "4xx",
              "PERMISSION_DENIED": "4xx", "FAILED_PRECONDITION": "4xx", "OUT_OF_RANGE": "4xx",
              "UNAUTHENTICATED": "4xx"}


def _merge(into: dict[Any, Histogram], key: Any, histogram: Histogram) -> None:
    current = into.get(key)
    if current is None:
        into[key] = Histogram(histogram.counts, histogram.sum)
    else:
        current.merge(histogram)


class Observer:
    """Reads the controller's state, load samples and decisions; writes only its own."""

    def __init__(self, state: ControllerState, load: LoadTracker, autoscaler: Autoscaler,
                 clock: Clock = SYSTEM) -> None:
        self.state = state
        self.load = load
        self.autoscaler = autoscaler
        self.clock = clock
        self.url = ""  # the dashboard's base URL once its server listens
        self.http: dict[HttpKey, Histogram] = {}
        self.grpc: dict[GrpcKey, Histogram] = {}
        self.processing: dict[ReplicaKey, Histogram] = {}
        self.errors: dict[ReplicaKey, int] = {}
        self.exceptions: dict[ExceptionKey, int] = {}
        self.user = UserMetrics()
        self.llm = LLMTimeline()
        self.rejections: dict[tuple[str, str, str], int] = {}
        self.replica_starts: dict[tuple[str, str], int] = {}
        self.replica_started: dict[str, tuple[str, str]] = {}  # id -> app, deployment
        self.replica_gauges: dict[str, tuple[str, str, float]] = {}  # id -> app, dep, value
        self.replica_seen: dict[str, float] = {}
        self.replica_models: dict[str, tuple[str, ...]] = {}  # multiplexed replicas'
        self.proxy_gauges: dict[str, tuple[float, Mapping[str, float]]] = {}
        self.offered: dict[DeploymentId, int] = {}
        self.completed: dict[DeploymentId, int] = {}
        self.router_rejected: dict[DeploymentId, int] = {}
        self.decisions: dict[tuple[str, str, str], int] = {}
        self._consumed: dict[DeploymentId, float] = {}
        self._last_decision_at = float("-inf")
        # What happened since the last timeline point, per deployment.
        self._window_http: dict[DeploymentId, Histogram] = {}
        self._window_processing: dict[DeploymentId, Histogram] = {}
        self._window_status: dict[DeploymentId, dict[str, int]] = {}
        # Latency of the window before, too: proxies report once a second at their own
        # phase, so quantiles span the last two windows (~2 s) and never skip a beat.
        self._previous_latency: dict[DeploymentId, Histogram] = {}
        self.timeline: deque[dict[str, Any]] = deque(maxlen=int(HISTORY_S / SAMPLE_INTERVAL_S))
        self.decision_log: deque[dict[str, Any]] = deque(maxlen=500)

    def __repr__(self) -> str:
        return (f"<Observer url={self.url or '-'} points={len(self.timeline)} "
                f"http_series={len(self.http)}>")

    # -- reports from proxies and replicas ----------------------------------------------

    def telemetry(self, report: TelemetryReport) -> None:
        now = self.clock.monotonic()
        if report.role == "proxy":
            self.proxy_gauges[report.source] = (now, dict(report.gauges))
        elif report.role == "replica":
            self.replica_seen[report.source] = now
            self.replica_gauges[report.source] = (report.app, report.deployment,
                                                  float(report.gauges.get("processing", 0)))
            if report.models or report.source in self.replica_models:
                self.replica_models[report.source] = report.models
            if report.first:
                key = (report.app, report.deployment)
                self.replica_starts[key] = self.replica_starts.get(key, 0) + 1
                self.replica_started[report.source] = key
        for http_key, histogram in report.http.items():
            _merge(self.http, http_key, histogram)
            if http_key[0]:
                did = DeploymentId(http_key[0], http_key[1])
                _merge(self._window_http, did, histogram)
                status = self._window_status.setdefault(did, {})
                code = http_key[4]
                kind = "timeouts" if code == 408 else f"{code // 100}xx"
                status[kind] = status.get(kind, 0) + histogram.count
        for grpc_key, histogram in report.grpc.items():
            _merge(self.grpc, grpc_key, histogram)
            if grpc_key[0]:  # on the dashboard's timeline beside HTTP
                did = DeploymentId(grpc_key[0], grpc_key[1])
                _merge(self._window_http, did, histogram)
                status = self._window_status.setdefault(did, {})
                kind = GRPC_KINDS.get(grpc_key[3], "5xx")
                status[kind] = status.get(kind, 0) + histogram.count
        for route, histogram in report.processing.items():
            _merge(self.processing, (report.app, report.deployment, report.source, route),
                   histogram)
            _merge(self._window_processing, DeploymentId(report.app, report.deployment),
                   histogram)
        for route, count in report.errors.items():
            error_key = (report.app, report.deployment, report.source, route)
            self.errors[error_key] = self.errors.get(error_key, 0) + count
        for (route, kind), count in report.exceptions.items():
            exception_key = (report.app, report.deployment, report.source, route, kind)
            self.exceptions[exception_key] = self.exceptions.get(exception_key, 0) + count
        for rejection, count in report.rejections.items():
            self.rejections[rejection] = self.rejections.get(rejection, 0) + count
        if report.user:
            self.user.add(report.source, report.user)

    # -- once a second ------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        """Fold in the routers' new load samples and decisions; append a timeline point."""
        now, wall = self.clock.monotonic(), self.clock.wall()
        point: dict[str, Any] = {"t": round(wall, 3), "deployments": {},
                                 "node_cpu_pct": _pct(self.state.node_cpu)}
        for did, record in list(self.state.deployments.items()):
            point["deployments"][str(did)] = self._deployment_point(did, record.target)
            point["deployments"][str(did)]["saturated"] = bool(record.node_saturated)
        point["llm"] = self.llm.sample(self.user.families, now, SAMPLE_INTERVAL_S)
        self._fold_decisions(now, wall)
        self._prune(now)
        self._previous_latency = {did: self._latency_window(did) for did in
                                  set(self._window_http) | set(self._window_processing)}
        self._window_http, self._window_processing, self._window_status = {}, {}, {}
        self.timeline.append(point)
        return point

    def _fold_load(self, did: DeploymentId) -> tuple[float, float, float, float]:
        """Add the samples closed since the last call; (arrivals, completions,
        rejections, seconds) of those samples."""
        series = self.load.series.get(did, ())
        since = self._consumed.get(did, float("-inf"))
        arrivals = completions = rejections = span = 0.0
        for sample in reversed(series):
            if sample.t <= since:
                break
            arrivals += sample.arrivals
            completions += sample.completions
            rejections += sample.rejections
            span += sample.duration_s
        if series:
            self._consumed[did] = series[-1].t
        self.offered[did] = self.offered.get(did, 0) + int(arrivals)
        self.completed[did] = self.completed.get(did, 0) + int(completions)
        self.router_rejected[did] = self.router_rejected.get(did, 0) + int(rejections)
        return arrivals, completions, rejections, span

    def _deployment_point(self, did: DeploymentId, target: int) -> dict[str, Any]:
        arrivals, completions, rejections, span = self._fold_load(did)
        per_s = 1.0 / span if span > 0 else 0.0
        series = self.load.series.get(did)
        latest = series[-1] if series else None
        latency = Histogram()
        latency.merge(self._latency_window(did))
        previous = self._previous_latency.get(did)
        if previous is not None:
            latency.merge(previous)
        group = self.state.group(did)
        status = self._window_status.get(did, {})
        window = SAMPLE_INTERVAL_S
        return {
            "offered": round(arrivals * per_s, 2), "served": round(completions * per_s, 2),
            "rejected": round(rejections * per_s, 2),
            "errors": round(status.get("5xx", 0) / window, 2),
            "timeouts": round(status.get("timeouts", 0) / window, 2),
            "queued": latest.queued if latest else 0, "ongoing": latest.ongoing if latest else 0,
            "p50_ms": _round(latency.quantile(0.5)),
            "p99_ms": _round(latency.quantile(0.99)),
            "running": group.count(ReplicaState.RUNNING),
            "starting": group.count(ReplicaState.STARTING),
            "standby": group.count(ReplicaState.STANDBY),
            "target": target,
        }

    def _latency_window(self, did: DeploymentId) -> Histogram:
        """This window's latency: end to end at the proxies, else (handle-only
        deployments) processing time at the replicas."""
        latency = self._window_http.get(did)
        if latency is None or latency.count == 0:
            latency = self._window_processing.get(did)
        return latency if latency is not None else Histogram()

    def _fold_decisions(self, now: float, wall: float) -> None:
        since = self._last_decision_at  # decisions of one tick share their time
        for decision in self.autoscaler.decisions:
            if decision.at <= since:
                continue
            did = decision.deployment
            key = (did.app, did.name, decision.kind.value)
            self.decisions[key] = self.decisions.get(key, 0) + 1
            self.decision_log.append({
                "t": round(wall - (now - decision.at), 3), "deployment": str(did),
                "from": decision.previous, "to": decision.target, "reason": decision.reason,
                "kind": decision.kind.value,
                "signals": {k: _round(v) for k, v in decision.signals.items()}})
            self._last_decision_at = decision.at

    def _prune(self, now: float) -> None:
        for proxy, (at, _) in list(self.proxy_gauges.items()):
            if now - at > STALE_GAUGE_S:
                del self.proxy_gauges[proxy]
        alive = self.state.replicas
        gone = {r for r, at in self.replica_seen.items()
                if r not in alive and now - at > GONE_REPLICA_KEEP_S}
        for replica in gone:
            del self.replica_seen[replica]
            self.replica_gauges.pop(replica, None)
            self.replica_started.pop(replica, None)
        if gone:
            self.processing = {k: v for k, v in self.processing.items() if k[2] not in gone}
            self.errors = {k: v for k, v in self.errors.items() if k[2] not in gone}
            self.exceptions = {k: v for k, v in self.exceptions.items() if k[2] not in gone}
            self.user.forget(gone)
        stopped = [r for r in self.replica_gauges if r not in alive]
        for replica in stopped:
            del self.replica_gauges[replica]  # a stopped replica processes nothing
            self.replica_models.pop(replica, None)
        if stopped:
            self.user.drop_gauges(stopped)

    # -- views ---------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        healthy: dict[tuple[str, str, str], int] = {}
        by_state: dict[tuple[str, str, str], int] = {}
        targets: dict[tuple[str, str], int] = {}
        autoscaled, queued, ongoing, saturated = set(), {}, {}, {}
        groups = self.state.by_deployment()
        for did, record in self.state.deployments.items():
            key = (did.app, did.name)
            targets[key] = record.target
            if record.config.autoscaling_config is not None:
                autoscaled.add(key)
                saturated[key] = int(bool(record.node_saturated))
            for state in ReplicaState:
                by_state[(*key, state.value)] = 0
            for replica in groups.get(did, []):
                by_state[(*key, replica.state.value)] += 1
                if replica.state in (ReplicaState.RUNNING, ReplicaState.STANDBY):
                    healthy[(*key, replica.replica_id)] = int(replica.health_failures == 0)
            series = self.load.series.get(did)
            if series:
                queued[key], ongoing[key] = series[-1].queued, series[-1].ongoing
        rejections = dict(self.rejections)
        for did, count in self.router_rejected.items():
            rejections[(did.app, did.name, "queue_full")] = count
        signals = {}
        for did, decision in self.autoscaler.last.items():
            for name, value in decision.signals.items():
                signals[(did.app, did.name, name)] = float(value)
        return MetricsSnapshot(
            http=self.http, grpc=self.grpc, processing=self.processing, errors=self.errors,
            exceptions=self.exceptions,
            replica_processing={(a, d, r): v for r, (a, d, v) in self.replica_gauges.items()},
            replica_healthy=healthy, replica_starts=dict(self.replica_starts),
            replica_started={(a, d, r): 1 for r, (a, d) in self.replica_started.items()},
            replicas_by_state=by_state, target_replicas=targets,
            autoscaled=frozenset(autoscaled), queued=queued, ongoing=ongoing,
            offered={(d.app, d.name): n for d, n in self.offered.items()},
            completed={(d.app, d.name): n for d, n in self.completed.items()},
            rejections=rejections, decisions=dict(self.decisions), signals=signals,
            proxies={p: g for p, (_, g) in self.proxy_gauges.items()},
            proxy_nodes={p: (self.state.proxy_node(p), record.address.rpartition(":")[0])
                         for p, record in self.state.proxies.items()},
            user=self.user.families, node_cpu=self.state.node_cpu, saturated=saturated)

    def status(self) -> dict[str, Any]:
        """Applications, deployments and replicas with their states, for the page."""
        state = self.state
        apps = {}
        for name, app in state.apps.items():
            overview = state.app_status(name)
            apps[name] = {
                "status": overview.status.value, "message": overview.message,
                "route_prefix": app.route_prefix,
                "deployments": {
                    dname: {"status": d.status.value, "target": d.target_replicas,
                            "replica_states": d.replica_states, "message": d.message,
                            **_node(state.deployments[DeploymentId(name, dname)])}
                    for dname, d in overview.deployments.items()}}
        replicas = [{"replica_id": r.replica_id, "application": r.deployment.app,
                     "deployment": r.deployment.name, "state": r.state.value, "pid": r.pid,
                     "version": r.version, "health_failures": r.health_failures,
                     "models": list(self.replica_models.get(r.replica_id, ()))}
                    for r in state.replicas.values()]
        return {"control_address": state.address, "http_address": state.proxy_address,
                "node_cpu_pct": _pct(state.node_cpu), "applications": apps,
                "replicas": replicas,
                "proxies": {p.proxy_id: p.pid for p in state.proxies.values()}}

    def timeline_since(self, since: float | None) -> dict[str, Any]:
        points = [p for p in self.timeline if since is None or p["t"] > since]
        decisions = [d for d in self.decision_log if since is None or d["t"] > since]
        return {"now": round(self.clock.wall(), 3), "interval_s": SAMPLE_INTERVAL_S,
                "history_s": HISTORY_S, "samples": points, "decisions": decisions,
                "status": self.status()}


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def _pct(share: float | None) -> float | None:
    return None if share is None else round(100 * share, 1)


def _node(record: DeploymentRecord) -> dict[str, Any]:
    """A deployment's autoscaling and node fields on the page."""
    return {"autoscaling": record.config.autoscaling_config is not None,
            "node_cpu_pct": _pct(record.node_cpu), "node_saturated": record.node_saturated}
