"""The control RPCs: what drivers, the CLI, proxies and replicas ask of the controller.

Each `rpc_<name>` is the method `<name>` of the control connection (transport/rpc.py).
Drivers and the CLI deploy, delete, wait and read status; proxies fetch their HTTP
spec and say how their start ended (serving, or why not); replicas fetch their spec and
say how their build ended (ready, or failed). A handler changes the state directly only
for what a member reports about itself (ready, failed, its address); anything that
starts, stops or signals a process goes through the executor as actions.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from surge.clock import Clock
from surge.config import AppSpec
from surge.controller import desired
from surge.controller.actions import ProxyReady
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.details import instance_details
from surge.controller.executor import Executor
from surge.controller.observer import Observer
from surge.controller.pace import LoopPace
from surge.controller.plan import PROXY_PREFIX
from surge.controller.publish import Publisher
from surge.controller.recovery import Recovery
from surge.controller.state import ControllerState, Peer
from surge.errors import ConfigError
from surge.launch import LOCAL_NODE
from surge.model import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentId,
    ProxySpec,
    ReplicaInfo,
    ReplicaSpec,
    ServeStatus,
)
from surge.policy.lifecycle import ReplicaState

__all__ = ["ControlApi"]

log = logging.getLogger("surge.controller")


class ControlApi:
    def __init__(self, state: ControllerState, executor: Executor, publisher: Publisher,
                 recovery: Recovery, autoscaler: Autoscaler, load: LoadTracker,
                 observer: Observer, clock: Clock, *, changed: asyncio.Condition,
                 replan: Callable[[], None], shutdown: Callable[[], None],
                 pace: LoopPace | None = None) -> None:
        self.state = state
        self.executor = executor
        self.publisher = publisher
        self.recovery = recovery
        self.autoscaler = autoscaler
        self.load = load
        self.observer = observer
        self.clock = clock
        self.changed = changed  # notified whenever state may have changed
        self.replan = replan  # act on the plan now (a member's news must not wait a tick)
        self.shutdown = shutdown
        self.pace = pace or LoopPace()
        self.proxy_ready = asyncio.Event()  # the first proxy serves, or could not
        self.origin = _origin()  # told to each driver that joins: who started this instance

    def __repr__(self) -> str:
        return f"<ControlApi {self.state.address}>"

    async def handle(self, peer: Peer, method: str, kwargs: dict[str, Any]) -> Any:
        handler = getattr(self, f"rpc_{method}", None)
        if handler is None:
            raise ValueError(f"the controller has no method {method!r}")
        return await handler(peer, **kwargs)

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def _wait(self, ready: Callable[[], bool], timeout_s: float | None) -> bool:
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout_s)
            except TimeoutError:
                return False
        return True

    # -- everyone ----------------------------------------------------------------------

    async def rpc_hello(self, peer: Peer, role: str, pid: int, **info: Any) -> dict[str, Any]:
        peer.info = {"role": role, "pid": pid, **info}
        state, recovery = self.state, self.recovery
        if role in ("proxy", "replica"):
            self.publisher.greet_member(peer)
        if role == "proxy":
            self.publisher.add_proxy(peer)
            if "address" in info:  # it served for a previous controller
                self.executor.apply(recovery.adopt_proxy(
                    state, info.get("proxy_id", f"{PROXY_PREFIX}{pid}"), pid, info["address"],
                    info.get("node_id", LOCAL_NODE)))
                self.proxy_ready.set()
        elif role == "replica" and "address" in info:
            self.executor.apply(recovery.adopt_replica(state, peer, pid, info))
        if recovery.active:  # the last member back ends recovery at once
            self.executor.apply(recovery.due(state, self.clock.monotonic()))
        return {"controller_pid": os.getpid(), "http_address": state.proxy_address,
                "daemon_pid": state.daemon_pid, **self.origin}

    async def rpc_watch(self, peer: Peer, deployment: DeploymentId) -> None:
        if not peer.is_closed:  # one handled after its close would be watched forever
            self.publisher.watch(peer, deployment)

    # -- drivers and the CLI ---------------------------------------------------------

    async def rpc_deploy(self, peer: Peer, app: AppSpec) -> None:
        if self.state.stopping:
            raise ConfigError("the instance is shutting down")
        await self.recovery.done.wait()
        if self.state.stopping:  # a shutdown began while recovery held this deploy
            raise ConfigError("the instance is shutting down")
        self.deploy(app)
        self.recovery.deployed(self.state, app)
        self._replan_now()  # its replicas start now, not at the next tick
        await self.notify()

    def deploy(self, app: AppSpec) -> None:
        """Check the application's policies, then make it the desired state."""
        for spec in app.deployments:  # a bad policy fails the deploy, not the control loop
            scaling = spec.config.autoscaling_config
            if scaling is None:
                continue
            try:
                self.autoscaler.prepare(DeploymentId(app.name, spec.config.name), scaling)
            except ConfigError as exc:
                raise ConfigError(f"deployment {spec.config.name!r}: {exc}") from None
            except Exception as exc:
                raise ConfigError(f"deployment {spec.config.name!r}: the autoscaling "
                                  f"policy cannot be built: {exc!r}") from None
        self.executor.apply(desired.deploy(self.state, app, self.clock.wall()))
        self.publisher.push_routes()
        for did in self.state.apps[app.name].ids():
            self.publisher.replica_set(did, force=True)

    def _replan_now(self) -> None:
        """The plan, now (the caller's news must not wait a tick); a backend that fails
        here is logged (the next tick plans again), not the caller's error."""
        try:
            self.replan()
        except Exception:
            log.exception("cannot act on the plan now; the next tick will")

    async def rpc_build_failed(self, peer: Peer, name: str, message: str,
                               source_config: dict[str, Any], route_prefix: str | None) -> None:
        """A config's application did not build (Ray's REST PUT answered already):
        DEPLOY_FAILED with the reason."""
        desired.build_failed(self.state, name, message, source_config, route_prefix,
                             self.clock.wall())
        await self.notify()

    async def rpc_wait_app(self, peer: Peer, name: str, timeout_s: float | None = None
                           ) -> ApplicationStatusOverview | None:
        done = {ApplicationStatus.RUNNING, ApplicationStatus.DEPLOY_FAILED}

        def ready() -> bool:
            return name not in self.state.apps or self.state.app_status(name).status in done

        await self._wait(ready, timeout_s)
        return self.state.app_status(name) if name in self.state.apps else None

    async def rpc_delete(self, peer: Peer, name: str, timeout_s: float = 30.0) -> bool:
        if not desired.delete(self.state, name):
            return False
        self.recovery.deleted(self.state, name)  # a restart during the drain must not revive it
        self.publisher.push_routes()
        self._replan_now()  # its replicas drain now, not at the next tick
        return await self._wait(lambda: name not in self.state.apps, timeout_s)

    async def rpc_status(self, peer: Peer) -> ServeStatus:
        state = self.state
        applications = {}
        for name in state.apps:
            overview = state.app_status(name)
            for dname, deployment in overview.deployments.items():
                did = DeploymentId(name, dname)
                deployment.rates.update(self.load.rates(did))
                node_cpu = state.deployments[did].node_cpu
                if node_cpu is not None:  # its node's CPU, busy share (surge pulse shows it)
                    deployment.rates["node_cpu"] = node_cpu
            applications[name] = overview
        proxies = {p.proxy_id: "HEALTHY" for p in state.proxies.values()}
        return ServeStatus(
            applications=applications, proxies=proxies or {"local": "UNHEALTHY"},
            http_address=state.proxy_address, control_address=state.address,
            proxy_addresses={p.proxy_id: p.address for p in state.proxies.values()},
            dashboard_address=self.observer.url)

    async def rpc_details(self, peer: Peer) -> dict[str, Any]:
        """The instance as Ray's REST API describes it (`surge config`, `surge status -a`)."""
        return instance_details(self.state, self.clock, os.getpid())

    async def rpc_handle_target(self, peer: Peer, app: str, deployment: str | None = None
                                ) -> str | None:
        """The deployment a handle to `app` calls: its ingress, or `deployment` when that is
        one of the application's (serve.get_app_handle / get_deployment_handle); None: no
        such application or deployment."""
        if deployment is not None:
            return deployment if DeploymentId(app, deployment) in self.state.deployments else None
        record = self.state.apps.get(app)
        return record.ingress if record is not None else None

    async def rpc_replicas(self, peer: Peer) -> list[dict[str, Any]]:
        return [{"replica_id": r.replica_id, "app": r.deployment.app,
                 "deployment": r.deployment.name, "state": r.state.value, "pid": r.pid,
                 "version": r.version,
                 "models": list(self.observer.replica_models.get(r.replica_id, ()))}
                for r in self.state.replicas.values()]

    async def rpc_loop_stats(self, peer: Peer, since: float = float("-inf")) -> dict[str, Any]:
        """The control loop's ticks (controller/pace.py) and the autoscaling decisions
        since `since` (monotonic seconds, this machine's clock)."""
        decisions = [{"at": d.at, "deployment": str(d.deployment), "previous": d.previous,
                      "target": d.target, "kind": d.kind.value, "reason": d.reason}
                     for d in self.autoscaler.decisions if d.at > since]
        return {"ticks": self.pace.summary(since), "decisions": decisions,
                "replicas": len(self.state.replicas), "now": self.clock.monotonic()}

    async def rpc_shutdown(self, peer: Peer) -> None:
        self.shutdown()

    # -- proxies -----------------------------------------------------------------------

    async def rpc_proxy_spec(self, peer: Peer) -> ProxySpec:
        h, g, state = self.state.http, self.state.grpc, self.state
        port = h.port
        if state.proxy_address:  # later workers join the port the first one bound
            port = int(state.proxy_address.rpartition(":")[2])
        return ProxySpec(host=h.host, port=port, request_timeout_s=h.request_timeout_s,
                         keep_alive_timeout_s=h.keep_alive_timeout_s,
                         max_body_bytes=h.max_body_bytes, root_path=h.root_path,
                         reuse_port=state.proxy_count > 1,
                         max_header_bytes=h.max_header_bytes,
                         request_header_timeout_s=h.request_header_timeout_s,
                         max_connections=h.max_connections,
                         request_body_timeout_s=h.request_body_timeout_s,
                         websocket_max_message_bytes=h.websocket_max_message_bytes,
                         websocket_idle_timeout_s=h.websocket_idle_timeout_s,
                         ssl_certfile=h.ssl_certfile,
                         ssl_keyfile=h.ssl_keyfile, ssl_ca_certs=h.ssl_ca_certs,
                         ssl_cert_reqs=str(h.ssl_cert_reqs),
                         grpc_port=g.port,
                         grpc_servicer_functions=tuple(g.grpc_servicer_functions),
                         grpc_request_timeout_s=g.request_timeout_s,
                         grpc_enable_reflection=g.enable_reflection,
                         grpc_enable_health=g.enable_health_service)

    async def rpc_proxy_started(self, peer: Peer, pid: int, address: str = "",
                                error: str = "") -> None:
        """A proxy serves at `address`, or cannot serve (`error`). A failure before any
        proxy serves means the instance cannot start (main says why); later, the proxy
        exits and is restarted with a backoff (executor)."""
        proxy_id = peer.info.get("proxy_id", f"{PROXY_PREFIX}{pid}")
        if not error:
            self.executor.apply([ProxyReady(proxy_id, pid, address,
                                            peer.info.get("node_id", LOCAL_NODE))])
            self.proxy_ready.set()
            self._replan_now()  # the other workers join the port it bound
        elif not self.state.proxy_address:
            self.state.proxy_error = error
            self.proxy_ready.set()
        else:
            log.error("%s cannot serve: %s", proxy_id, error)

    # -- replicas ----------------------------------------------------------------------

    async def rpc_replica_spec(self, peer: Peer, replica_id: str) -> ReplicaSpec:
        replica = self.state.replicas[replica_id]
        deployment = self.state.deployments[replica.deployment]
        self.state.spec_sent(replica)
        spec, config = deployment.spec, deployment.config
        router = config.request_router_config
        return ReplicaSpec(replica_id=replica_id, deployment=deployment.id,
                           version=replica.version, target_blob=spec.target_blob,
                           init_blob=spec.init_blob, user_config=config.user_config,
                           max_ongoing_requests=config.max_ongoing_requests,
                           graceful_shutdown_timeout_s=config.graceful_shutdown_timeout_s,
                           sys_path=deployment.sys_path,
                           routing_stats_period_s=router.request_routing_stats_period_s,
                           routing_stats_timeout_s=router.request_routing_stats_timeout_s,
                           rank=replica.rank, world_size=deployment.target,
                           objectives=None if config.autoscaling_config is None
                           else config.autoscaling_config.objectives)

    async def rpc_replica_started(self, peer: Peer, replica_id: str, error: str = "",
                                  address: str = "", pid: int = 0, node_id: str = LOCAL_NODE,
                                  local_address: str = "", own_health_check: bool = True
                                  ) -> bool:
        """A replica was built and serves at `address`, or could not be built (`error`,
        the user's traceback). False: this controller does not want the replica (it
        failed, was started by one that died since, or already stopped); it exits.
        `own_health_check`: its class defines check_health (else its telemetry may stand
        for the check)."""
        state = self.state
        replica = state.replicas.get(replica_id)
        if replica is None:
            return False
        if error:
            deployment = state.deployments.get(replica.deployment)
            if deployment is not None and replica.version == deployment.version:
                state.start_failed(deployment, error, self.clock.monotonic())
            if replica.alive:
                replica.move(ReplicaState.FAILED)
            await self.notify()
            return False
        if replica.state is not ReplicaState.STARTING:
            return False
        deployment = state.deployments[replica.deployment]
        replica.info = ReplicaInfo(replica_id, replica.deployment, address, pid, node_id,
                                   local_address)
        replica.pid = replica.pid or pid  # the ray backend learns it only now
        replica.peer = peer
        replica.own_health_check = own_health_check
        now = self.clock.monotonic()
        spare = (deployment.standby_wanted
                 and state.count_running_current(deployment.id) >= deployment.target)
        replica.move(ReplicaState.STANDBY if spare else ReplicaState.RUNNING)
        state.health.schedule(replica, now + deployment.config.health_check_period_s)
        if replica.version == deployment.version:  # an old one's start proves nothing new
            deployment.constructor_failures, deployment.version_ran = 0, True
            if state.count_running_current(deployment.id) >= deployment.target:
                deployment.health_failed = ""  # recovered: every replica passed a check
        deployment.observe_startup(now - replica.started_at)
        log.info("replica %s of %s is %s (pid %d, started in %.2fs)", replica_id,
                 deployment.id, replica.state.value.lower(), pid, now - replica.started_at)
        self.publisher.replica_set(deployment.id)
        app = state.apps.get(deployment.id.app)
        if (app is not None and not app.ever_running
                and state.count_running_current(deployment.id) >= deployment.target):
            state.note_running_apps()  # it may have just reached RUNNING
        await self.notify()
        return True

def _origin() -> dict[str, Any]:
    """When this controller started and the process that started it (user, pid, command)."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"started_at": time.time(), "started_by": {"user": user, "pid": parent,
                                                      "command": command[:200]}}
