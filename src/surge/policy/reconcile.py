"""Desired vs observed replicas of one deployment → actions.

A deployment wants `target` RUNNING replicas plus `standby` STANDBY ones (started and
initialised, out of the route tables). Scale-up activates standbys first (they take
traffic at once) and starts replacements. Rolling updates keep capacity: replicas of
an old version stop only as replicas of the new version become RUNNING. Scale-down
stops STARTING replicas before STANDBY before RUNNING ones, newest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from surge.policy.lifecycle import ReplicaState

__all__ = ["ActivateReplica", "ObservedReplica", "StartReplicas", "StopReplica", "reconcile"]


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


Action = StartReplicas | StopReplica | ActivateReplica
_LIVE = (ReplicaState.STARTING, ReplicaState.STANDBY, ReplicaState.RUNNING)


def reconcile(target: int, version: int, replicas: Sequence[ObservedReplica],
              standby: int = 0) -> list[Action]:
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
    if len(current) < wanted:
        actions.append(StartReplicas(wanted - len(current), f"{len(current)} of {wanted} live"))
    elif len(current) > wanted:
        activated = {r.replica_id for r in activate}
        excess = sorted(current, key=lambda r: _stop_order(r, activated))
        excess = excess[: len(current) - wanted]
        actions += [StopReplica(r.replica_id, f"scale down to {target}") for r in excess]
        running_now -= sum(1 for r in excess
                           if r.state is ReplicaState.RUNNING or r.replica_id in activated)
    surplus = running_now + len(old_running) - target
    if old_running and (surplus > 0 or running_now >= target):
        count = len(old_running) if running_now >= target else min(surplus, len(old_running))
        actions += [StopReplica(r.replica_id, "replaced by new version")
                    for r in sorted(old_running, key=lambda r: r.started_at)[:count]]
    return actions


def _stop_order(replica: ObservedReplica, activated: set[str]) -> tuple[int, float]:
    # STARTING first, then STANDBY, then RUNNING; the most recently started first.
    rank = {ReplicaState.STARTING: 0, ReplicaState.STANDBY: 1}.get(replica.state, 2)
    if replica.replica_id in activated:
        rank = 2
    return (rank, -replica.started_at)
