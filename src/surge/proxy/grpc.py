"""gRPC ingress: Ray Serve's gRPC proxy on surge's data path, bytes through.

The proxy process serves gRPC beside its HTTP server, on the same event loop, on
`gRPCOptions.port` (every worker of a node binds it with SO_REUSEPORT), with HTTP/2 of
its own (codecs/h2.py, codecs/grpc_wire.py: no grpcio server, whose per-call costs were
most of the proxy's CPU). It knows the methods of the servicers named in
`grpc_servicer_functions` (learned by calling each with a recording server,
transport/grpc_methods.py) by path and kind only: a request's bytes go to the replica in
a `GrpcRequest` frame and the response's bytes come back, so a message is parsed once,
in the replica, the only process that needs the user's `_pb2`.

A call names its application in the `application` metadata (any name, or none, picks the
only one) and reaches the deployment's method named like the RPC, through the app's
ingress Router: the admission path, queue limits and backpressure of HTTP. Each
connection is a sans-IO `GrpcCore` (proxy/grpc_core.py: how a call is decided, timed,
cancelled and flow-controlled; proxy/grpc_call.py: its state) in an asyncio shell,
`GrpcConnection` (proxy/grpc_connection.py); this module holds
what they share (`GrpcIngress`) and starts the server. Statuses are decided in
proxy/grpc_status.py; `request_id` always comes back in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from surge.errors import ConfigError
from surge.model import DeploymentId, RouteTable, RouteTarget
from surge.proxy.grpc_call import GrpcCall
from surge.proxy.grpc_connection import GrpcConnection
from surge.proxy.grpc_local import LocalServices
from surge.proxy.grpc_status import CODE_NAMES
from surge.transport.grpc_methods import GrpcMethod, methods_of

if TYPE_CHECKING:
    from surge.proxy.server import Proxy
    from surge.router.router import Router

__all__ = ["GrpcIngress", "load_methods", "start_grpc"]

log = logging.getLogger("surge.proxy")


class GrpcIngress:
    """What every gRPC connection of the proxy shares: the methods, the apps, the limits."""

    def __init__(self, proxy: Proxy, methods: Mapping[str, GrpcMethod],
                 request_timeout_s: float | None, health: bool = False,
                 reflection: bool = False) -> None:
        self.proxy = proxy
        self.loop = proxy.loop
        self.request_timeout_s = request_timeout_s
        self.methods = dict(methods)
        self.max_header_bytes = proxy.spec.max_header_bytes
        self.ongoing = 0  # calls submitted and not yet ended
        self.connections: set[GrpcConnection] = set()
        self.local = LocalServices(lambda: self.apps(), {m.service for m in methods.values()},
                                   lambda: self.proxy.site.draining, self._unready, health,
                                   reflection)
        self._apps: dict[str, RouteTarget] = {}
        self._table: RouteTable | None = None

    def __repr__(self) -> str:
        return (f"<GrpcIngress methods={len(self.methods)} apps={len(self._apps)} "
                f"connections={len(self.connections)} ongoing={self.ongoing}>")

    def _unready(self) -> str:
        answer = self.proxy.site.unready()
        return "" if answer is None else answer.body.decode()

    def protocol(self) -> GrpcConnection:
        return GrpcConnection(self)

    def apps(self) -> dict[str, RouteTarget]:
        table = self.proxy.runtime.routes
        if table is not self._table:
            self._table = table
            self._apps = {target.app: target for target in table.targets}
        return self._apps

    @property
    def draining(self) -> bool:
        return self.proxy.site.draining

    def router(self, target: RouteTarget) -> Router:
        return self.proxy.runtime.router(DeploymentId(target.app, target.deployment))

    def drain(self) -> None:
        """No new calls on any connection (GOAWAY); health watchers hear NOT_SERVING."""
        for connection in list(self.connections):
            connection.going_away()

    def busy(self) -> bool:
        """A call is still open, or an answer still held by its client's window: draining
        waits for it (a unary upload not yet submitted counts too)."""
        return any(connection.busy() for connection in self.connections)

    def close(self) -> None:
        for connection in list(self.connections):
            connection.close()

    def record(self, call: GrpcCall, code: int) -> None:
        if call.labels is None:
            return
        name = CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else str(code)
        latency_ms = (self.proxy.now() - call.started) * 1000.0
        self.proxy.record_grpc(call.labels, code, name, latency_ms, call.request_id)


def load_methods(functions: tuple[str, ...]) -> dict[str, GrpcMethod]:
    methods: dict[str, GrpcMethod] = {}
    for path in functions:
        methods.update(methods_of(path))
    return methods


async def start_grpc(proxy: Proxy, host: str, port: int, functions: tuple[str, ...],
                     request_timeout_s: float | None, reflection: bool = False,
                     health: bool = False) -> tuple[asyncio.Server, GrpcIngress, int] | None:
    """Serve gRPC for `proxy` (None: no servicer functions, so no server, as Ray). With
    the HTTP port's certificate (http_options.ssl_*), the gRPC port serves TLS only
    (ALPN h2), with the same client-certificate mode.

    Raises ConfigError when a servicer function cannot be used or the port is taken."""
    if not functions:
        return None
    from surge.proxy.server import bind
    from surge.proxy.tls import server_context

    methods = load_methods(functions)
    ingress = GrpcIngress(proxy, methods, request_timeout_s, health, reflection)
    spec = proxy.spec
    tls = None
    if spec.ssl_certfile is not None:
        tls = server_context(spec)
        tls.set_alpn_protocols(["h2"])
    try:
        sock = bind(host, port, reuse_port=True)
    except OSError as exc:
        raise ConfigError(f"cannot listen for gRPC on {host}:{port}: "
                          f"{exc.strerror or exc}") from None
    server = await proxy.loop.create_server(
        ingress.protocol, sock=sock, backlog=4096, ssl=tls,
        ssl_handshake_timeout=spec.request_header_timeout_s if tls is not None else None)
    proxy.grpc = ingress
    return server, ingress, sock.getsockname()[1]
