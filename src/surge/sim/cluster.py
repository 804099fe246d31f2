"""Replicas one by one: discrete lifecycle events on virtual time, placement, cost.

Every replica moves through policy/lifecycle.py's table (`transition` raises on an
illegal move) on these events:

* StartReplicas (from policy/reconcile.py): a replica is placed if the cluster has a
  free slot (nodes x replicas_per_node; alive replicas hold one), on the node with the
  fewest alive replicas (spread), else the start waits for the next reconcile, as the
  controller's backend refuses a placement. It is STARTING for a start-up time drawn
  from the scenario's distribution (or its split: process start + weight load, where a
  node's weight store holds the weights after its first replica loaded them, so later
  ones there map them in `store_load_s`), then RUNNING and routable at once, or STANDBY
  when the running target is met and spares are wanted (the controller's rule when a
  replica reports ready).
* ActivateReplica: STANDBY -> RUNNING now (reconcile sees it running), routable after
  `standby_activation_s` (the route-table push).
* StopReplica: -> DRAINING, out of the route tables at once, STOPPED `drain_s` later
  (its in-flight requests finish elsewhere in the fluid model).

The measured start-up lead (asking for a replica -> it serves) is the controller's EWMA
(first sample taken whole, then weight 0.3), fed to the policy as `startup_lead_s`.
Cost is replica-seconds of every alive replica (starting, standby, running, draining):
each holds its GPU.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from surge.policy.lifecycle import ALIVE, ReplicaState, transition
from surge.policy.reconcile import (
    Action,
    ActivateReplica,
    ObservedReplica,
    StartReplicas,
    StopReplica,
)
from surge.sim.scenario import Cluster

__all__ = ["ClusterState", "SimReplica"]

S = ReplicaState
# The controller's start-up lead before any replica was seen starting.
INITIAL_STARTUP_LEAD_S = 1.0
STARTUP_LEAD_WEIGHT = 0.3

_READY, _ROUTABLE, _STOPPED = 0, 1, 2


@dataclass
class SimReplica:
    replica_id: str
    created_at: float
    node: int = 0
    state: ReplicaState = S.STARTING
    routable: bool = False
    stopped_at: float | None = None

    def move(self, new: ReplicaState) -> None:
        self.state = transition(self.state, new)


class ClusterState:
    """The replicas of one deployment on a cluster of fixed size."""

    def __init__(self, spec: Cluster, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.replicas: dict[str, SimReplica] = {}
        self.retired: list[SimReplica] = []
        self._events: list[tuple[float, int, int, str]] = []
        self._seq = 0
        self._ids = 0
        self.alive = 0
        self.running = 0  # RUNNING (routable or activating)
        self.routable = 0
        self.standby = 0
        self.starting = 0
        self.dirty = True  # something reconcile looks at changed
        self.startup_lead_s = INITIAL_STARTUP_LEAD_S
        self.startups_seen = 0
        self.placement_refused = 0
        self.on_node = [0] * spec.nodes  # alive replicas per node
        # per node: when its weight store holds the weights (None: not yet asked for)
        self.weights_at: list[float | None] = [None] * spec.nodes

    def __repr__(self) -> str:
        return (f"<ClusterState alive={self.alive}/{self.spec.replica_slots} "
                f"running={self.running} routable={self.routable} standby={self.standby} "
                f"starting={self.starting}>")

    # -- events ------------------------------------------------------------------------

    def _at(self, when: float, kind: int, replica_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, replica_id))

    def next_event(self) -> float:
        return self._events[0][0] if self._events else float("inf")

    def advance(self, until: float, target: int, standby_wanted: int) -> bool:
        """Apply every event due by `until`; True if routable capacity changed."""
        changed = False
        events = self._events
        while events and events[0][0] <= until:
            when, _, kind, replica_id = heapq.heappop(events)
            replica = self.replicas.get(replica_id)
            if replica is None:
                continue
            if kind == _READY and replica.state is S.STARTING:
                self.starting -= 1
                self._observe_startup(when - replica.created_at)
                if self.running >= target and standby_wanted:
                    replica.move(S.STANDBY)
                    self.standby += 1
                else:
                    replica.move(S.RUNNING)
                    self.running += 1
                    self._route(replica)
                    changed = True
                self.dirty = True
            elif kind == _ROUTABLE and replica.state is S.RUNNING and not replica.routable:
                self._route(replica)
                changed = True
            elif kind == _STOPPED and replica.state is S.DRAINING:
                replica.move(S.STOPPED)
                replica.stopped_at = when
                self.alive -= 1
                self.on_node[replica.node] -= 1
                self.retired.append(self.replicas.pop(replica_id))
                self.dirty = True
        return changed

    def _route(self, replica: SimReplica) -> None:
        replica.routable = True
        self.routable += 1

    def _observe_startup(self, seconds: float) -> None:
        # As the controller's DeploymentRecord.observe_startup.
        self.startups_seen += 1
        weight = 1.0 if self.startups_seen == 1 else STARTUP_LEAD_WEIGHT
        self.startup_lead_s += weight * (seconds - self.startup_lead_s)

    # -- actions -------------------------------------------------------------------------

    def _new(self, now: float) -> SimReplica | None:
        if self.alive >= self.spec.replica_slots:
            self.placement_refused += 1
            return None
        self._ids += 1
        node = min(range(self.spec.nodes), key=lambda n: (self.on_node[n], n))
        replica = SimReplica(f"r{self._ids}", now, node)
        self.replicas[replica.replica_id] = replica
        self.alive += 1
        self.on_node[node] += 1
        return replica

    def _startup_delay(self, replica: SimReplica, now: float) -> float:
        """How long `replica`, asked for `now`, takes to serve."""
        weights = self.spec.weights
        if weights is None:
            return max(0.0, self.spec.startup_s.sample(self.rng))
        process = max(0.0, weights.process_start_s.sample(self.rng))
        held = self.weights_at[replica.node]
        if not weights.store or held is None:
            load = max(0.0, weights.weight_load_s.sample(self.rng))
            if weights.store:  # this replica fills its node's store
                self.weights_at[replica.node] = now + process + load
            return process + load
        mapped = max(0.0, weights.store_load_s.sample(self.rng))
        return max(process, held - now) + mapped

    def warm(self, now: float, running: int, standby: int) -> None:
        """Replicas already up at the start of the run (a cluster in steady state)."""
        for index in range(running + standby):
            replica = self._new(now)
            if replica is None:
                break
            self.weights_at[replica.node] = now  # it loaded its weights before the run
            if index < running:
                replica.move(S.RUNNING)
                self.running += 1
                self._route(replica)
            else:
                replica.move(S.STANDBY)
                self.standby += 1
        self.dirty = True

    def observed(self) -> list[ObservedReplica]:
        return [ObservedReplica(r.replica_id, r.state, 0, r.created_at)
                for r in self.replicas.values() if r.state in ALIVE]

    def apply(self, actions: Sequence[Action], now: float) -> None:
        for action in actions:
            if isinstance(action, ActivateReplica):
                spare = self.replicas[action.replica_id]
                spare.move(S.RUNNING)
                self.standby -= 1
                self.running += 1
                self._at(now + self.spec.standby_activation_s, _ROUTABLE, spare.replica_id)
            elif isinstance(action, StartReplicas):
                for _ in range(action.count):
                    fresh = self._new(now)
                    if fresh is None:
                        break
                    self.starting += 1
                    self._at(now + self._startup_delay(fresh, now), _READY, fresh.replica_id)
            elif isinstance(action, StopReplica):
                self._stop(self.replicas[action.replica_id], now)
        self.dirty = False

    def _stop(self, replica: SimReplica, now: float) -> None:
        if replica.state is S.STARTING:
            self.starting -= 1
        elif replica.state is S.STANDBY:
            self.standby -= 1
        elif replica.state is S.RUNNING:
            self.running -= 1
            if replica.routable:
                self.routable -= 1
        replica.move(S.DRAINING)
        replica.routable = False
        self._at(now + self.spec.drain_s, _STOPPED, replica.replica_id)

    # -- cost ------------------------------------------------------------------------------

    def replica_seconds(self, start: float, end: float) -> float:
        """Seconds of alive replicas within [start, end]."""
        total = 0.0
        for replica in (*self.retired, *self.replicas.values()):
            stop = replica.stopped_at if replica.stopped_at is not None else end
            total += max(0.0, min(stop, end) - max(replica.created_at, start))
        return total
