"""Desired vs observed replicas of one deployment → actions.

Rolling updates keep capacity: replicas of an old version stop only as replicas of the
new version become RUNNING. Scale-down stops STARTING replicas before RUNNING ones
(they serve nothing yet), and newest before oldest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from surge.policy.lifecycle import ReplicaState

__all__ = ["ObservedReplica", "StartReplicas", "StopReplica", "reconcile"]


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


Action = StartReplicas | StopReplica
_LIVE = (ReplicaState.STARTING, ReplicaState.RUNNING)


def reconcile(target: int, version: int, replicas: Sequence[ObservedReplica]) -> list[Action]:
    live = [r for r in replicas if r.state in _LIVE]
    current = [r for r in live if r.version == version]
    old = [r for r in live if r.version != version]
    actions: list[Action] = [StopReplica(r.replica_id, "outdated version, not yet serving")
                             for r in old if r.state is ReplicaState.STARTING]
    old_running = [r for r in old if r.state is ReplicaState.RUNNING]
    if len(current) < target:
        actions.append(StartReplicas(target - len(current), f"{len(current)} of {target} live"))
    elif len(current) > target:
        excess = sorted(current, key=_stop_order)[: len(current) - target]
        actions += [StopReplica(r.replica_id, f"scale down to {target}") for r in excess]
    running_now = sum(1 for r in current if r.state is ReplicaState.RUNNING)
    surplus = running_now + len(old_running) - target
    if old_running and (surplus > 0 or running_now >= target):
        count = len(old_running) if running_now >= target else min(surplus, len(old_running))
        actions += [StopReplica(r.replica_id, "replaced by new version")
                    for r in sorted(old_running, key=lambda r: r.started_at)[:count]]
    return actions


def _stop_order(replica: ObservedReplica) -> tuple[int, float]:
    # STARTING first, then the most recently started.
    return (0 if replica.state is ReplicaState.STARTING else 1, -replica.started_at)
