"""The executor: performs the plan's actions through the backend and the members' links.

It is the only code that starts, signals and adopts processes, and that calls replicas
(drain, health check, reconfigure). Each action also updates the state it concerns
(a started replica gets its record, a drained one its deadline) and re-publishes the
replica set when the routable replicas changed. Calls to members run as tasks
(`spawn`); their outcome lands in the state (health failures), where the next plan sees it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from surge.backends.base import Backend, PlacementError, ProxyLaunch, ReplicaLaunch
from surge.clock import Clock
from surge.controller.actions import (
    Action,
    ActivateReplica,
    AdoptReplica,
    CheckHealth,
    DrainStranger,
    EndRecovery,
    FailReplica,
    ForgetDeployment,
    KillProcess,
    ProxyExited,
    ProxyReady,
    Reconfigure,
    ReplicaExited,
    StartProxy,
    StartReplicas,
    StopProxy,
    StopReplica,
)
from surge.controller.plan import MAX_CONNECTING, NODE_PROXY_PREFIX
from surge.controller.publish import Publisher
from surge.controller.state import (
    HEALTH_CHECK_FAILURE_THRESHOLD,
    HEALTH_FAILED_MESSAGE,
    ControllerState,
    NodeProxy,
    ProxyRecord,
    ReplicaRecord,
)
from surge.model import DeploymentId
from surge.policy.cadence import heard_lately
from surge.policy.lifecycle import ReplicaState

__all__ = ["DRAIN_GRACE_S", "Executor"]

log = logging.getLogger("surge.controller")

# A draining replica is killed this long after its graceful_shutdown_timeout_s.
DRAIN_GRACE_S = 2.0
# A member that re-attached for a deployment that is gone gets this long to finish.
STRANGER_DRAIN_S = 30.0
# A proxy that exits unasked is restarted after 0.2 s, 0.4 s, ... at most 10 s apart
# (one that cannot bind its port must not be restarted in a tight loop).
PROXY_BACKOFF_S = 0.2
PROXY_BACKOFF_MAX_S = 10.0


class Executor:
    def __init__(self, state: ControllerState, backend: Backend, publisher: Publisher,
                 clock: Clock, *, spawn: Callable[[Coroutine[Any, Any, Any]], None],
                 new_replica_id: Callable[[str], str],
                 forgotten: Callable[[DeploymentId, str | None], None]) -> None:
        self.state = state
        self.backend = backend
        self.publisher = publisher
        self.clock = clock
        self.spawn = spawn
        self.new_replica_id = new_replica_id
        self.forgotten = forgotten  # (deployment, the app removed with it, if any)
        self._handlers: dict[type, Callable[[Any], None]] = {
            StartReplicas: self._start_replicas, ActivateReplica: self._activate,
            StopReplica: self._stop, FailReplica: self._fail, KillProcess: self._kill,
            CheckHealth: self._check_health, ReplicaExited: self._replica_exited,
            ProxyExited: self._proxy_exited, StartProxy: self._start_proxy,
            StopProxy: self._stop_proxy, Reconfigure: self._reconfigure,
            ForgetDeployment: self._forget, AdoptReplica: self._adopt_replica,
            ProxyReady: self._proxy_ready, DrainStranger: self._drain_stranger,
            EndRecovery: self._end_recovery,
        }

    def __repr__(self) -> str:
        return f"<Executor backend={self.backend.name}>"

    def apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            try:
                self._handlers[type(action)](action)
            except Exception:  # one action that fails must not cost the others
                log.exception("cannot %s", action)

    # -- replicas ----------------------------------------------------------------------

    def _start_replicas(self, action: StartReplicas) -> None:
        record = self.state.deployments[action.deployment]
        now = self.clock.monotonic()
        if action.deferred and action.count:
            log.info("%s: starting %d replicas now, %d more once these are in (at most %d "
                     "on their way in at once)", record.id, action.count, action.deferred,
                     MAX_CONNECTING)
        for _ in range(action.count):
            replica_id = self.new_replica_id(record.id.name)
            launch = ReplicaLaunch(replica_id, record.id, record.config.resources,
                                   record.sys_path)
            try:
                pid = self.backend.start_replica(launch)
            except PlacementError as exc:
                if record.last_error != f"waiting for resources: {exc}":
                    record.last_error = f"waiting for resources: {exc}"
                    log.warning("%s: %s", record.id, record.last_error)
                return
            self.state.add_replica(ReplicaRecord(replica_id, record.id, record.version, now,
                                                 pid=pid))

    def _activate(self, action: ActivateReplica) -> None:
        replica = self.state.replicas[action.replica_id]
        replica.move(ReplicaState.RUNNING)
        log.info("activated standby replica %s of %s (%s)", replica.replica_id,
                 replica.deployment, action.reason)
        self.publisher.replica_set(replica.deployment)

    def _stop(self, action: StopReplica) -> None:
        replica = self.state.replicas.get(action.replica_id)
        if replica is None or not replica.alive or replica.state is ReplicaState.DRAINING:
            return
        log.info("stopping replica %s (%s)", replica.replica_id, action.reason)
        was_running = replica.state is ReplicaState.RUNNING
        replica.move(ReplicaState.DRAINING)
        timeout = self.state.deployments[replica.deployment].config.graceful_shutdown_timeout_s
        replica.stop_deadline = self.clock.monotonic() + timeout + DRAIN_GRACE_S
        if was_running:
            self.publisher.replica_set(replica.deployment)
        if replica.peer is not None and not replica.peer.is_closed:
            self.spawn(self._drain(replica, timeout))
        else:
            self.backend.terminate(replica.replica_id)

    async def _drain(self, replica: ReplicaRecord, timeout: float) -> None:
        assert replica.peer is not None
        try:
            await replica.peer.call("drain", timeout=timeout + 1.0, timeout_s=timeout)
        except Exception:
            self.backend.terminate(replica.replica_id)

    def _fail(self, action: FailReplica) -> None:
        replica = self.state.replicas.get(action.replica_id)
        if replica is None:
            return
        if replica.alive:
            was_running = replica.state is ReplicaState.RUNNING
            replica.move(ReplicaState.FAILED)
            log.warning("replica %s failed: %s", replica.replica_id, action.reason)
            record = self.state.deployments.get(replica.deployment)
            if (action.health and was_running and record is not None
                    and replica.version == record.version):
                record.health_failed = HEALTH_FAILED_MESSAGE
            if was_running:
                self.publisher.replica_set(replica.deployment)
        self.backend.kill(replica.replica_id)

    def _kill(self, action: KillProcess) -> None:
        if action.pid:
            self.backend.adopt(action.process_id, action.pid)
        self.backend.kill(action.process_id)

    def _check_health(self, action: CheckHealth) -> None:
        replica = self.state.replicas[action.replica_id]
        config = self.state.deployments[replica.deployment].config
        now = self.clock.monotonic()
        self.state.health.schedule(replica, now + config.health_check_period_s)
        if not replica.own_health_check and heard_lately(
                replica.heard_at, now, config.health_check_period_s,
                self.publisher.telemetry_interval_s):
            replica.health_failures = 0  # its telemetry proves what a call would
            return
        replica.health_check_running = True
        self.spawn(self._health_check(replica, config.health_check_timeout_s))

    async def _health_check(self, replica: ReplicaRecord, timeout_s: float) -> None:
        assert replica.peer is not None
        try:
            await replica.peer.call("check_health", timeout=timeout_s)
            replica.health_failures = 0
        except Exception as exc:
            replica.health_failures += 1
            log.warning("health check %d of replica %s failed: %r", replica.health_failures,
                        replica.replica_id, exc)
            if replica.health_failures >= HEALTH_CHECK_FAILURE_THRESHOLD:  # at once, as the
                self._fail(FailReplica(replica.replica_id, "failed its health checks",  # plan
                                       health=True))
        finally:
            replica.health_check_running = False

    def _reconfigure(self, action: Reconfigure) -> None:
        replica = self.state.replicas.get(action.replica_id)
        if replica is not None and replica.peer is not None:
            replica.set_reconfiguring(True)  # the deployment reads UPDATING until it has it
            self.spawn(self._send_config(replica, action.user_config))

    async def _send_config(self, replica: ReplicaRecord, user_config: Any) -> None:
        assert replica.peer is not None
        try:
            await replica.peer.call("reconfigure", user_config=user_config)
        except Exception as exc:
            log.error("reconfigure of replica %s failed: %s; replacing it",
                      replica.replica_id, exc)
            self._fail(FailReplica(replica.replica_id, f"reconfigure failed: {exc}"))
        finally:
            replica.set_reconfiguring(False)

    def _replica_exited(self, action: ReplicaExited) -> None:
        replica = self.state.remove_replica(action.replica_id)
        if replica is None:
            return
        record = self.state.deployments.get(replica.deployment)
        if action.before_ready and not replica.spec_sent:
            # It never got as far as the user's code (it could not reach this controller in
            # time, as in a herd): not a failed start, so neither counted nor backed off.
            log.warning("replica %s of %s exited (code %s) before it reached the controller; "
                        "starting another", replica.replica_id, replica.deployment,
                        action.returncode)
        elif action.before_ready and record is not None and replica.version == record.version:
            self.state.start_failed(record, record.last_error or (
                f"replica process exited with code {action.returncode} before it was ready"),
                self.clock.monotonic())
        elif replica.state is ReplicaState.RUNNING:
            log.warning("replica %s of %s died (exit code %s); replacing it",
                        replica.replica_id, replica.deployment, action.returncode)
        self.publisher.replica_set(replica.deployment)

    def _forget(self, action: ForgetDeployment) -> None:
        did = action.deployment
        self.state.forget_deployment(did)
        self.publisher.forget(did)
        app = self.state.apps.get(did.app)
        removed = None
        if app is not None and did.name in app.deployments:
            app.deployments = tuple(n for n in app.deployments if n != did.name)
            if not app.deployments:
                del self.state.apps[did.app]
                removed = did.app
        self.forgotten(did, removed)

    # -- proxies -----------------------------------------------------------------------

    def _start_proxy(self, action: StartProxy) -> None:
        log.info("starting %s (%s)", action.proxy_id, action.reason)
        self.backend.start_proxy(ProxyLaunch(action.proxy_id, action.node_id, action.port))
        if action.proxy_id.startswith(NODE_PROXY_PREFIX):
            self.state.node_proxies[action.proxy_id] = NodeProxy(action.node_id,
                                                                 action.node_ip, action.port)

    def _stop_proxy(self, action: StopProxy) -> None:
        log.info("stopping %s (%s)", action.proxy_id, action.reason)
        self.state.stopping_proxies.add(action.proxy_id)
        self.backend.terminate(action.proxy_id)

    def _proxy_exited(self, action: ProxyExited) -> None:
        # The address stays: a restarted worker binds the same port again.
        state = self.state
        state.proxies.pop(action.proxy_id, None)
        state.node_proxies.pop(action.proxy_id, None)
        stopped = action.proxy_id in state.stopping_proxies
        state.stopping_proxies.discard(action.proxy_id)
        if stopped or state.stopping:
            return
        exits = state.proxy_backoff.get(action.proxy_id, (0, 0.0))[0] + 1
        delay = min(PROXY_BACKOFF_MAX_S, PROXY_BACKOFF_S * 2 ** (exits - 1))
        state.proxy_backoff[action.proxy_id] = (exits, self.clock.monotonic() + delay)
        log.warning("%s exited with code %s; restarting it in %.1fs", action.proxy_id,
                    action.returncode, delay)

    # -- after a controller restart -------------------------------------------------------

    def _adopt_replica(self, action: AdoptReplica) -> None:
        info, now = action.info, self.clock.monotonic()
        record = self.state.deployments[info.deployment]
        record.version_ran = record.version_ran or action.version == record.version
        self.state.add_replica(ReplicaRecord(
            info.replica_id, info.deployment, action.version, now, state=ReplicaState.RUNNING,
            pid=info.pid, info=info, peer=action.peer,
            next_health_check=now + record.config.health_check_period_s,
            own_health_check=action.own_health_check, rank=action.rank))
        self.backend.adopt(info.replica_id, info.pid, list(action.gpus),
                           record.config.resources.num_gpus, record.config.resources)
        log.info("re-attached replica %s of %s (pid %d)", info.replica_id, info.deployment,
                 info.pid)
        self.publisher.replica_set(info.deployment)

    def _proxy_ready(self, action: ProxyReady) -> None:
        state = self.state
        self.backend.adopt(action.proxy_id, action.pid)  # a no-op for the ones it started
        state.proxies[action.proxy_id] = ProxyRecord(action.proxy_id, action.pid,
                                                     action.address)
        state.proxy_backoff.pop(action.proxy_id, None)
        if not action.proxy_id.startswith(NODE_PROXY_PREFIX):
            state.proxy_address = state.proxy_address or action.address  # the head's port
        elif action.proxy_id not in state.node_proxies:  # re-attached after a restart
            host, _, port = action.address.rpartition(":")
            state.node_proxies[action.proxy_id] = NodeProxy(action.node_id, host, int(port))
        log.info("%s %s (pid %d) at %s", "re-attached" if action.reattached else "serving:",
                 action.proxy_id, action.pid, action.address)

    def _drain_stranger(self, action: DrainStranger) -> None:
        log.warning("%s; draining it", action.reason)
        self.backend.adopt(action.replica_id, action.pid)  # so that it can be killed
        self.spawn(self._drain_and_kill(action))

    async def _drain_and_kill(self, action: DrainStranger) -> None:
        try:
            await action.peer.call("drain", timeout=STRANGER_DRAIN_S + 5.0,
                                   timeout_s=STRANGER_DRAIN_S)
        except Exception as exc:
            log.warning("replica %s did not drain (%r); killing it", action.replica_id, exc)
            self.backend.kill(action.replica_id)

    def _end_recovery(self, action: EndRecovery) -> None:
        for did, target in action.targets:
            self.state.deployments[did].target = target
        self.publisher.paused = False
        self.publisher.replica_sets(force=True)
