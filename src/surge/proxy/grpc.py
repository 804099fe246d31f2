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
`GrpcConnection` (proxy/grpc_connection.py); what they share is a `GrpcIngress`
(proxy/grpc_ingress.py); this module starts the server. Statuses are decided in
proxy/grpc_status.py; `request_id` always comes back in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import functools

from surge.errors import ConfigError
from surge.proxy.grpc_connection import GrpcConnection
from surge.proxy.grpc_ingress import GrpcIngress
from surge.proxy.host import Host, bind
from surge.proxy.tls import server_context
from surge.transport.grpc_methods import GrpcMethod, methods_of

__all__ = ["load_methods", "start_grpc"]


def load_methods(functions: tuple[str, ...]) -> dict[str, GrpcMethod]:
    methods: dict[str, GrpcMethod] = {}
    for path in functions:
        methods.update(methods_of(path))
    return methods


async def start_grpc(proxy: Host, host: str, port: int, functions: tuple[str, ...],
                     request_timeout_s: float | None, reflection: bool = False,
                     health: bool = False) -> tuple[asyncio.Server, GrpcIngress, int] | None:
    """Serve gRPC for `proxy` (None: no servicer functions, so no server, as Ray). With
    the HTTP port's certificate (http_options.ssl_*), the gRPC port serves TLS only
    (ALPN h2), with the same client-certificate mode.

    Raises ConfigError when a servicer function cannot be used or the port is taken."""
    if not functions:
        return None
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
        functools.partial(GrpcConnection, ingress), sock=sock, backlog=4096, ssl=tls,
        ssl_handshake_timeout=spec.request_header_timeout_s if tls is not None else None)
    return server, ingress, sock.getsockname()[1]
