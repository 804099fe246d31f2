"""Replica process entry point: `python -m surge.replica`, its spec on stdin.

It reads its `ReplicaProcessSpec` (surge.launch), fetches the deployment's code and
config from the controller, builds the user object, listens where the spec says and
reports ready. It drains on SIGTERM or when the controller asks. It keeps serving when
the controller goes away, and re-registers (`hello` with its address) with the
restarted one; it leaves with the instance's supervisor (or, unsupervised, with the
controller; placed on a cluster, with its host actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import os
import signal
import sys
from typing import Any

import cloudpickle

from surge.control_auth import user_dir
from surge.errors import ConfigError, ControllerUnavailableError, users_traceback
from surge.launch import ReplicaProcessSpec, Tcp, Unix, read_spec
from surge.model import ImportedTarget, ReplicaSpec
from surge.observability.logs import configure_logging
from surge.observability.recorder import Recorder, TelemetryReport
from surge.observability.user_metrics import REGISTRY
from surge.process import (
    die_with_parent,
    keep_freed_memory,
    raise_fd_limit,
    set_title,
    watch_supervisor,
)
from surge.replica.context import ReplicaContext, ReplicaID, ReplicaRank, set_replica_context
from surge.replica.server import ReplicaServer
from surge.replica.stats_hooks import StatsHooks
from surge.replica.threads import SizedPools, owns_thread_pools, size_pools, yield_cpu_to_the_front
from surge.replica.user_code import UserCode
from surge.router.runtime import RouterRuntime, set_runtime
from surge.weights.client import set_store

log = logging.getLogger("surge.replica")


def resolve_target(target: Any) -> Any:
    """The user's class or function, importing it when it was sent by name."""
    if not isinstance(target, ImportedTarget):
        return target
    found: Any = importlib.import_module(target.module)
    for part in target.qualname.split("."):
        found = getattr(found, part)
    return getattr(found, "func_or_class", found)


CALLS_SETTLE_S = 2.0  # how long a stopping replica waits for the calls it made to end


