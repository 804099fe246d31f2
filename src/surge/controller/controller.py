"""The controller: desired state in, replica processes and route pushes out.

It is never on the request path. Every 0.1 s it observes process exits, reconciles
each deployment (policy.reconcile), runs due health checks, and pushes changed replica
sets to the routers that watch them. Drivers, proxies and replicas talk to it over the
control connection (RPC methods `rpc_*`).

Restarts: it checkpoints desired state and live members (controller/checkpoint.py).
A restarted controller (`recover`) reloads them and, for up to RECOVERY_TIMEOUT_S,
adopts the proxies and replicas that reconnect with their address in `hello`, pushing
no replica sets meanwhile (routers keep their last ones); then it reconciles as usual.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

from surge.backends.base import Backend, PlacementError, ReplicaLaunch
from surge.config import AppSpec, HTTPOptions, default_proxy_workers
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.checkpoint import Checkpoint
from surge.controller.observer import Observer
from surge.controller.recovery import Recovery
from surge.controller.state import (
    HEALTH_CHECK_FAILURE_THRESHOLD,
    AppRecord,
    DeploymentRecord,
    ReplicaRecord,
)
from surge.errors import ConfigError
from surge.model import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentId,
    LoadReport,
    ProxySpec,
    ReplicaInfo,
    ReplicaSet,
    ReplicaSpec,
    RouteTable,
    RouteTarget,
    ServeStatus,
)
from surge.node import LOCAL_NODE
from surge.policy.admission import queue_share
from surge.policy.autoscaling import LoadSample
from surge.policy.lifecycle import ReplicaState
from surge.policy.reconcile import (
    ActivateReplica,
    ObservedReplica,
    StartReplicas,
    StopReplica,
    reconcile,
)
from surge.transport.rpc import RpcPeer

__all__ = ["Controller"]

log = logging.getLogger("surge.controller")

TICK_S = 0.1
# At most one out-of-tick decision per deployment in this interval.
URGENT_DECISION_INTERVAL_S = 0.02
PROXY_PREFIX = "proxy-"
# What routers tell callers of a deployment that failed to start (no user text: the
# traceback is for the operator, in status()).
UNAVAILABLE_FAILED = "its replicas failed to start; serve.status() shows the error"


def is_proxy(process_id: str) -> bool:
    return process_id.startswith(PROXY_PREFIX)


class Controller:
    def __init__(self, address: str, http: HTTPOptions, backend: Backend,
                 checkpoint: Checkpoint | None = None) -> None:
        self.address = address
        self.http = http
        self.backend = backend
        self.apps: dict[str, AppRecord] = {}
        self.deployments: dict[DeploymentId, DeploymentRecord] = {}
        self.replicas: dict[str, ReplicaRecord] = {}
        self.watchers: dict[DeploymentId, set[RpcPeer]] = {}
        self.proxies: set[RpcPeer] = set()
        self.pushed: dict[DeploymentId, tuple[Any, ...]] = {}
        self.proxy_address = ""  # host:port all proxy workers listen on
        self.proxy_error = ""
        self.proxy_ready = asyncio.Event()
        self.proxy_workers: dict[str, int] = {}  # proxy id -> pid, once ready
        self.proxy_addresses: dict[str, str] = {}  # proxy id -> host:port (one per node on ray)
        workers = http.proxy_workers
        self.proxy_count = workers if workers is not None else default_proxy_workers()
        self.changed = asyncio.Condition()
        self.stopping = False
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.load = LoadTracker(TICK_S)
        self.autoscaler = Autoscaler()
        self.observer = Observer(self)  # metrics and dashboard (controller/observer.py)
        self.recovery = Recovery(self, checkpoint or Checkpoint(None))

    def __repr__(self) -> str:
        return (f"<Controller {self.address} apps={len(self.apps)} "
                f"replicas={len(self.replicas)} proxy={self.proxy_address or '-'}>")

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- RpcHandler ------------------------------------------------------------------------

    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any:
        handler = getattr(self, f"rpc_{method}", None)
        if handler is None:
            raise ValueError(f"the controller has no method {method!r}")
        return await handler(peer, **kwargs)

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None:
        if topic == "telemetry":
            self.observer.telemetry(value)
        elif topic in ("load", "load_urgent"):
            for report in value:
                assert isinstance(report, LoadReport)
                self.load.report(id(peer), report)
            if topic == "load_urgent" and not self.stopping:
                for deployment in {report.deployment for report in value}:
                    self._decide_now(deployment)

    def on_disconnect(self, peer: RpcPeer) -> None:
        self.proxies.discard(peer)
        self.load.forget_source(id(peer))
        for deployment, watchers in self.watchers.items():
            if peer in watchers:
                watchers.discard(peer)
                self.push_replica_set(deployment, force=True)
        replica = self.replicas.get(peer.info.get("replica_id", ""))
        if replica is not None and replica.state is ReplicaState.RUNNING and not self.stopping:
            log.warning("replica %s closed its control connection; replacing it",
                        replica.replica_id)
            self._fail_replica(replica, "lost its control connection")

    # -- RPCs from drivers and the CLI -------------------------------------------------------

    async def rpc_hello(self, peer: RpcPeer, role: str, pid: int, **info: Any) -> dict[str, Any]:
        peer.info = {"role": role, "pid": pid, **info}
        if role == "proxy":
            self.proxies.add(peer)
            peer.push("routes", self._routes())
            if "address" in info:
                self.recovery.adopt_proxy(info.get("proxy_id", f"{PROXY_PREFIX}{pid}"), pid,
                                  info["address"])
        elif role == "replica" and "address" in info:
            self.recovery.adopt_replica(peer, pid, info)
        return {"controller_pid": os.getpid(), "http_address": self.proxy_address}

    async def rpc_watch(self, peer: RpcPeer, deployment: DeploymentId) -> None:
        self.watchers.setdefault(deployment, set()).add(peer)
        self.push_replica_set(deployment, force=True)

    async def rpc_deploy(self, peer: RpcPeer, app: AppSpec) -> None:
        if self.stopping:
            raise ConfigError("the instance is shutting down")
        await self.recovery.done.wait()
        self.apply(app)
        self.recovery.deployed(app)
        await self._notify()

    async def rpc_wait_app(self, peer: RpcPeer, name: str,
                           timeout_s: float | None = None) -> ApplicationStatusOverview | None:
        done = {ApplicationStatus.RUNNING, ApplicationStatus.DEPLOY_FAILED}

        def ready() -> bool:
            app = self.apps.get(name)
            return app is None or app.status().status in done

        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout_s)
            except TimeoutError:
                pass
        app = self.apps.get(name)
        return app.status() if app is not None else None

    async def rpc_delete(self, peer: RpcPeer, name: str, timeout_s: float = 30.0) -> bool:
        app = self.apps.get(name)
        if app is None:
            return False
        for deployment in app.deployments.values():
            deployment.deleting, deployment.target = True, 0
        app.route_prefix = None
        self.recovery.deleted(name)  # a restart during the drain must not bring it back
        self._push_routes()
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: name not in self.apps),
                                       timeout_s)
            except TimeoutError:
                return False
        return True

    async def rpc_status(self, peer: RpcPeer) -> ServeStatus:
        applications = {}
        for name, app in self.apps.items():
            overview = app.status()
            for dname, deployment in overview.deployments.items():
                deployment.rates.update(self.load.rates(DeploymentId(name, dname)))
            applications[name] = overview
        return ServeStatus(
            applications=applications,
            proxies={pid: "HEALTHY" for pid in self.proxy_workers} or {"local": "UNHEALTHY"},
            http_address=self.proxy_address, control_address=self.address,
            proxy_addresses=dict(self.proxy_addresses), dashboard_address=self.observer.url)

    async def rpc_ingress(self, peer: RpcPeer, app: str) -> str | None:
        record = self.apps.get(app)
        return record.ingress if record is not None else None

    async def rpc_has_deployment(self, peer: RpcPeer, deployment: DeploymentId) -> bool:
        return deployment in self.deployments

    async def rpc_replicas(self, peer: RpcPeer) -> list[dict[str, Any]]:
        return [{"replica_id": r.replica_id, "app": r.deployment.app,
                 "deployment": r.deployment.name, "state": r.state.value, "pid": r.pid,
                 "version": r.version} for r in self.replicas.values()]

    async def rpc_shutdown(self, peer: RpcPeer) -> None:
        self.spawn(self.shutdown())

    # -- RPCs from proxies and replicas ------------------------------------------------------

    async def rpc_proxy_spec(self, peer: RpcPeer) -> ProxySpec:
        h = self.http
        port = h.port
        if self.proxy_address:  # later workers join the port the first one bound
            port = int(self.proxy_address.rpartition(":")[2])
        return ProxySpec(host=h.host, port=port, request_timeout_s=h.request_timeout_s,
                         keep_alive_timeout_s=h.keep_alive_timeout_s,
                         max_body_bytes=h.max_body_bytes, root_path=h.root_path,
                         reuse_port=self.proxy_count > 1,
                         max_header_bytes=h.max_header_bytes,
                         request_header_timeout_s=h.request_header_timeout_s,
                         max_connections=h.max_connections,
                         request_body_timeout_s=h.request_body_timeout_s,
                         ssl_certfile=h.ssl_certfile,
                         ssl_keyfile=h.ssl_keyfile, ssl_ca_certs=h.ssl_ca_certs,
                         ssl_cert_reqs=str(h.ssl_cert_reqs))

    def start_proxies(self) -> None:
        """Start the first proxy worker (the others follow once it has bound the port),
        or, after a restart, the workers that did not come back."""
        if not self.proxy_address:
            self.backend.start_proxy(f"{PROXY_PREFIX}0")
            return
        alive = set(self.backend.alive())
        for index in range(self.proxy_count):
            proxy_id = f"{PROXY_PREFIX}{index}"
            if proxy_id not in self.proxy_workers and proxy_id not in alive:
                self.backend.start_proxy(proxy_id)

    async def rpc_proxy_ready(self, peer: RpcPeer, address: str, pid: int) -> None:
        first = not self.proxy_address
        self.proxy_address = self.proxy_address or address  # node proxies have their own
        proxy_id = peer.info.get("proxy_id", f"{PROXY_PREFIX}{pid}")
        if proxy_id not in self.backend.alive():  # started by a controller that died since
            self.backend.adopt(proxy_id, pid)
        self.proxy_workers[proxy_id] = pid
        self.proxy_addresses[proxy_id] = address
        if first:
            for index in range(1, self.proxy_count):
                self.backend.start_proxy(f"{PROXY_PREFIX}{index}")
        self.proxy_ready.set()

    async def rpc_proxy_failed(self, peer: RpcPeer, error: str) -> None:
        self.proxy_error = error
        self.proxy_ready.set()

    async def rpc_replica_spec(self, peer: RpcPeer, replica_id: str) -> ReplicaSpec:
        replica = self.replicas[replica_id]
        deployment = self.deployments[replica.deployment]
        spec, config = deployment.spec, deployment.config
        return ReplicaSpec(replica_id=replica_id, deployment=deployment.id,
                           version=replica.version, target_blob=spec.target_blob,
                           init_blob=spec.init_blob, user_config=config.user_config,
                           max_ongoing_requests=config.max_ongoing_requests,
                           graceful_shutdown_timeout_s=config.graceful_shutdown_timeout_s,
                           sys_path=deployment.sys_path)

    async def rpc_replica_ready(self, peer: RpcPeer, replica_id: str, address: str,
                                pid: int, node_id: str = LOCAL_NODE,
                                local_address: str = "") -> bool:
        """False: this controller does not want the replica (it was started by one that
        died since, or already stopped); the replica exits."""
        replica = self.replicas.get(replica_id)
        if replica is None or replica.state is not ReplicaState.STARTING:
            return False
        deployment = self.deployments[replica.deployment]
        replica.info = ReplicaInfo(replica_id, replica.deployment, address, pid, node_id,
                                   local_address)
        replica.pid = replica.pid or pid  # the ray backend learns it only now
        replica.peer = peer
        now = time.monotonic()
        standby = deployment.standby_wanted
        replica.move(ReplicaState.STANDBY if len(deployment.running_current) >= deployment.target
                     and standby
                     else ReplicaState.RUNNING)
        replica.next_health_check = now + deployment.config.health_check_period_s
        deployment.constructor_failures = 0
        deployment.observe_startup(now - replica.started_at)
        log.info("replica %s of %s is %s (pid %d, started in %.2fs)", replica_id,
                 deployment.id, replica.state.value.lower(), pid, now - replica.started_at)
        self.push_replica_set(deployment.id)
        await self._notify()
        return True

    async def rpc_replica_failed(self, peer: RpcPeer, replica_id: str, error: str) -> None:
        replica = self.replicas.get(replica_id)
        if replica is None:
            return
        deployment = self.deployments.get(replica.deployment)
        if deployment is not None and replica.version == deployment.version:
            deployment.constructor_failures += 1
            deployment.last_error = error
        if replica.alive:
            replica.move(ReplicaState.FAILED)
        await self._notify()

    # -- desired state ---------------------------------------------------------------------

    def apply(self, app: AppSpec) -> None:
        for other in self.apps.values():
            if (other.name != app.name and app.route_prefix is not None
                    and other.route_prefix == app.route_prefix):
                raise ConfigError(f"route_prefix {app.route_prefix!r} is already used by "
                                  f"application {other.name!r}; choose another route_prefix")
        for spec in app.deployments:  # a bad policy fails the deploy, not the control loop
            scaling = spec.config.autoscaling_config
            if scaling is not None:
                try:
                    self.autoscaler.prepare(DeploymentId(app.name, spec.config.name), scaling)
                except ConfigError as exc:
                    raise ConfigError(f"deployment {spec.config.name!r}: {exc}") from None
                except Exception as exc:
                    raise ConfigError(f"deployment {spec.config.name!r}: the autoscaling "
                                      f"policy cannot be built: {exc!r}") from None
        previous = self.apps.get(app.name)
        records: dict[str, DeploymentRecord] = {}
        for spec in app.deployments:
            did = DeploymentId(app.name, spec.config.name)
            record = self.deployments.get(did)
            target = spec.config.initial_replicas
            scaling = spec.config.autoscaling_config
            if record is not None and scaling is not None and not record.deleting:
                target = min(max(record.target, scaling.min_replicas), scaling.max_replicas)
            if record is None:
                record = DeploymentRecord(did, spec, 1, spec.code_version, target, app.sys_path)
            else:
                self._update(record, spec, target, app.sys_path)
            self.deployments[did] = record
            records[spec.config.name] = record
        if previous is not None:
            for name, old in previous.deployments.items():
                if name not in records:
                    old.deleting, old.target = True, 0
        self.apps[app.name] = AppRecord(app.name, app.route_prefix, app.ingress, records,
                                        time.time(), auth=app.auth)
        self._push_routes()
        for record in records.values():
            self.push_replica_set(record.id, force=True)

    def _update(self, record: DeploymentRecord, spec: Any, target: int,
                sys_path: tuple[str, ...]) -> None:
        old_config = record.config
        if record.code_version != spec.code_version:
            record.version += 1
            record.code_version = spec.code_version
        elif old_config.user_config != spec.config.user_config:
            for replica in record.running:
                self.spawn(self._reconfigure(replica, spec.config.user_config))
        record.spec, record.target, record.sys_path = spec, target, sys_path
        record.constructor_failures, record.last_error, record.deleting = 0, "", False

    async def _reconfigure(self, replica: ReplicaRecord, user_config: Any) -> None:
        if replica.peer is None:
            return
        try:
            await replica.peer.call("reconfigure", user_config=user_config)
        except Exception as exc:
            log.error("reconfigure of replica %s failed: %s; replacing it",
                      replica.replica_id, exc)
            self._fail_replica(replica, f"reconfigure failed: {exc}")

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        while not self.stopping:
            try:
                self.tick(time.monotonic())
            except Exception:
                log.exception("control loop step failed")
            await self._notify()
            await asyncio.sleep(TICK_S)

    def tick(self, now: float) -> None:
        self._observe_exits()
        self.load.close_bucket(now, list(self.deployments))
        if self.recovery.active:  # re-attaching after a restart: change nothing yet
            self.recovery.maybe_finish(now)
            return
        for deployment in list(self.deployments.values()):
            self._autoscale(deployment, now)
            if not deployment.failed:
                self._reconcile(deployment, now)
            self._health_checks(deployment, now)
        for replica in self.replicas.values():
            if replica.stop_deadline is not None and now > replica.stop_deadline:
                self.backend.kill(replica.replica_id)
        self._collect_deleted()
        self.recovery.save_members()

    def _observe_exits(self) -> None:
        for exit_ in self.backend.poll_exits():
            if is_proxy(exit_.process_id):
                self._proxy_exited(exit_.process_id, exit_.returncode)
                continue
            replica = self.replicas.pop(exit_.process_id, None)
            if replica is None:
                continue
            deployment = self.deployments.get(replica.deployment)
            if replica.state is ReplicaState.STARTING and deployment is not None:
                deployment.constructor_failures += 1
                deployment.last_error = deployment.last_error or (
                    f"replica process exited with code {exit_.returncode} before it was ready")
            elif replica.state is ReplicaState.RUNNING:
                log.warning("replica %s of %s died (exit code %s); replacing it",
                            replica.replica_id, replica.deployment, exit_.returncode)
            if deployment is not None:
                self.push_replica_set(deployment.id)

    def _proxy_exited(self, proxy_id: str, code: int | None) -> None:
        # The address stays: the restarted worker binds the same port again.
        self.proxy_workers.pop(proxy_id, None)
        self.proxy_addresses.pop(proxy_id, None)
        if self.stopping or proxy_id in self.backend.alive():  # already replaced
            return
        if self.recovery.active:  # start_proxies starts the missing ones after recovery
            return
        log.warning("%s exited with code %s; restarting it", proxy_id, code)
        self.backend.start_proxy(proxy_id)

    def _decide_now(self, did: DeploymentId) -> None:
        """A router's queue just started to grow: decide (and act) without waiting a tick."""
        deployment = self.deployments.get(did)
        if deployment is None or deployment.config.autoscaling_config is None:
            return
        now = time.monotonic()
        if now - deployment.last_urgent_decision < URGENT_DECISION_INTERVAL_S:
            return
        deployment.last_urgent_decision = now
        self._autoscale(deployment, now, self.load.peek(did, now))
        if not deployment.failed:
            self._reconcile(deployment, now)

    def _autoscale(self, deployment: DeploymentRecord, now: float,
                   open_bucket: LoadSample | None = None) -> None:
        if deployment.config.autoscaling_config is None or deployment.deleting:
            return
        samples: Sequence[LoadSample] = self.load.series.get(deployment.id, ())
        if open_bucket is not None:
            samples = [*samples, open_bucket]
        self.autoscaler.scale(deployment, samples, now)

    def _reconcile(self, deployment: DeploymentRecord, now: float) -> None:
        observed = [ObservedReplica(r.replica_id, r.state, r.version, r.started_at)
                    for r in deployment.replicas.values() if r.replica_id in self.replicas]
        actions = reconcile(deployment.target, deployment.version, observed,
                            deployment.standby_wanted)
        for action in actions:
            if isinstance(action, ActivateReplica):
                replica = self.replicas[action.replica_id]
                replica.move(ReplicaState.RUNNING)
                log.info("activated standby replica %s of %s (%s)", replica.replica_id,
                         deployment.id, action.reason)
                self.push_replica_set(deployment.id)
            elif isinstance(action, StartReplicas):
                for _ in range(action.count):
                    if not self._start_replica(deployment, now):
                        break
            elif isinstance(action, StopReplica):
                self._stop_replica(self.replicas[action.replica_id], now, action.reason)

    def _start_replica(self, deployment: DeploymentRecord, now: float) -> bool:
        replica_id = f"{deployment.id.name}-{secrets.token_hex(4)}"
        launch = ReplicaLaunch(replica_id, deployment.id, deployment.config.resources,
                               deployment.sys_path)
        try:
            pid = self.backend.start_replica(launch)
        except PlacementError as exc:
            if deployment.last_error != f"waiting for resources: {exc}":
                deployment.last_error = f"waiting for resources: {exc}"
                log.warning("%s: %s", deployment.id, deployment.last_error)
            return False
        record = ReplicaRecord(replica_id, deployment.id, deployment.version, now, pid=pid)
        deployment.replicas[replica_id] = record
        self.replicas[replica_id] = record
        return True

    def _stop_replica(self, replica: ReplicaRecord, now: float, reason: str) -> None:
        if not replica.alive or replica.state is ReplicaState.DRAINING:
            return
        log.info("stopping replica %s (%s)", replica.replica_id, reason)
        was_running = replica.state is ReplicaState.RUNNING
        replica.move(ReplicaState.DRAINING)
        timeout = self.deployments[replica.deployment].config.graceful_shutdown_timeout_s
        replica.stop_deadline = now + timeout + 2.0
        if was_running:
            self.push_replica_set(replica.deployment)
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

    def _fail_replica(self, replica: ReplicaRecord, reason: str) -> None:
        if replica.alive:
            was_running = replica.state is ReplicaState.RUNNING
            replica.move(ReplicaState.FAILED)
            log.warning("replica %s failed: %s", replica.replica_id, reason)
            if was_running:
                self.push_replica_set(replica.deployment)
        self.backend.kill(replica.replica_id)

    def _health_checks(self, deployment: DeploymentRecord, now: float) -> None:
        config = deployment.config
        for replica in deployment.replicas.values():
            if replica.state not in (ReplicaState.RUNNING, ReplicaState.STANDBY):
                continue
            if replica.health_check_running or now < replica.next_health_check:
                continue
            replica.health_check_running = True
            replica.next_health_check = now + config.health_check_period_s
            self.spawn(self._check(replica, config.health_check_timeout_s))

    async def _check(self, replica: ReplicaRecord, timeout_s: float) -> None:
        assert replica.peer is not None
        try:
            await replica.peer.call("check_health", timeout=timeout_s)
            replica.health_failures = 0
        except Exception as exc:
            replica.health_failures += 1
            log.warning("health check %d of replica %s failed: %r", replica.health_failures,
                        replica.replica_id, exc)
            if (replica.health_failures >= HEALTH_CHECK_FAILURE_THRESHOLD
                    and replica.state in (ReplicaState.RUNNING, ReplicaState.STANDBY)):
                self._fail_replica(replica, "failed its health checks")
        finally:
            replica.health_check_running = False

    def _collect_deleted(self) -> None:
        for did, deployment in list(self.deployments.items()):
            deployment.replicas = {k: v for k, v in deployment.replicas.items()
                                   if k in self.replicas}
            if deployment.deleting and not deployment.replicas:
                del self.deployments[did]
                self.pushed.pop(did, None)
                self.load.drop(did)
                self.autoscaler.forget(did)
                app = self.apps.get(did.app)
                if app is not None and app.deployments.get(did.name) is deployment:
                    del app.deployments[did.name]
                    if not app.deployments:
                        del self.apps[did.app]
                        self.recovery.deleted(did.app)

    # -- pushes ----------------------------------------------------------------------------

    def _routes(self) -> RouteTable:
        return RouteTable(tuple(RouteTarget(a.name, a.ingress, a.route_prefix, a.auth)
                                for a in self.apps.values() if a.route_prefix is not None))

    def _push_routes(self) -> None:
        table = self._routes()
        for proxy in self.proxies:
            proxy.push("routes", table)

    def push_replica_set(self, did: DeploymentId, force: bool = False) -> None:
        deployment = self.deployments.get(did)
        watchers = self.watchers.get(did, set())
        if deployment is None or not watchers or self.recovery.active:
            return
        running = sorted((r.info for r in deployment.running if r.info is not None),
                         key=lambda info: info.replica_id)
        config = deployment.config
        share = queue_share(config.queue_limit, len(watchers))
        unavailable = UNAVAILABLE_FAILED if deployment.failed else ""
        key = (tuple(running), config.max_ongoing_requests, share, unavailable)
        if not force and self.pushed.get(did) == key:
            return
        self.pushed[did] = key
        replica_set = ReplicaSet(did, tuple(running), config.max_ongoing_requests, share,
                                 deployment.version, unavailable)
        for watcher in watchers:
            watcher.push("replica_set", replica_set)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- shutdown --------------------------------------------------------------------------

    async def shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self.recovery.active:  # stop waiting: adopt nobody else, stop the stragglers
            self.recovery.maybe_finish(float("inf"))
        log.info("shutting down: stopping %d replica(s) and the proxy", len(self.replicas))
        # The proxy goes first: it finishes the requests it holds while replicas still serve.
        proxies = [p for p in self.backend.alive() if is_proxy(p)]
        for proxy_id in proxies:
            self.backend.terminate(proxy_id)
        proxy_deadline = time.monotonic() + 6.0
        while (any(is_proxy(p) for p in self.backend.alive())
               and time.monotonic() < proxy_deadline):
            await asyncio.sleep(0.02)
        now = time.monotonic()
        for replica in list(self.replicas.values()):
            if replica.alive:
                self._stop_replica(replica, now, "shutdown")
        deadline = now + max((d.config.graceful_shutdown_timeout_s
                              for d in self.deployments.values()), default=0.0) + 2.0
        while self.backend.alive() and time.monotonic() < deadline:
            self.backend.poll_exits()
            await asyncio.sleep(0.05)
        for process_id in self.backend.alive():
            self.backend.kill(process_id)
        self.backend.close()
        self.stopped.set()
