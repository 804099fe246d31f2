"""Indexes the control loop keeps as replicas change, so a tick costs what changed.

`ReplicaGroup` holds one deployment's replicas (by id and by state) and counts them by
(state, version); it is told of every change (ControllerState.add_replica /
remove_replica, ReplicaRecord.move) and marks itself `dirty`, so the plan reconciles a
deployment only when one of its replicas changed or its own inputs did
(`reconcile_inputs`). It also counts the live replicas per reported node and those whose
node nobody knows yet, for proxy placement.

`HealthSchedule` keeps the replicas whose health checks are scheduled, in the order
they come due (a sorted list: inserts are a memmove, due ones a slice), so the plan
reads only those due instead of every replica.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING

from surge.model import DeploymentId
from surge.policy.lifecycle import ALIVE, ReplicaState

if TYPE_CHECKING:
    from surge.controller.state import ReplicaRecord

__all__ = ["SERVING", "Changes", "HealthSchedule", "ReplicaGroup"]

SERVING = frozenset({ReplicaState.RUNNING, ReplicaState.STANDBY})  # health-checked


class Changes:
    """Counts every replica that appeared, left or moved, in any group (the checkpoint
    is rewritten only when it moved on)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __repr__(self) -> str:
        return f"<Changes {self.count}>"


class HealthSchedule:
    """Replica id -> when its next health check is due, ordered by that time."""

    def __init__(self) -> None:
        self._due: list[tuple[float, str]] = []
        self._at: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<HealthSchedule {len(self._at)} replicas>"

    def __len__(self) -> int:
        return len(self._at)

    def schedule(self, replica: ReplicaRecord, at: float) -> None:
        """Its next check is due at `at` (replacing any earlier schedule)."""
        self.unschedule(replica.replica_id)
        replica.next_health_check = at
        self._at[replica.replica_id] = at
        bisect.insort(self._due, (at, replica.replica_id))

    def unschedule(self, replica_id: str) -> None:
        at = self._at.pop(replica_id, None)
        if at is not None:
            index = bisect.bisect_left(self._due, (at, replica_id))
            del self._due[index]

    def due(self, now: float) -> list[str]:
        """Ids whose check is due at `now`, the longest due first (nothing changes)."""
        end = bisect.bisect_right(self._due, (now, "\U0010ffff"))
        return [replica_id for _, replica_id in self._due[:end]]

    def at(self, replica_id: str) -> float | None:
        return self._at.get(replica_id)


class ReplicaGroup:
    """One deployment's replicas, indexed as they change."""

    def __init__(self, deployment: DeploymentId, health: HealthSchedule,
                 changes: Changes | None = None) -> None:
        self.deployment = deployment
        self.health = health
        self.changes = changes or Changes()
        self.members: dict[str, ReplicaRecord] = {}
        self.by_state: dict[ReplicaState, dict[str, ReplicaRecord]] = {s: {} for s in
                                                                        ReplicaState}
        self.counts: dict[tuple[ReplicaState, int], int] = {}
        self.nodes: dict[str, int] = {}  # live replicas per node they reported
        self.unplaced = 0  # live, past STARTING, and no node reported
        self.reconfiguring: set[str] = set()  # ids a new user_config is on its way to
        self._counted: dict[str, str] = {}  # replica id -> its node counted ("": unplaced)
        self.dirty = True  # reconcile it at the next plan
        self.reconciled_inputs: tuple[object, ...] | None = None  # as last reconciled

    def __repr__(self) -> str:
        counts = {s.value: len(m) for s, m in self.by_state.items() if m}
        return f"<ReplicaGroup {self.deployment} {counts}{' dirty' if self.dirty else ''}>"

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[ReplicaRecord]:
        return iter(self.members.values())

    def count(self, state: ReplicaState, version: int | None = None) -> int:
        if version is None:
            return len(self.by_state[state])
        return self.counts.get((state, version), 0)

    def alive_outdated(self, version: int) -> int:
        """Live replicas of another version than `version`."""
        return sum(n for (state, v), n in self.counts.items() if v != version and state in ALIVE)

    def alive_reconfiguring(self) -> int:
        """Live replicas a new user_config is on its way to."""
        return sum(1 for replica_id in self.reconfiguring if self.members[replica_id].alive)

    # -- what ControllerState and ReplicaRecord tell it -----------------------------------

    def set_reconfiguring(self, replica: ReplicaRecord, on: bool) -> None:
        if on and replica.replica_id in self.members:
            self.reconfiguring.add(replica.replica_id)
        else:
            self.reconfiguring.discard(replica.replica_id)

    def add(self, replica: ReplicaRecord) -> None:
        self.members[replica.replica_id] = replica
        self._enter(replica, replica.state)
        if replica.state in SERVING and replica.next_health_check > 0:
            self.health.schedule(replica, replica.next_health_check)

    def remove(self, replica: ReplicaRecord) -> None:
        if self.members.pop(replica.replica_id, None) is not None:
            self._leave(replica, replica.state)
            self.health.unschedule(replica.replica_id)
            self.reconfiguring.discard(replica.replica_id)

    def moved(self, replica: ReplicaRecord, old: ReplicaState) -> None:
        self._leave(replica, old)
        self._enter(replica, replica.state)
        if replica.state not in SERVING:
            self.health.unschedule(replica.replica_id)

    def _enter(self, replica: ReplicaRecord, state: ReplicaState) -> None:
        self.by_state[state][replica.replica_id] = replica
        key = (state, replica.version)
        self.counts[key] = self.counts.get(key, 0) + 1
        self._node(replica, state, +1)
        self.dirty = True
        self.changes.count += 1

    def _leave(self, replica: ReplicaRecord, state: ReplicaState) -> None:
        self.by_state[state].pop(replica.replica_id, None)
        key = (state, replica.version)
        left = self.counts.get(key, 0) - 1
        if left > 0:
            self.counts[key] = left
        else:
            self.counts.pop(key, None)
        self._node(replica, state, -1)
        self.dirty = True

    def _node(self, replica: ReplicaRecord, state: ReplicaState, sign: int) -> None:
        """Count a live replica on its reported node, or as unplaced (undone on leave
        with what was counted on entry: its info may have arrived meanwhile)."""
        replica_id = replica.replica_id
        if sign < 0:
            node = self._counted.pop(replica_id, None)
        elif state not in ALIVE:
            return
        elif replica.info is not None:
            node = self._counted[replica_id] = replica.info.node_id
        elif state is not ReplicaState.STARTING:
            node = self._counted[replica_id] = ""
        else:
            return
        if node == "":
            self.unplaced += sign
        elif node is not None:
            self.nodes[node] = self.nodes.get(node, 0) + sign
            if not self.nodes[node]:
                del self.nodes[node]