class Replica:
    def __init__(self, launch: ReplicaProcessSpec, pools: SizedPools | None = None) -> None:
        self.launch = launch
        self.pools = pools  # sized to num_cpus at start; given back to a class that sizes
        # its own (replica/threads.py)
        self.replica_id = launch.process_id
        self.stop = asyncio.Event()
        self.server: ReplicaServer | None = None
        self.user: UserCode | None = None
        self.spec: ReplicaSpec | None = None
        self.hooks: StatsHooks | None = None
        self.runtime = RouterRuntime(
            launch.controller, "replica", hello={"replica_id": self.replica_id},
            rpc_methods={"check_health": self.check_health, "reconfigure": self.reconfigure,
                         "drain": self.drain, "stats": self.stats},
            token=launch.token, node_id=launch.node_id)
        self.runtime.on_controller_lost = self.stop.set
        set_runtime(self.runtime)

    async def check_health(self) -> bool:
        assert self.user is not None
        await self.user.call_optional("check_health")
        return True

    async def reconfigure(self, user_config: Any) -> bool:
        assert self.user is not None
        await self.user.call_optional("reconfigure", user_config)
        return True

    async def drain(self, timeout_s: float) -> bool:
        finished = await self.server.drain(timeout_s) if self.server is not None else True
        self.stop.set()
        return finished

    async def stats(self) -> dict[str, Any]:
        server = self.server
        if server is None:
            return {"ongoing": 0, "served": 0}
        return {"ongoing": server.ongoing, "served": server.served}

    def telemetry(self) -> TelemetryReport:
        assert self.server is not None
        report = self.server.drain_telemetry({"processing": self.server.ongoing},
                                             user=REGISTRY.drain())
        models = self.server.models
        return report if models is None else dataclasses.replace(report,
                                                                 models=tuple(models.ids))

    async def build(self) -> bool:
        self.spec = spec = await self.runtime.call("replica_spec", replica_id=self.replica_id)
        for entry in reversed(spec.sys_path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        try:
            target = resolve_target(cloudpickle.loads(spec.target_blob))
            if self.pools is not None and owns_thread_pools(target):
                self.pools.release()  # e.g. LLMServer: vLLM sizes its own
            args, kwargs = cloudpickle.loads(spec.init_blob)
            self.user = UserCode(target, args, kwargs, spec.max_ongoing_requests)
            replica = ReplicaID(self.replica_id, spec.deployment.name, spec.deployment.app)
            context = ReplicaContext(replica, None, self.launch.node_id,
                                     ReplicaRank(spec.rank, 0, spec.rank), spec.world_size)
            set_replica_context(context, spec.objectives)
            await self.user.construct()
            set_replica_context(dataclasses.replace(context, servable_object=self.user.servable),
                                spec.objectives)
            if spec.user_config is not None:
                if not await self.user.call_optional("reconfigure", spec.user_config):
                    raise TypeError("user_config is set but the deployment has no "
                                    "reconfigure(self, config) method")
            # As Ray: a replica serves once its first health check passed; failing that
            # one is failing to start.
            await self.user.call_optional("check_health")
        except Exception:
            error = users_traceback()
            log.error("replica %s failed to start:\n%s", self.replica_id, error)
            await self.runtime.call("replica_started", replica_id=self.replica_id, error=error)
            return False
        return True

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        lifetime = self.launch.lifetime
        watch_supervisor(loop, lifetime.supervisor_pid, self._on_sigterm)
        if lifetime.reconnects:
            self.runtime.on_controller_lost = None  # reconnect: the supervisor restarts it
            self.runtime.on_gave_up = self._on_sigterm
            self.runtime.reconnect_limit_s = lifetime.orphan_timeout_s
        await self.runtime.connect()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)  # a stop, from now on
        try:
            if not await self._build_unless_stopped():
                return 0 if self.stop.is_set() else 1
        except ConnectionError:
            log.warning("replica %s lost the controller before it was ready; exiting",
                        self.replica_id)
            return 1
        assert self.spec is not None and self.user is not None
        name = f"{self.spec.deployment.app}:{self.spec.deployment.name}"
        deployment = self.spec.deployment
        recorder = Recorder("replica", self.replica_id, deployment.app, deployment.name)
        self.server = ReplicaServer(self.user, self.spec.max_ongoing_requests, name, recorder,
                                    metrics=self.launch.metrics, app=deployment.app)
        if self.server.metrics:
            self.runtime.report_telemetry(self.telemetry)
        listeners, address, local_address = await self._listen()
        self.hooks = StatsHooks(self.user, self.replica_id, self.spec.routing_stats_period_s,
                                self.spec.routing_stats_timeout_s, self.server.broadcast,
                                self._push_engine_load)
        self.hooks.start()
        where = {"address": address, "local_address": local_address,
                 "node_id": self.launch.node_id}
        own_check = self.user.defines("check_health")  # else telemetry stands for it
        try:
            wanted = await self.runtime.call(
                "replica_started", replica_id=self.replica_id, pid=os.getpid(), address=address,
                local_address=local_address, node_id=where["node_id"],
                own_health_check=own_check)
        except (ConnectionError, ControllerUnavailableError):
            wanted = False
        if not wanted:  # the controller that asked for us died meanwhile, or stopped us
            log.warning("replica %s is not wanted by the controller (it restarted while "
                        "this replica started); exiting", self.replica_id)
            _close(listeners, address, local_address)
            self.user.close()
            return 1
        # What a restarted controller needs to adopt this replica when it reconnects.
        self.runtime.hello.update(
            app=self.spec.deployment.app, deployment=self.spec.deployment.name,
            version=self.spec.version, gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            own_health_check=own_check, rank=self.spec.rank, **where)
        await self.stop.wait()
        self.hooks.stop()
        if not self.server.draining:
            await self.server.drain(self.spec.graceful_shutdown_timeout_s)
        _close(listeners, address, local_address)
        await self.user.destroy()  # lifespan shutdown, then the user's __del__
        # Calls the user's __del__ (or a model's) fired and forgot still reach their
        # replica, as in Ray, before this process leaves.
        await self.runtime.settle(CALLS_SETTLE_S)
        self.user.close()
        self.runtime.close()
        return 0

    async def _build_unless_stopped(self) -> bool:
        """build(), unless the controller stops this replica first (a delete while the
        constructor still runs): then, as in Ray, the constructor is cancelled and the
        user's `__del__` still runs, once."""
        build = asyncio.ensure_future(self.build())
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait((build, stopped), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if build.done():
            return build.result()
        build.cancel()
        await asyncio.gather(build, return_exceptions=True)
        log.info("replica %s stopped while its constructor ran", self.replica_id)
        if self.user is not None:
            await self.user.destroy()
            self.user.close()
        return False

    def _push_engine_load(self, report: Any) -> None:
        peer = self.runtime.peer
        if peer is not None and not peer.is_closed:
            peer.push("engine_load", report)

    async def _listen(self) -> tuple[list[asyncio.Server], str, str]:
        """Where routers reach us: (listeners, address, local_address).

        `Unix(directory)` (one machine): a Unix socket there, cheaper than loopback TCP.
        `Tcp` (placed on a node): TCP on the node's IP for routers on other nodes (they
        complete the token handshake first), plus, with `also_unix`, a Unix socket that
        routers on this node use instead.
        """
        assert self.server is not None
        listen = self.launch.listen
        if isinstance(listen, Unix):
            unix, path = await self._listen_unix(listen.directory)
            return [unix], path, ""
        assert isinstance(listen, Tcp)
        host = listen.host or self.launch.node_ip or "127.0.0.1"
        token = self.launch.token
        factory = self.server.protocol_requiring(token) if token else self.server.protocol
        tcp = await asyncio.get_running_loop().create_server(factory, host, 0, backlog=4096)
        address = f"{host}:{tcp.sockets[0].getsockname()[1]}"
        if not listen.also_unix:
            return [tcp], address, ""
        try:
            unix, path = await self._listen_unix(os.path.join(user_dir(), "sockets"))
        except OSError as exc:
            log.warning("no Unix socket for this node's routers (%s); TCP only", exc)
            return [tcp], address, ""
        return [tcp, unix], address, path

    async def _listen_unix(self, directory: str) -> tuple[asyncio.Server, str]:
        assert self.server is not None
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"{self.replica_id}.sock")
        with contextlib.suppress(OSError):
            os.unlink(path)
        listener = await asyncio.get_running_loop().create_unix_server(
            self.server.protocol, path, backlog=4096)
        return listener, f"unix:{path}"

    def _on_sigterm(self) -> None:
        if self.server is not None and self.spec is not None:
            asyncio.get_running_loop().create_task(
                self.drain(self.spec.graceful_shutdown_timeout_s))
        else:
            self.stop.set()


