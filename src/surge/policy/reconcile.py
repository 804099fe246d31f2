"""Desired vs observed replicas of one deployment → actions.

A deployment wants `target` RUNNING replicas plus `standby` STANDBY ones (started and
initialised, out of the route tables). Scale-up activates standbys first (they take
traffic at once) and starts replacements. Rolling updates keep capacity: replicas of
an old version stop only as replicas of the new version become RUNNING. By default every
replacement starts at once; a `Rollout` (Ray's rolling_update_percentage and
max_surge_percent) bounds how many new ones start at a time and how many live replicas
may exceed the target, and when there is no room it stops old replicas first (so with
max_surge_percent=0, as Ray does, capacity dips by a batch). Scale-down stops STARTING
replicas before STANDBY before RUNNING ones, newest first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from surge.policy.lifecycle import ReplicaState

__all__ = ["ActivateReplica", "ObservedReplica", "ReplicaView", "Rollout", "StartReplicas",
           "StopReplica", "reconcile"]


class ReplicaView(Protocol):
    """What reconcile reads of a replica (ObservedReplica, or the controller's own
    records, passed as they are: no copy per replica per call)."""

    @property
    def replica_id(self) -> str: ...

    @property
    def state(self) -> ReplicaState: ...

    @property
    def version(self) -> int: ...

    @property
    def started_at(self) -> float: ...


@dataclass(frozen=True)
class ObservedReplica:
    replica_id: str
    state: ReplicaState
    version: int
    started_at: float


@dataclass(frozen=True)
class StartReplicas:
    count: int
    reason: str


@dataclass(frozen=True)
class StopReplica:
    replica_id: str
    reason: str


@dataclass(frozen=True)
class ActivateReplica:
    """Move a STANDBY replica into the route tables."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Rollout:
    """Bounds on replacing replicas of an old version, as replica counts (None: none)."""

    batch: int | None = None  # new replicas not yet running at one time
    surge: int | None = None  # live replicas allowed above the target

    @classmethod
    def of(cls, target: int, rolling_update_percentage: float | None,
           max_surge_percent: int | None) -> Rollout:
        """Ray's percentages for a deployment of `target` replicas (rounded up)."""
        batch = None if rolling_update_percentage is None else max(
            1, math.ceil(target * rolling_update_percentage - 1e-9))
        surge = None if max_surge_percent is None else math.ceil(
            target * max_surge_percent / 100 - 1e-9)
        return cls(batch, surge)


Action = StartReplicas | StopReplica | ActivateReplica
_LIVE = (ReplicaState.STARTING, ReplicaState.STANDBY, ReplicaState.RUNNING)


def reconcile(target: int, version: int, replicas: Sequence[ReplicaView],
              standby: int = 0, rollout: Rollout = Rollout()) -> list[Action]:
    live = [r for r in replicas if r.state in _LIVE]
    current = [r for r in live if r.version == version]
    old = [r for r in live if r.version != version]
    actions: list[Action] = [StopReplica(r.replica_id, "outdated version, not yet serving")
                             for r in old if r.state is not ReplicaState.RUNNING]
    old_running = [r for r in old if r.state is ReplicaState.RUNNING]
    running_now = sum(1 for r in current if r.state is ReplicaState.RUNNING)
    spare = sorted((r for r in current if r.state is ReplicaState.STANDBY),
                   key=lambda r: r.started_at)
    activate = spare[: max(0, target - running_now)]
    actions += [ActivateReplica(r.replica_id, f"{running_now} of {target} running")
                for r in activate]
    running_now += len(activate)
    wanted = target + standby
    starts = _starts(wanted - len(current), current, old_running, target, rollout)
    if starts > 0:
        actions.append(StartReplicas(starts, f"{len(current)} of {wanted} live"))
    elif len(current) > wanted:
        activated = {r.replica_id for r in activate}
        excess = sorted(current, key=lambda r: _stop_order(r, activated))
        excess = excess[: len(current) - wanted]
        actions += [StopReplica(r.replica_id, f"scale down to {target}") for r in excess]
        running_now -= sum(1 for r in excess
                           if r.state is ReplicaState.RUNNING or r.replica_id in activated)
    surplus = running_now + len(old_running) - target
    oldest = sorted(old_running, key=lambda r: r.started_at)
    if old_running and (surplus > 0 or running_now >= target):
        count = len(old_running) if running_now >= target else min(surplus, len(old_running))
        actions += [StopReplica(r.replica_id, "replaced by new version")
                    for r in oldest[:count]]
    elif old_running and starts <= 0 and len(current) < wanted and not _pending(current):
        # No room to start a replacement (max_surge_percent): old ones go first.
        count = min(len(old_running), rollout.batch or len(old_running))
        actions += [StopReplica(r.replica_id, "making room for the new version")
                    for r in oldest[:count]]
    return actions


def _pending(current: Sequence[ReplicaView]) -> list[ReplicaView]:
    return [r for r in current if r.state is not ReplicaState.RUNNING]


def _starts(missing: int, current: Sequence[ReplicaView],
            old_running: Sequence[ReplicaView], target: int, rollout: Rollout) -> int:
    """How many of the `missing` new-version replicas may start now."""
    if missing <= 0 or not old_running:  # not rolling: start what is missing
        return missing
    if rollout.batch is not None:
        missing = min(missing, rollout.batch - len(_pending(current)))
    if rollout.surge is not None:
        missing = min(missing, target + rollout.surge - len(current) - len(old_running))
    return missing


def _stop_order(replica: ReplicaView, activated: set[str]) -> tuple[int, float]:
    # STARTING first, then STANDBY, then RUNNING; the most recently started first.
    rank = {ReplicaState.STARTING: 0, ReplicaState.STANDBY: 1}.get(replica.state, 2)
    if replica.replica_id in activated:
        rank = 2
    return (rank, -replica.started_at)
