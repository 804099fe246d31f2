"""What every gRPC connection of a proxy shares (`GrpcIngress`): the servicers' methods,
the applications, the limits, the calls in flight, the port's own services; and what
the proxy asks of them all (drain, busy, close). proxy/grpc.py starts the server; each
connection is proxy/grpc_connection.py's shell round proxy/grpc_core.py's core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from surge.model import DeploymentId, RouteTable, RouteTarget
from surge.proxy.grpc_call import GrpcCall
from surge.proxy.grpc_local import LocalServices
from surge.proxy.grpc_status import CODE_NAMES
from surge.proxy.host import Host
from surge.transport.grpc_methods import GrpcMethod

if TYPE_CHECKING:
    from surge.router.router import Router

__all__ = ["Connection", "GrpcIngress"]


class Connection(Protocol):
    """What the ingress asks of each connection (proxy/grpc_connection.py)."""

    def going_away(self) -> None: ...

    def busy(self) -> bool: ...

    def close(self) -> None: ...


class GrpcIngress:
    """What every gRPC connection of the proxy shares: the methods, the apps, the limits."""

    def __init__(self, proxy: Host, methods: Mapping[str, GrpcMethod],
                 request_timeout_s: float | None, health: bool = False,
                 reflection: bool = False) -> None:
        self.proxy = proxy
        self.loop = proxy.loop
        self.request_timeout_s = request_timeout_s
        self.methods = dict(methods)
        self.max_header_bytes = proxy.spec.max_header_bytes
        self.ongoing = 0  # calls submitted and not yet ended
        self.connections: set[Connection] = set()
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