def _close(listeners: list[asyncio.Server], *addresses: str) -> None:
    for listener in listeners:
        listener.close()
    for address in addresses:
        if address.startswith("unix:"):
            with contextlib.suppress(OSError):
                os.unlink(address[5:])


def main(launch: ReplicaProcessSpec) -> int:
    app, deployment = launch.app, launch.deployment
    set_title(f"surge:replica:{app}:{deployment}")
    raise_fd_limit()
    keep_freed_memory()
    if not launch.lifetime.supervisor_pid:
        die_with_parent(launch.lifetime.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    configure_logging("replica", f"{app}:{launch.process_id}", launch.logging)
    set_store(launch.weight_store, launch.node_id)  # weights.load maps from its store
    # Before the user's code imports its libraries; a forked replica's inherited pools too.
    yield_cpu_to_the_front(launch.nice)  # first: threads the pools start later inherit it
    pools = size_pools(launch.num_cpus)
    import uvloop

    async def run() -> int:
        return await Replica(launch, pools).serve()

    code: int = uvloop.run(run())
    return code


def main_from_stdin() -> int:
    try:
        launch = read_spec(ReplicaProcessSpec)
    except ConfigError as exc:
        print(f"surge:replica: {exc}", file=sys.stderr)
        return 2
    return main(launch)
