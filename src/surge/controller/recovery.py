"""Checkpoints, and a restarted controller taking over from the one that died.

The previous controller checkpointed desired state and live members
(controller/checkpoint.py). `recover` reloads them; for up to RECOVERY_TIMEOUT_S the
controller adopts the proxies and replicas that reconnect with their address in
`hello` (they kept serving meanwhile) and pushes no replica sets, so routers keep
their last ones. Then members that never came back are stopped, autoscaled targets
start from what was adopted, and the control loop reconciles as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from surge.config import AppSpec
from surge.controller.checkpoint import Checkpoint, Members, SavedApp
from surge.controller.state import ReplicaRecord
from surge.model import DeploymentId, ReplicaInfo
from surge.node import LOCAL_NODE
from surge.policy.lifecycle import ReplicaState
from surge.process import start_time
from surge.transport.rpc import RpcPeer

if TYPE_CHECKING:
    from surge.controller.controller import Controller

__all__ = ["RECOVERY_TIMEOUT_S", "Recovery"]

log = logging.getLogger("surge.controller")

# After a restart, how long to wait for the previous controller's members to re-register.
RECOVERY_TIMEOUT_S = 5.0


class Recovery:
    """The controller's checkpointing and, after a restart, its re-attachment phase."""

    def __init__(self, controller: Controller, checkpoint: Checkpoint) -> None:
        self.c = controller
        self.checkpoint = checkpoint
        self.specs: dict[str, AppSpec] = {}  # as deployed, for the checkpoint
        self.expected: Members | None = None  # set while waiting for members to return
        self._started: dict[int, int] = {}  # pid -> start time, read once per member
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

    def restore(self) -> None:
        """Reload what the previous controller saved and wait for its members to return."""
        c = self.c
        apps, members = self.checkpoint.load()
        for saved in apps:
            try:
                c.apply(saved.spec)
            except Exception as exc:
                log.error("cannot restore application %r: %r", saved.spec.name, exc)
                continue
            self.specs[saved.spec.name] = saved.spec
            for name, version in saved.versions.items():
                record = c.deployments.get(DeploymentId(saved.spec.name, name))
                if record is not None:
                    record.version = version
        self.expected = members
        self.deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        self.done.clear()
        log.warning("restarted: restored %d application(s); waiting up to %.0f s for %d "
                    "replica(s) and %d proxy worker(s) to re-attach", len(self.specs),
                    RECOVERY_TIMEOUT_S, len(members.replicas), len(members.proxies))
        self.maybe_finish(time.monotonic())

    def adopt_proxy(self, proxy_id: str, pid: int, address: str) -> None:
        c = self.c
        if proxy_id in c.proxy_workers:
            return
        c.backend.adopt(proxy_id, pid)
        c.proxy_workers[proxy_id] = pid
        c.proxy_addresses[proxy_id] = address
        c.proxy_address = c.proxy_address or address
        if self.expected is not None:
            self.expected.proxies.pop(proxy_id, None)
        log.info("re-attached %s (pid %d) at %s", proxy_id, pid, address)
        c.proxy_ready.set()

    def adopt_replica(self, peer: RpcPeer, pid: int, info: dict[str, Any]) -> None:
        c = self.c
        replica_id = info["replica_id"]
        did = DeploymentId(info["app"], info["deployment"])
        deployment = c.deployments.get(did)
        if replica_id in c.replicas:
            return
        if deployment is None or deployment.deleting:
            log.warning("replica %s of %s re-attached but its deployment is gone; draining it",
                        replica_id, did)
            c.spawn(peer.call("drain", timeout=35.0, timeout_s=30.0))
            return
        now = time.monotonic()
        record = ReplicaRecord(replica_id, did, int(info["version"]), now,
                               state=ReplicaState.RUNNING, pid=pid,
                               info=ReplicaInfo(replica_id, did, info["address"], pid,
                                                info.get("node_id", LOCAL_NODE),
                                                info.get("local_address", "")),
                               peer=peer,
                               next_health_check=now + deployment.config.health_check_period_s)
        deployment.replicas[replica_id] = record
        c.replicas[replica_id] = record
        gpus = [g for g in str(info.get("gpus", "")).split(",") if g]
        c.backend.adopt(replica_id, pid, gpus, deployment.config.resources.num_gpus)
        log.info("re-attached replica %s of %s (pid %d)", replica_id, did, pid)
        if self.expected is not None:
            self.expected.replicas.pop(replica_id, None)
            self.maybe_finish(now)
        else:
            c.push_replica_set(did)

    def maybe_finish(self, now: float) -> None:
        """End re-attachment once every live member is back, or at the deadline."""
        expected, c = self.expected, self.c
        if expected is None:
            return
        # Locally a member that died is visible at once; on a cluster wait for the deadline.
        def alive(pid: int) -> bool:
            return c.backend.name != "local" or expected.is_member(pid)

        replicas = {r: int(m["pid"]) for r, m in expected.replicas.items()
                    if alive(int(m["pid"]))}
        proxies = {p: pid for p, pid in expected.proxies.items() if alive(pid)}
        if (replicas or proxies) and now < self.deadline:
            return
        self.expected = None
        for process_id, pid in {**replicas, **proxies}.items():  # alive, never came back
            log.warning("%s (pid %d) did not re-attach; stopping it", process_id, pid)
            c.backend.adopt(process_id, pid)
            c.backend.kill(process_id)
        for deployment in c.deployments.values():
            scaling = deployment.config.autoscaling_config
            adopted = len(deployment.running_current)
            if scaling is not None and adopted:
                deployment.target = min(max(adopted, scaling.min_replicas),
                                        scaling.max_replicas)
            c.push_replica_set(deployment.id, force=True)
        log.warning("recovery done: %d replica(s) and %d proxy worker(s) re-attached",
                    len(c.replicas), len(c.proxy_workers))
        self.done.set()

    def deployed(self, app: AppSpec) -> None:
        self.specs[app.name] = app
        self.save_apps()

    def deleted(self, app: str) -> None:
        if self.specs.pop(app, None) is not None:
            self.save_apps()

    def save_apps(self) -> None:
        apps = self.c.apps
        saved = [SavedApp(spec, {d: r.version for d, r in apps[name].deployments.items()})
                 for name, spec in self.specs.items() if name in apps]
        try:
            self.checkpoint.save_apps(saved)
        except Exception as exc:  # never fail a deploy for it; a restart would lose the app
            log.error("cannot save the checkpoint: %s", exc)

    def save_members(self) -> None:
        c = self.c
        alive = [r for r in c.replicas.values() if r.info is not None and r.alive]
        replicas: dict[str, dict[str, Any]] = {
            r.replica_id: {"pid": r.pid, "app": r.deployment.app,
                           "deployment": r.deployment.name} for r in alive}
        pids = [r.pid for r in alive] + list(c.proxy_workers.values())
        known = {pid: self._started.get(pid) or start_time(pid) for pid in pids}
        self._started = {pid: t for pid, t in known.items() if t is not None}
        try:
            self.checkpoint.save_members(Members(replicas, dict(c.proxy_workers),
                                                 dict(self._started)))
        except OSError as exc:
            log.error("cannot save the checkpoint: %s", exc)
