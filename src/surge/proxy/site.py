"""What every connection of one proxy reads: limits, the clock, routes, built-in answers.

A `Site` belongs to its `Proxy`. Its compiled routes follow the route table the
controller last pushed (`RouteSource.routes`): an identity check per request, and a
compile (`proxy/routes.py`) only when the table changed.

`/-/healthz` and `/-/routes` answer 503 as Ray's proxy does (and gRPC's Healthz and
ListApplications UNAVAILABLE, from `unready`): while the proxy drains, and until a route
table with a route has come (an instance with no application, or only applications
without a route prefix); once one has, for the proxy's life.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from surge.model import ProxySpec, RouteTable, RouteTarget
from surge.proxy.head import Answer
from surge.proxy.routes import CompiledRoutes, compile_routes

__all__ = ["HEALTHZ", "ROUTES", "RouteSource", "Site"]

HEALTHZ = "/-/healthz"
ROUTES = "/-/routes"
JSON = b"application/json"
HEALTHY = Answer(200, b"success")
DRAINING = Answer(503, b"This node is being drained.")
NO_ROUTES = Answer(503, b"Route table is not populated yet.")
# Only known paths become labels: /-/<anything> must not mint metric series.
_BUILTIN_LABELS = {HEALTHZ: ("", "", HEALTHZ), ROUTES: ("", "", ROUTES)}
_OTHER_LABELS = ("", "", "/-/other")


class RouteSource(Protocol):
    """Where the latest route table is (the RouterRuntime, fed by the controller)."""

    @property
    def routes(self) -> RouteTable: ...


class Site:
    __slots__ = ("_compiled", "_router_for", "_source", "default_timeout", "draining", "host",
                 "now", "populated", "port", "scheme", "spec")

    def __init__(self, spec: ProxySpec, now: Callable[[], float], source: RouteSource,
                 router_for: Callable[[RouteTarget], Any]) -> None:
        self.spec = spec
        self.default_timeout = spec.request_timeout_s  # without x-request-timeout-seconds
        self.now = now  # monotonic seconds
        self._source = source
        self._router_for = router_for
        self._compiled: CompiledRoutes[Any] = compile_routes(source.routes, router_for)
        self.draining = False
        # A route table with a route has come (and stays set, as Ray's).
        self.populated = bool(self._compiled.source.targets)
        self.scheme = "https" if spec.ssl_certfile is not None else "http"
        self.host = spec.host
        self.port = spec.port  # the bound port once listening (spec.port may be 0)

    def __repr__(self) -> str:
        return (f"<Site {self.scheme}://{self.host}:{self.port} routes={len(self._compiled)} "
                f"draining={self.draining} populated={self.populated}>")

    def routes(self) -> CompiledRoutes[Any]:
        """The compiled form of the latest route table (compiled once per push)."""
        compiled = self._compiled
        table = self._source.routes
        if compiled.source is not table:
            compiled = self._compiled = compile_routes(table, self._router_for)
            self.populated = self.populated or bool(table.targets)
        return compiled

    def unready(self) -> Answer | None:
        """Why the proxy is not ready for traffic (None when it is): Ray's answer to its
        health and route requests, over HTTP and gRPC alike."""
        self.routes()
        if self.draining:
            return DRAINING
        return None if self.populated else NO_ROUTES

    def builtin(self, path: str) -> tuple[Answer, tuple[str, str, str]]:
        """The answer to a /-/ path, and its metric labels."""
        if path in _BUILTIN_LABELS:
            unready = self.unready()
            if unready is not None:
                answer = unready
            else:
                answer = HEALTHY if path == HEALTHZ else \
                    Answer(200, self._compiled.listing, (), JSON)
        else:
            answer = Answer(404, f"Path '{path}' not found.".encode())
        return answer, _BUILTIN_LABELS.get(path, _OTHER_LABELS)

    def not_found(self, path: str) -> Answer:
        """Ray's 404 for a path no route matches, naming the path and /-/routes."""
        return Answer(404, f"Path '{path}' not found. Ping {self.scheme}://{self.host}:"
                           f"{self.port}{ROUTES} for available routes.".encode(),
                      reason="no_route")
