"""What the controller pushes to routers: the route table and each deployment's replica set.

Proxies get the route table when they say hello and on every change. A router that
watches a deployment gets its replica set when it starts watching and whenever the set,
the deployment's limits, its queue share (the queue budget split over the watchers) or
its availability change; an unchanged set is not pushed again.

Changes are gathered, not pushed one at a time: `replica_set(did)` marks the deployment
and asks for a `flush` at the next turn of the event loop (the control loop also flushes
at the end of each tick), so a herd of replicas that report ready together, or of
routers that start watching together, costs one push per watcher, and each push is
pickled once for all of its watchers (transport.rpc.broadcast). Routers that say
`replica_set_deltas` in their hello get one whole set, then only what changed
(model.ReplicaSetDelta): a push then costs what changed, not the size of the set.
While a restarted controller re-attaches to its members, nothing is pushed (`paused`):
routers keep serving from the sets the previous controller sent.

Routers are also told how often to report their load (`load_interval`, pushed when
it changes and to each new router; policy/cadence.py sets it from how many watch).

Flushes are paced by what they cost (`push_gap`): the next one waits twice as long as
the last took, at most 0.1 s. A push to 64 routers takes well under a millisecond and
goes at once; during a herd of 10,000 replicas with 1,000 routers watching, each flush
writes to every router, so without the pace the controller spent its time writing one
or two replicas at a time to 1,000 sockets. Paced, each push carries what changed in
the meantime, and flushes under 50 ms take at most a third of the controller's loop
(longer ones wait 0.1 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from surge.clock import SYSTEM, Clock
from surge.controller.state import ControllerState, DeploymentRecord, Peer
from surge.model import (
    DeploymentId,
    ReplicaInfo,
    ReplicaSet,
    ReplicaSetDelta,
    RouteTable,
    RouteTarget,
)
from surge.policy.admission import queue_share
from surge.policy.cadence import TELEMETRY_INTERVAL_S, TICK_S
from surge.policy.lifecycle import ReplicaState
from surge.transport.rpc import broadcast

__all__ = ["DELTAS", "PUSH_GAP_MAX_S", "UNAVAILABLE_FAILED", "Publisher", "push_gap"]

# What routers tell callers of a deployment that failed to start (no user text: the
# traceback is for the operator, in status()).
UNAVAILABLE_FAILED = "its replicas failed to start; serve.status() shows the error"
# The hello key of a router that applies ReplicaSetDelta pushes.
DELTAS = "replica_set_deltas"
# The pace of flushes: the next waits PUSH_GAP_FACTOR x the last one's duration, at most
# PUSH_GAP_MAX_S (a change reaches every router well within the 200 ms fan-out target).
PUSH_GAP_FACTOR = 2.0
PUSH_GAP_MAX_S = 0.1


def push_gap(flush_s: float) -> float:
    """How long after a flush that took `flush_s` the next may start."""
    return min(PUSH_GAP_MAX_S, PUSH_GAP_FACTOR * flush_s)


@dataclass(frozen=True)
class _Header:
    """The limits, queue share and availability a set is pushed with."""

    max_ongoing_requests: int
    queue_limit: int
    unavailable: str
    backpressure_status: int
    retry_after_s: float | None
    max_queue_wait_s: float | None
    prefix_routing: bool


@dataclass
class _Published:
    header: _Header
    members: dict[str, ReplicaInfo]  # the routable replicas pushed last
    generation: int


Schedule = Callable[[float, Callable[[], None]], None]  # (delay s, callback)


def _call_later(delay: float, callback: Callable[[], None]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop (a test driving the state by hand): now
        callback()
        return
    if delay > 0:
        loop.call_later(delay, callback)
    else:
        loop.call_soon(callback)


class Publisher:
    def __init__(self, state: ControllerState, schedule: Schedule = _call_later,
                 clock: Clock = SYSTEM) -> None:
        self.state = state
        self.clock = clock
        self.watchers: dict[DeploymentId, set[Peer]] = {}
        self.proxies: set[Peer] = set()
        self.routers: set[Peer] = set()  # the peers that watch something
        self.members: set[Peer] = set()  # proxies and replicas (from their hello on)
        self.load_interval_s = TICK_S  # what routers were told (policy/cadence.py)
        self.telemetry_interval_s = TELEMETRY_INTERVAL_S  # what members were told
        self.paused = False
        self.pushed_bytes = 0  # replica-set payload bytes sent (each watcher counted)
        self._schedule = schedule
        self._published: dict[DeploymentId, _Published] = {}
        self._fresh: dict[DeploymentId, set[Peer]] = {}  # watchers owed a whole set
        self._dirty: set[DeploymentId] = set()
        self._forced: set[DeploymentId] = set()
        self._flush_pending = False  # a flush is scheduled
        self._next_at = 0.0  # the pace: no flush before this (monotonic)

    def __repr__(self) -> str:
        return (f"<Publisher proxies={len(self.proxies)} watched={len(self.watchers)} "
                f"dirty={len(self._dirty)} paused={self.paused}>")

    def routes(self) -> RouteTable:
        return RouteTable(tuple(RouteTarget(a.name, a.ingress, a.route_prefix, a.auth,
                                            a.model_routes)
                                for a in self.state.apps.values()
                                if a.route_prefix is not None and a.ingress))

    def add_proxy(self, peer: Peer) -> None:
        self.proxies.add(peer)
        peer.push("routes", self.routes())

    def push_routes(self) -> None:
        broadcast(self.proxies, "routes", self.routes())

    def watch(self, peer: Peer, did: DeploymentId) -> None:
        """A router watches the deployment: it gets the whole set, the others a new
        share of the queue."""
        watchers = self.watchers.setdefault(did, set())
        watchers.add(peer)
        if peer not in self.routers:
            self.routers.add(peer)
            if self.load_interval_s != TICK_S:
                peer.push("load_interval", self.load_interval_s)
        self._fresh.setdefault(did, set()).add(peer)
        self._mark(did)

    def tell_load_interval(self, interval_s: float) -> None:
        """Routers report their load every `interval_s` from now (told if it changed)."""
        if interval_s != self.load_interval_s:
            self.load_interval_s = interval_s
            broadcast(self.routers, "load_interval", interval_s)

    def tell_telemetry_interval(self, interval_s: float) -> None:
        """Members send their telemetry every `interval_s` from now (told if it changed)."""
        if interval_s != self.telemetry_interval_s:
            self.telemetry_interval_s = interval_s
            broadcast(self.members, "telemetry_interval", interval_s)

    def greet_member(self, peer: Peer) -> None:
        """A proxy or replica that just said hello (a replica still building included):
        one of the members, told the interval if it is not the default."""
        self.members.add(peer)
        if self.telemetry_interval_s != TELEMETRY_INTERVAL_S:
            peer.push("telemetry_interval", self.telemetry_interval_s)

    def drop(self, peer: Peer) -> None:
        """A connection closed: it watches nothing now (the others' shares grow)."""
        self.proxies.discard(peer)
        self.routers.discard(peer)
        self.members.discard(peer)
        for did, watchers in self.watchers.items():
            if peer in watchers:
                watchers.discard(peer)
                self._fresh.get(did, set()).discard(peer)
                self._mark(did)

    def replica_set(self, did: DeploymentId, force: bool = False) -> None:
        """The deployment's set may have changed (`force`: push it whole to every
        watcher even if not)."""
        if force:
            self._forced.add(did)
        self._mark(did)

    def replica_sets(self, force: bool = False) -> None:
        for did in list(self.state.deployments):
            self.replica_set(did, force)

    def forget(self, did: DeploymentId) -> None:
        self._published.pop(did, None)
        self._dirty.discard(did)
        self._forced.discard(did)

    def _mark(self, did: DeploymentId) -> None:
        self._dirty.add(did)
        self._ask_flush()

    def _ask_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._schedule(max(0.0, self._next_at - self.clock.monotonic()), self._due)

    def _due(self) -> None:  # scheduled for when the pace allows (timers may run early)
        self._flush_pending = False
        self._flush(self.clock.monotonic())

    def flush(self) -> None:
        """Push what changed since the last flush (nothing while paused); before the
        pace allows, the flush is left to the one scheduled for then."""
        started = self.clock.monotonic()
        if started < self._next_at:
            if self._dirty:
                self._ask_flush()
            return
        self._flush(started)

    def _flush(self, started: float) -> None:
        if self.paused or not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        for did in sorted(dirty):
            self._publish(did)
        ended = self.clock.monotonic()
        self._next_at = ended + push_gap(ended - started)

    def _publish(self, did: DeploymentId) -> None:
        record = self.state.deployments.get(did)
        watchers = self.watchers.get(did)
        if record is None or not watchers:
            return
        running = self.state.group(did).by_state[ReplicaState.RUNNING]
        members = {rid: r.info for rid, r in running.items() if r.info is not None}
        header = self._header(record, len(watchers), bool(members))
        last = self._published.get(did)
        forced = did in self._forced
        self._forced.discard(did)
        fresh = self._fresh.pop(did, set()) & watchers
        if (last is not None and header == last.header
                and members.keys() == last.members.keys()):
            self._push_whole(did, record, last, watchers if forced else fresh)
            return
        now = _Published(header, members, last.generation + 1 if last is not None else 1)
        self._published[did] = now
        whole = watchers if forced or last is None else {
            w for w in watchers if w in fresh or not w.info.get(DELTAS)}
        self._push_whole(did, record, now, whole)
        if last is not None and len(whole) < len(watchers):
            self._push_delta(did, record, last, now, watchers - whole)

    def _header(self, record: DeploymentRecord, watchers: int, running: bool) -> _Header:
        config = record.config
        backpressure = config.backpressure_config
        # Failed with nothing running: answered at once (an old version may still serve).
        unavailable = UNAVAILABLE_FAILED if not running and self.state.failed(record.id) else ""
        return _Header(config.max_ongoing_requests, queue_share(config.queue_limit, watchers),
                       unavailable,
                       backpressure.status_code, backpressure.retry_after_s,
                       config.queue_wait_limit_s, config.request_router_config.prefix_routing)

    def _push_whole(self, did: DeploymentId, record: DeploymentRecord, published: _Published,
                    targets: set[Peer]) -> None:
        if not targets:
            return
        h, members = published.header, published.members
        replica_set = ReplicaSet(did, tuple(members[k] for k in sorted(members)),
                                 h.max_ongoing_requests, h.queue_limit, record.version,
                                 h.unavailable, h.backpressure_status, h.retry_after_s,
                                 published.generation, h.max_queue_wait_s, h.prefix_routing)
        self.pushed_bytes += broadcast(targets, "replica_set", replica_set) * len(targets)

    def _push_delta(self, did: DeploymentId, record: DeploymentRecord, last: _Published,
                    now: _Published, targets: set[Peer]) -> None:
        h = now.header
        added = sorted(now.members.keys() - last.members.keys())
        delta = ReplicaSetDelta(did, last.generation, now.generation,
                                tuple(now.members[k] for k in added),
                                tuple(sorted(last.members.keys() - now.members.keys())),
                                h.max_ongoing_requests, h.queue_limit, record.version,
                                h.unavailable, h.backpressure_status, h.retry_after_s,
                                h.max_queue_wait_s, h.prefix_routing)
        self.pushed_bytes += broadcast(targets, "replica_set_delta", delta) * len(targets)
