"""Frozen value types shared by every layer: ids, replica and route snapshots, status."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LOCAL_NODE",
    "AccessTokens",
    "ApplicationStatus",
    "ApplicationStatusOverview",
    "DeploymentId",
    "DeploymentStatus",
    "DeploymentStatusOverview",
    "ImportedTarget",
    "LoadReport",
    "ModelRoutes",
    "ProxySpec",
    "ProxyStatus",
    "ReplicaInfo",
    "ReplicaSet",
    "ReplicaSetDelta",
    "ReplicaSpec",
    "RouteTable",
    "RouteTarget",
    "ServeStatus",
]

LOCAL_NODE = "local"  # the node id of everything on the local backend


@dataclass(frozen=True, order=True)
class DeploymentId:
    app: str
    name: str

    def __str__(self) -> str:
        return f"{self.app}#{self.name}"


@dataclass(frozen=True)
class ReplicaInfo:
    """Where a running replica listens, and what it can take."""

    replica_id: str
    deployment: DeploymentId
    address: str  # "host:port" of its frame server
    pid: int
    node_id: str = "local"
    # A Unix socket for routers on the same node (multi-node backends listen on both).
    local_address: str = ""


@dataclass(frozen=True)
class ReplicaSet:
    """The replicas a router may send to, pushed by the controller on every change."""

    deployment: DeploymentId
    replicas: tuple[ReplicaInfo, ...]
    max_ongoing_requests: int
    queue_limit: int  # this router's share of the deployment's queue budget
    version: int = 0
    # Set when no replica will come (the deployment failed to start): why, in words safe
    # to show a client. Routers then answer at once instead of queueing until a timeout.
    unavailable: str = ""
    # The deployment's backpressure_config: the HTTP status of a request over the queue
    # budget, and its Retry-After (None: none under the count bound, as Ray; the
    # router's estimate from the drain rate under the wait bound).
    backpressure_status: int = 503
    retry_after_s: float | None = None
    # Counts the sets pushed for this deployment on one connection: a ReplicaSetDelta
    # applies to the set of its `base`.
    generation: int = 0
    # The longest a request may wait in a router's queue (policy/admission.py); None:
    # bounded by `queue_limit` alone (an explicit max_queued_requests).
    max_queue_wait_s: float | None = None
    # request_router_kwargs' prefix_routing: route OpenAI prompts by the prefix the
    # engines hold (router/engine_choice.py); False: by the engines' load alone.
    prefix_routing: bool = True


@dataclass(frozen=True)
class ReplicaSetDelta:
    """What changed in a deployment's replica set since the set of generation `base`.

    Pushed (topic `replica_set_delta`) instead of the whole set to routers that say
    `replica_set_deltas` in their hello: the first set on a connection is whole, each
    later one only what joined and left, with the limits, share and availability in
    full (they are a few numbers). A router whose set is not `base` (it missed one)
    asks for the whole set again (`watch`).
    """

    deployment: DeploymentId
    base: int
    generation: int
    added: tuple[ReplicaInfo, ...]
    removed: tuple[str, ...]  # replica ids
    max_ongoing_requests: int
    queue_limit: int
    version: int = 0
    unavailable: str = ""
    backpressure_status: int = 503
    retry_after_s: float | None = None
    max_queue_wait_s: float | None = None
    prefix_routing: bool = True

    def apply(self, current: ReplicaSet) -> ReplicaSet | None:
        """The set after this change (sorted by replica id, as whole sets are); None if
        `current` is not the set it was made against."""
        if current.generation != self.base or current.deployment != self.deployment:
            return None
        gone = set(self.removed)
        kept = {r.replica_id: r for r in current.replicas if r.replica_id not in gone}
        kept.update((r.replica_id, r) for r in self.added)
        return ReplicaSet(self.deployment, tuple(kept[k] for k in sorted(kept)),
                          self.max_ongoing_requests, self.queue_limit, self.version,
                          self.unavailable, self.backpressure_status, self.retry_after_s,
                          self.generation, self.max_queue_wait_s, self.prefix_routing)


@dataclass(frozen=True, repr=False)
class AccessTokens:
    """The bearer tokens one application accepts, as SHA-256 digests (never the tokens).

    Tokens are read once, by the process that deploys the application; the controller
    and the proxies only ever hold their digests, so a route table that ends up in a log,
    a pickle or a core dump gives nobody a usable credential.
    """

    digests: tuple[bytes, ...]
    source: str = ""  # where they were read ("env APP_TOKENS"), for messages: no secret

    def __repr__(self) -> str:
        return f"AccessTokens({len(self.digests)} token(s) from {self.source or '?'})"


@dataclass(frozen=True)
class ModelRoutes:
    """Which deployment serves each model of an OpenAI-compatible application.

    Published with the application's route so the proxy reads a request body's `model`
    field and sends it straight to that model's deployment (policy/openai_route.py), one
    hop instead of two through the application's ingress deployment, which still takes
    everything else (`GET /v1/models`, unknown models, bodies the proxy does not read).
    """

    models: tuple[tuple[str, str], ...]  # (model id, deployment name), sorted by model id

    def __repr__(self) -> str:
        return f"ModelRoutes({dict(self.models)})"


@dataclass(frozen=True)
class RouteTarget:
    app: str
    deployment: str
    route_prefix: str
    auth: AccessTokens | None = None  # None: the route is open to every client
    models: ModelRoutes | None = None  # an OpenAI app: the proxy may route by `model`


@dataclass(frozen=True)
class RouteTable:
    """route_prefix -> ingress deployment; longest prefix wins."""

    targets: tuple[RouteTarget, ...] = ()

    def match(self, path: str) -> RouteTarget | None:
        best: RouteTarget | None = None
        for target in self.targets:
            prefix = target.route_prefix
            if prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                if best is None or len(prefix) > len(best.route_prefix):
                    best = target
        return best


class ApplicationStatus(enum.StrEnum):
    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class ProxyStatus(enum.StrEnum):
    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"


class DeploymentStatus(enum.StrEnum):
    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"


@dataclass(frozen=True)
class DeploymentStatusOverview:
    status: DeploymentStatus
    replica_states: dict[str, int]
    message: str = ""
    target_replicas: int = 0
    # Over the last second: offered/completed/rejected per second, queued and ongoing now.
    rates: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ApplicationStatusOverview:
    status: ApplicationStatus
    message: str
    route_prefix: str | None
    deployments: dict[str, DeploymentStatusOverview]
    last_deployed_time_s: float = 0.0


@dataclass(frozen=True)
class ServeStatus:
    """What `serve.status()` returns (Ray Serve's shape)."""

    applications: dict[str, ApplicationStatusOverview] = field(default_factory=dict)
    proxies: dict[str, str] = field(default_factory=dict)
    http_address: str = ""
    control_address: str = ""
    proxy_addresses: dict[str, str] = field(default_factory=dict)  # proxy id -> host:port
    dashboard_address: str = ""  # http://host:port of the dashboard and /metrics; "": off

    def to_dict(self) -> dict[str, Any]:
        return {
            "control_address": self.control_address,
            "http_address": self.http_address,
            "dashboard_address": self.dashboard_address,
            "proxies": dict(self.proxies),
            "proxy_addresses": dict(self.proxy_addresses),
            "applications": {
                name: {
                    "status": app.status.value,
                    "message": app.message,
                    "route_prefix": app.route_prefix,
                    "deployments": {
                        dname: {"status": d.status.value, "replica_states": d.replica_states,
                                "message": d.message, "target_replicas": d.target_replicas,
                                "rates": dict(d.rates)}
                        for dname, d in app.deployments.items()
                    },
                }
                for name, app in self.applications.items()
            },
        }


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica process needs to become a replica, fetched from the controller."""

    replica_id: str
    deployment: DeploymentId
    version: int
    target_blob: bytes  # cloudpickled class or function
    init_blob: bytes  # cloudpickled (args, kwargs), bound deployments turned into handles
    user_config: Any
    max_ongoing_requests: int
    graceful_shutdown_timeout_s: float
    sys_path: tuple[str, ...] = ()
    # request_router_config's: how often record_routing_stats (and
    # record_autoscaling_stats) run in the replica, and how long one call may take.
    routing_stats_period_s: float = 10.0
    routing_stats_timeout_s: float = 30.0
    rank: int = 0  # unique among the deployment's live replicas (ReplicaContext.rank)
    world_size: int = 1  # the deployment's target number of replicas when it was asked
    # surge: the deployment's `autoscaling_config.objectives` as the controller sizes for
    # them, so that an LLM replica sheds against the same targets (None: it states none)
    objectives: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ProxySpec:
    """What a proxy process serves, fetched from the controller."""

    host: str
    port: int
    request_timeout_s: float | None
    keep_alive_timeout_s: float
    max_body_bytes: int
    root_path: str = ""
    reuse_port: bool = False  # several proxy workers share the port (SO_REUSEPORT)
    max_header_bytes: int = 64 * 1024
    request_header_timeout_s: float = 30.0
    max_connections: int = 10_000
    request_body_timeout_s: float = 30.0
    websocket_max_message_bytes: int = 16 * 1024 * 1024
    websocket_idle_timeout_s: float = 600.0
    ssl_certfile: str | None = None  # set: the proxy serves HTTPS only (proxy/tls.py)
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str = "none"  # client certificates: "none" | "optional" | "required"
    # gRPC (Ray's gRPCOptions): no servicer functions, no gRPC server.
    grpc_port: int = 9000
    grpc_servicer_functions: tuple[str, ...] = ()
    grpc_request_timeout_s: float | None = None
    grpc_enable_reflection: bool = False
    grpc_enable_health: bool = False


@dataclass(frozen=True)
class ImportedTarget:
    """A deployment's class or function named by import path instead of pickled by value.

    Used when the code lives in an importable module (not `__main__`): replicas import
    it, which is faster and safer than unpickling by value. `source_digest` changes when
    the module's source does, so a code change still rolls the replicas.
    """

    module: str
    qualname: str
    source_digest: str = ""


@dataclass(frozen=True)
class LoadReport:
    """What one router saw for one deployment since its last report (pushed every 0.1 s)."""

    deployment: DeploymentId
    arrivals: int  # requests offered, rejected ones included
    completions: int
    rejections: int
    queued: int  # gauge: waiting in this router now
    in_flight: int  # gauge: sent by this router and not yet answered
    # When the router measured it (its own monotonic clock) and how long its counters
    # cover (since its previous report): the controller spreads them over that time,
    # not from when the report came (policy/load_spread.py). None, 0.0: not said.
    measured_at: float | None = None
    covers_s: float = 0.0
    # An urgent report on a jump in an LLM router's arrivals: the rate they implied
    # (policy/arrival_jump.py); 0.0: none.
    jump_rate: float = 0.0
