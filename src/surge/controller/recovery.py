"""Checkpoints, and a restarted controller taking over from the one that died.

The previous controller checkpointed desired state and live members
(controller/checkpoint.py). A restarted controller re-deploys the saved applications,
then for up to RECOVERY_TIMEOUT_S adopts the proxies and replicas that reconnect with
their address in `hello` (they kept serving meanwhile) while nothing is pushed, so
routers keep their last replica sets. Then members that never came back are killed,
autoscaled targets start from what was adopted, and the control loop reconciles as
usual.

`Recovery` decides and returns actions (controller/actions.py); it reads the
controller's state and never writes it. Its own fields are the members it still waits
for and the deadline.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from surge.config import AppSpec
from surge.controller.actions import (
    Action,
    AdoptReplica,
    DrainStranger,
    EndRecovery,
    KillProcess,
    ProxyReady,
)
from surge.controller.checkpoint import Checkpoint, Members, MembersText, SavedApp
from surge.controller.state import ControllerState, Peer
from surge.launch import LOCAL_NODE
from surge.model import DeploymentId, ReplicaInfo
from surge.policy.lifecycle import ALIVE
from surge.process import start_time

__all__ = ["RECOVERY_TIMEOUT_S", "Recovery"]

log = logging.getLogger("surge.controller")

# After a restart, how long to wait for the previous controller's members to re-register.
RECOVERY_TIMEOUT_S = 5.0
# While members keep coming and going (a herd starting), the members checkpoint is
# rewritten at most this often, and once more in the first tick without a change. A
# member missing from it re-attaches after a restart all the same; only the wait for
# it is shorter.
MEMBERS_SAVE_INTERVAL_S = 1.0


class Recovery:
    """The controller's checkpointing and, after a restart, its re-attachment phase.

    `deaths_visible_at_once` is the backend's: on one machine a member that died is seen
    gone at once (recovery need not wait for it); on a cluster only the deadline tells.
    """

    def __init__(self, checkpoint: Checkpoint, deaths_visible_at_once: bool = True) -> None:
        self.checkpoint = checkpoint
        self.deaths_visible_at_once = deaths_visible_at_once
        self.specs: dict[str, AppSpec] = {}  # as deployed, for the checkpoint
        self.expected: Members | None = None  # set while waiting for members to return
        self._started: dict[int, int] = {}  # pid -> start time, read once per member
        self._no_start: set[int] = set()  # pids with none to read (gone before saved)
        self._members = MembersText()
        self._saved: tuple[object, ...] | None = None  # what the last save was made of
        self._seen: tuple[object, ...] | None = None  # what the last call saw
        self._saved_at = float("-inf")
        self.deadline = 0.0
        self.done = asyncio.Event()
        self.done.set()

    def __repr__(self) -> str:
        waiting = "-" if self.expected is None else (
            f"{len(self.expected.replicas)} replicas, {len(self.expected.proxies)} proxies")
        return f"<Recovery {self.checkpoint!r} waiting={waiting}>"

    @property
    def active(self) -> bool:
        return self.expected is not None

    def start(self, now: float) -> list[SavedApp]:
        """After a restart: what the previous controller saved; from now until
        RECOVERY_TIMEOUT_S, wait for its members to return."""
        apps, members = self.checkpoint.load()
        self.expected = members
        self.deadline = now + RECOVERY_TIMEOUT_S
        self.done.clear()
        log.warning("restarted: restoring %d application(s); waiting up to %.0f s for %d "
                    "replica(s) and %d proxy worker(s) to re-attach", len(apps),
                    RECOVERY_TIMEOUT_S, len(members.replicas), len(members.proxies))
        return apps

    # -- members saying hello --------------------------------------------------------

    def adopt_proxy(self, state: ControllerState, proxy_id: str, pid: int, address: str,
                    node_id: str) -> list[Action]:
        if proxy_id in state.proxies:
            return []
        if self.expected is not None:
            self.expected.proxies.pop(proxy_id, None)
        return [ProxyReady(proxy_id, pid, address, node_id, reattached=True)]

    def adopt_replica(self, state: ControllerState, peer: Peer, pid: int,
                      info: dict[str, Any]) -> list[Action]:
        replica_id = info["replica_id"]
        did = DeploymentId(info["app"], info["deployment"])
        if replica_id in state.replicas:
            return []
        if self.expected is not None:
            self.expected.replicas.pop(replica_id, None)
        deployment = state.deployments.get(did)
        if deployment is None or deployment.deleting:
            return [DrainStranger(replica_id, pid, peer, f"replica {replica_id} of {did} "
                                                         "re-attached but its deployment is gone")]
        where = ReplicaInfo(replica_id, did, info["address"], pid,
                            info.get("node_id", LOCAL_NODE), info.get("local_address", ""))
        gpus = tuple(g for g in str(info.get("gpus", "")).split(",") if g)
        # Its rank stays its own: a replica started later must not be given it too.
        return [AdoptReplica(where, int(info["version"]), peer, gpus,
                             bool(info.get("own_health_check", True)),
                             int(info.get("rank", -1)))]

    # -- the end -----------------------------------------------------------------------

    def due(self, state: ControllerState, now: float) -> list[Action]:
        """Nothing while members may still come back; then the end of recovery."""
        expected = self.expected
        if expected is None:
            return []

        def alive(pid: int) -> bool:
            return not self.deaths_visible_at_once or expected.is_member(pid)

        replicas = {r: int(m["pid"]) for r, m in expected.replicas.items()
                    if alive(int(m["pid"]))}
        proxies = {p: pid for p, pid in expected.proxies.items() if alive(pid)}
        if (replicas or proxies) and now < self.deadline and not state.stopping:
            return []
        self.expected = None
        self.done.set()
        actions: list[Action] = [
            KillProcess(process_id, "did not re-attach after the controller restarted", pid)
            for process_id, pid in {**replicas, **proxies}.items()]
        targets = []
        for did, deployment in state.deployments.items():
            scaling = deployment.config.autoscaling_config
            adopted = state.count_running_current(did)
            if scaling is not None and adopted:
                targets.append((did, min(max(adopted, scaling.min_replicas),
                                         scaling.max_replicas)))
        log.warning("recovery done: %d replica(s) and %d proxy worker(s) re-attached",
                    len(state.replicas), len(state.proxies))
        return [*actions, EndRecovery(tuple(targets))]

    # -- the checkpoint ----------------------------------------------------------------

    def deployed(self, state: ControllerState, app: AppSpec) -> None:
        self.specs[app.name] = app
        self.save_apps(state)

    def deleted(self, state: ControllerState, app: str) -> None:
        if self.specs.pop(app, None) is not None:
            self.save_apps(state)

    def save_apps(self, state: ControllerState) -> None:
        saved = [SavedApp(spec, {d.name: state.deployments[d].version
                                 for d in state.apps[name].ids() if d in state.deployments})
                 for name, spec in self.specs.items() if name in state.apps]
        try:
            self.checkpoint.save_apps(saved)
        except Exception as exc:  # never fail a deploy for it; a restart would lose the app
            log.error("cannot save the checkpoint: %s", exc)

    def save_members(self, state: ControllerState, now: float) -> None:
        """Checkpoint the ready members if any came, went or moved since the last save:
        in the first tick without a change, or MEMBERS_SAVE_INTERVAL_S after the last."""
        proxies = {p.proxy_id: p.pid for p in state.proxies.values()}
        revision = (state.changes.count, tuple(proxies.items()))
        quiet, self._seen = revision == self._seen, revision
        if revision == self._saved or self.checkpoint.directory is None or (
                not quiet and now - self._saved_at < MEMBERS_SAVE_INTERVAL_S):
            return
        alive = [(r.replica_id, r.pid, did.app, did.name)
                 for did, group in state.groups.items() for live in ALIVE
                 for r in group.by_state[live].values() if r.info is not None]
        pids = [pid for _, pid, _, _ in alive] + list(proxies.values())
        started, missing = {}, set()
        for pid in pids:
            known = self._started.get(pid)
            if known is None and pid not in self._no_start:
                known = start_time(pid)
            if known is None:
                missing.add(pid)
            else:
                started[pid] = known
        self._started, self._no_start = started, missing
        try:
            self.checkpoint.save_members_text(
                self._members.render(alive, proxies, self._started))
        except OSError as exc:
            log.error("cannot save the checkpoint: %s", exc)
            return
        self._saved, self._saved_at = revision, now
