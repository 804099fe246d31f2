"""What the controller pushes to routers: the route table and each deployment's replica set.

Proxies get the route table when they say hello and on every change. A router that
watches a deployment gets its replica set on watching and whenever the set, the
deployment's limits, its queue share (the queue budget split over the watchers) or
its availability change; an unchanged set is not pushed again. While a restarted
controller re-attaches to its members, nothing is pushed (`paused`): routers keep
serving from the sets the previous controller sent.
"""

from __future__ import annotations

from surge.controller.state import ControllerState, Peer
from surge.model import DeploymentId, ReplicaSet, RouteTable, RouteTarget
from surge.policy.admission import queue_share

__all__ = ["UNAVAILABLE_FAILED", "Publisher"]

# What routers tell callers of a deployment that failed to start (no user text: the
# traceback is for the operator, in status()).
UNAVAILABLE_FAILED = "its replicas failed to start; serve.status() shows the error"


class Publisher:
    def __init__(self, state: ControllerState) -> None:
        self.state = state
        self.watchers: dict[DeploymentId, set[Peer]] = {}
        self.proxies: set[Peer] = set()
        self.paused = False
        self._pushed: dict[DeploymentId, tuple[object, ...]] = {}

    def __repr__(self) -> str:
        return (f"<Publisher proxies={len(self.proxies)} watched={len(self.watchers)} "
                f"paused={self.paused}>")

    def routes(self) -> RouteTable:
        return RouteTable(tuple(RouteTarget(a.name, a.ingress, a.route_prefix, a.auth)
                                for a in self.state.apps.values()
                                if a.route_prefix is not None and a.ingress))

    def add_proxy(self, peer: Peer) -> None:
        self.proxies.add(peer)
        peer.push("routes", self.routes())

    def push_routes(self) -> None:
        table = self.routes()
        for proxy in self.proxies:
            proxy.push("routes", table)

    def watch(self, peer: Peer, did: DeploymentId) -> None:
        self.watchers.setdefault(did, set()).add(peer)
        self.replica_set(did, force=True)

    def drop(self, peer: Peer) -> None:
        """A connection closed: it watches nothing now (the others' shares grow)."""
        self.proxies.discard(peer)
        for did, watchers in self.watchers.items():
            if peer in watchers:
                watchers.discard(peer)
                self.replica_set(did, force=True)

    def replica_set(self, did: DeploymentId, force: bool = False) -> None:
        record = self.state.deployments.get(did)
        watchers = self.watchers.get(did)
        if record is None or not watchers or self.paused:
            return
        running = sorted((r.info for r in self.state.running(did) if r.info is not None),
                         key=lambda info: info.replica_id)
        config = record.config
        share = queue_share(config.queue_limit, len(watchers))
        # Failed with nothing running: answered at once (an old version may still serve).
        unavailable = UNAVAILABLE_FAILED if not running and self.state.failed(did) else ""
        backpressure = config.backpressure_config
        key = (tuple(running), config.max_ongoing_requests, share, unavailable, backpressure)
        if not force and self._pushed.get(did) == key:
            return
        self._pushed[did] = key
        replica_set = ReplicaSet(did, tuple(running), config.max_ongoing_requests, share,
                                 record.version, unavailable, backpressure.status_code,
                                 backpressure.retry_after_s)
        for watcher in watchers:
            watcher.push("replica_set", replica_set)

    def replica_sets(self, force: bool = False) -> None:
        for did in list(self.state.deployments):
            self.replica_set(did, force)

    def forget(self, did: DeploymentId) -> None:
        self._pushed.pop(did, None)
