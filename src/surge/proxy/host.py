"""What the protocol shells ask of the proxy that owns them (proxy/server.py's `Proxy`),
as a Protocol: a shell (proxy/http.py, proxy/grpc_connection.py, proxy/grpc_ingress.py)
never imports its owner's module, so the owner's module imports the shells and nothing
imports round in a circle. `bind` opens a listening socket for either protocol.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol

from surge.model import ProxySpec
from surge.observability.recorder import Recorder
from surge.proxy.exchange import Exchange
from surge.proxy.site import Site
from surge.router.runtime import RouterRuntime

__all__ = ["Host", "bind"]


class Host(Protocol):
    @property
    def spec(self) -> ProxySpec: ...

    @property
    def site(self) -> Site: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def recorder(self) -> Recorder: ...

    @property
    def runtime(self) -> RouterRuntime: ...

    @property
    def connections(self) -> set[Any]: ...  # the HTTP connections open

    def now(self) -> float: ...

    def record(self, exchange: Exchange) -> None: ...

    def record_grpc(self, labels: tuple[str, str, str], code: int, name: str,
                    latency_ms: float, request_id: str) -> None: ...


def bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # proxy workers share the port; the kernel spreads connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock
