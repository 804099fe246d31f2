"""The proxy process: route table from the controller, HTTP in, frames out.

`python -m surge.proxy` reads its `ProxyProcessSpec` (surge.launch) on stdin, fetches
its HTTP options from the controller, binds, and reports ready. It keeps serving from
its last route table and replica sets if the controller is briefly away, and exits
when told to stop (SIGTERM) after finishing in-flight requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import io
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from surge.clock import SYSTEM, Clock
from surge.errors import ConfigError
from surge.launch import MAX_SPEC_BYTES, ProxyProcessSpec, read_spec
from surge.model import DeploymentId, ProxySpec, RouteTarget
from surge.observability.config import LoggingConfig
from surge.observability.logs import AccessLog, configure_logging
from surge.observability.recorder import Recorder, TelemetryReport
from surge.process import (
    die_with_parent,
    keep_freed_memory,
    raise_fd_limit,
    set_title,
    watch_supervisor,
)
from surge.proxy.exchange import Exchange
from surge.proxy.host import bind
from surge.proxy.http import HttpConnection
from surge.proxy.site import Site
from surge.proxy.tls import server_context
from surge.router.router import Router
from surge.router.runtime import RouterRuntime, set_runtime

if TYPE_CHECKING:
    from surge.proxy.grpc_ingress import GrpcIngress

__all__ = ["Proxy", "main"]

log = logging.getLogger("surge.proxy")

DRAIN_TIMEOUT_S = 5.0


class Proxy:
    def __init__(self, runtime: RouterRuntime, spec: ProxySpec, proxy_id: str = "proxy-0",
                 logging_config: LoggingConfig | None = None, *, metrics: bool = True,
                 clock: Clock = SYSTEM) -> None:
        self.runtime = runtime
        self.spec = spec
        self.now = clock.monotonic
        self.recorder = Recorder("proxy", proxy_id)
        self._http_request = self.recorder.http_request
        self.metrics = metrics  # off: no recording at all (nobody reads it)
        self.access = AccessLog(logging_config or LoggingConfig(), proxy_id)
        self.loop = asyncio.get_running_loop()
        self.connections: set[HttpConnection] = set()
        # Limits, clock and compiled routes, read by every connection. Compiling a route
        # table makes a router exist for each route (and so a replica set to watch).
        self.site = Site(spec, clock.monotonic, runtime, self._router_for)
        shortest = min(spec.keep_alive_timeout_s, spec.request_header_timeout_s,
                       spec.request_body_timeout_s)
        self._sweep_interval = min(1.0, max(0.05, shortest / 4))
        self.grpc: GrpcIngress | None = None  # when gRPC is served (proxy/grpc.py)
        self.loop.call_later(self._sweep_interval, self._sweep)

    def _router_for(self, target: RouteTarget) -> Router:
        return self.runtime.router(DeploymentId(target.app, target.deployment))

    @property
    def port(self) -> int:
        return self.site.port

    @port.setter
    def port(self, port: int) -> None:
        self.site.port = port  # the bound port (spec.port may be 0), named by 404s

    def _sweep(self) -> None:
        """Idle keep-alive connections close; slow headers and stalled bodies get 408."""
        now = self.now()
        for connection in list(self.connections):
            connection.sweep(now)
        self.loop.call_later(self._sweep_interval, self._sweep)

    def __repr__(self) -> str:
        return (f"<Proxy {self.spec.host}:{self.spec.port} connections={len(self.connections)} "
                f"routes={len(self.runtime.routes.targets)} draining={self.site.draining}>")

    def protocol(self) -> HttpConnection:
        return HttpConnection(self)

    def record(self, exchange: Exchange) -> None:
        """A request got its answer (or lost its client): count it, maybe log it."""
        access = self.access
        if not self.metrics and not access.enabled:
            return
        now = self.now()
        latency_ms = (now - exchange.started) * 1000.0
        head = exchange.head
        app, deployment, route = head.labels
        if self.metrics:
            self._http_request((app, deployment, route, head.method, exchange.status),
                               latency_ms)
        if access.enabled and access.wanted(now):
            access.write(head.request_id.decode(errors="replace"), head.method, head.path,
                         exchange.status, latency_ms, route=route, application=app,
                         deployment=deployment)

    def record_grpc(self, labels: tuple[str, str, str], code: int, name: str,
                    latency_ms: float, request_id: str) -> None:
        """A gRPC call ended with status `code` (`name`): count it, maybe log it."""
        access = self.access
        app, deployment, method = labels
        if self.metrics:
            self.recorder.grpc_request((app, deployment, method, name), latency_ms)
        if access.enabled and access.wanted(self.now()):
            access.write(request_id, "gRPC", method, code, latency_ms, route=method,
                         application=app, deployment=deployment, protocol="grpc",
                         grpc_status=name)

    def telemetry(self) -> TelemetryReport:
        ongoing = sum(len(connection.core.exchanges) for connection in self.connections)
        gauges = {"ongoing_http_requests": ongoing, "connections": len(self.connections)}
        if self.grpc is not None:
            gauges["ongoing_grpc_requests"] = self.grpc.ongoing
        return self.recorder.drain(gauges)

    async def follow_routes(self) -> None:
        """Compile each route table as soon as it arrives.

        Waiting for the first request instead would let that request (and any burst
        with it) meet a router that has no replica set yet, and so no queue limit.
        """
        received = self.runtime.routes_received
        while True:
            await received.wait()
            received.clear()
            self.site.routes()

    async def drain(self) -> None:
        self.site.draining = True
        if self.grpc is not None:
            self.grpc.drain()
        for connection in list(self.connections):
            connection.going_away()  # WebSockets: 1001 now, not a cut at the deadline
        deadline = self.now() + DRAIN_TIMEOUT_S
        while self.now() < deadline and (any(c.core.exchanges for c in self.connections)
                                         or (self.grpc is not None and self.grpc.busy())):
            await asyncio.sleep(0.02)


async def serve(launch: ProxyProcessSpec) -> int:
    stop = asyncio.Event()
    proxy_id = launch.process_id
    runtime = RouterRuntime(launch.controller, "proxy",
                            hello={"proxy_id": proxy_id, "node_id": launch.node_id},
                            token=launch.token, node_id=launch.node_id)
    set_runtime(runtime)
    lifetime = launch.lifetime
    watch_supervisor(asyncio.get_running_loop(), lifetime.supervisor_pid, stop.set)
    if not lifetime.reconnects:
        runtime.on_controller_lost = stop.set  # unsupervised: leave with the controller
    runtime.on_gave_up = stop.set
    runtime.reconnect_limit_s = lifetime.orphan_timeout_s
    await runtime.connect()
    spec: ProxySpec = await runtime.call("proxy_spec")
    if launch.port is not None:  # a node's own port (nodes sharing an IP)
        spec = dataclasses.replace(spec, port=launch.port)
    loop = asyncio.get_running_loop()
    proxy = Proxy(runtime, spec, proxy_id, launch.logging, metrics=launch.metrics)
    try:
        tls = server_context(spec) if spec.ssl_certfile is not None else None
    except ConfigError as exc:
        await runtime.call("proxy_started", pid=os.getpid(), error=f"cannot serve TLS: {exc}")
        return 1
    try:
        sock = bind(spec.host, spec.port, spec.reuse_port)
    except OSError as exc:
        await runtime.call("proxy_started", pid=os.getpid(),
                           error=f"cannot listen on {spec.host}:{spec.port}: "
                                 f"{exc.strerror or exc}")
        return 1
    # The handshake is bounded like the headers that follow it (slowloris before TLS).
    server = await loop.create_server(
        proxy.protocol, sock=sock, backlog=4096, ssl=tls,
        ssl_handshake_timeout=spec.request_header_timeout_s if tls is not None else None)
    try:
        grpc_server = await _serve_grpc(proxy, spec)
    except ConfigError as exc:
        server.close()
        await runtime.call("proxy_started", pid=os.getpid(), error=str(exc))
        return 1
    follower = loop.create_task(proxy.follow_routes())
    if proxy.metrics:
        runtime.report_telemetry(proxy.telemetry)
    port = proxy.port = sock.getsockname()[1]
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    address = f"{_advertised_host(spec.host, launch.node_ip)}:{port}"
    await runtime.call("proxy_started", pid=os.getpid(), address=address)
    # What startup made (modules, the user's servicers, the route table) stays: a full
    # collection then walks only what serving makes (gRPC echo: 8.5 ms -> 0.06 ms).
    gc.collect()  # startup's garbage goes first: frozen, it would stay
    gc.freeze()
    runtime.hello["address"] = address  # a restarted controller adopts us
    await stop.wait()
    follower.cancel()
    server.close()
    if grpc_server is not None:
        grpc_server.close()  # no new connections; those open hear GOAWAY in drain
    await proxy.drain()
    if proxy.grpc is not None:
        proxy.grpc.close()
    runtime.close()
    return 0


async def _serve_grpc(proxy: Proxy, spec: ProxySpec) -> Any:
    """The gRPC server beside the HTTP one, when servicer functions are configured."""
    if not spec.grpc_servicer_functions:
        return None
    from surge.proxy.grpc import start_grpc

    started = await start_grpc(proxy, spec.host, spec.grpc_port, spec.grpc_servicer_functions,
                               spec.grpc_request_timeout_s, spec.grpc_enable_reflection,
                               spec.grpc_enable_health)
    if started is None:
        return None
    server, proxy.grpc, _ = started
    return server


def _advertised_host(host: str, node_ip: str | None) -> str:
    """Where clients reach this proxy: its node's IP when it listens on every interface."""
    return (node_ip or host) if host in ("0.0.0.0", "::", "") else host


def main(quiet_without_spec: bool = False) -> int:
    set_title("surge:proxy")
    line = sys.stdin.buffer.readline(MAX_SPEC_BYTES)
    if quiet_without_spec and not line.strip():
        return 0
    try:
        launch = read_spec(ProxyProcessSpec, io.BytesIO(line))
    except ConfigError as exc:
        print(f"surge:proxy: {exc}", file=sys.stderr)
        return 2
    raise_fd_limit()
    keep_freed_memory()
    if not launch.lifetime.supervisor_pid:
        die_with_parent(launch.lifetime.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging("proxy", launch.process_id, launch.logging)
    import uvloop

    code: int = uvloop.run(serve(launch))
    return code
