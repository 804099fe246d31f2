"""Replica states and the one table of legal transitions.

    STARTING ──▶ STANDBY ──▶ RUNNING ──▶ DRAINING ──▶ STOPPED
        │           │           │            │
        └───────────┴───────────┴────────────┴──▶ FAILED

A replica leaves the route tables when it leaves RUNNING. Only a replica that holds
requests (RUNNING, or DRAINING what it holds) has a load: the reports of a STARTING or
STANDBY one, an idle engine by construction, count in no autoscaling signal.
"""

from __future__ import annotations

import enum

__all__ = ["LOADED", "TRANSITIONS", "IllegalTransition", "ReplicaState", "transition"]


class ReplicaState(enum.StrEnum):
    STARTING = "STARTING"
    STANDBY = "STANDBY"
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


S = ReplicaState
TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.STARTING: frozenset({S.STANDBY, S.RUNNING, S.DRAINING, S.STOPPED, S.FAILED}),
    S.STANDBY: frozenset({S.RUNNING, S.DRAINING, S.STOPPED, S.FAILED}),
    S.RUNNING: frozenset({S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.STOPPED, S.FAILED}),
    S.STOPPED: frozenset(),
    S.FAILED: frozenset(),
}
ROUTABLE = frozenset({S.RUNNING})
ALIVE = frozenset({S.STARTING, S.STANDBY, S.RUNNING, S.DRAINING})
# Whose engine reports are load: a standby's idle engine, counted, would dilute the
# per-replica load (policy/engine_load.py sizes from it) as if it served.
LOADED = frozenset({S.RUNNING, S.DRAINING})


class IllegalTransition(Exception):
    def __init__(self, current: ReplicaState, new: ReplicaState) -> None:
        super().__init__(f"replica cannot go from {current.value} to {new.value}")
        self.current = current
        self.new = new


def transition(current: ReplicaState, new: ReplicaState) -> ReplicaState:
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(current, new)
    return new
