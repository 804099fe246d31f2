"""Routes compiled once per route-table push: a path's route in O(path segments).

The controller pushes a `RouteTable` (route_prefix -> ingress deployment); the proxy
compiles it once into a dict keyed by prefix whose values carry what every request to
that route needs: its router, its metric labels, its token digests. A lookup tries the
path itself, then each shorter prefix ending before a '/', then "/": the first hit is
the longest matching prefix, as `RouteTable.match` says, without walking the table or
building strings beyond the slices a lookup needs.

An OpenAI app's route (its target carries `ModelRoutes`) also gets a `ModelRouting`: a
Route per model deployment, which `route_for` picks from the request's body
(policy/openai_route.py) so the request skips the app's ingress deployment. Any other
route has `models = None`: its requests cost nothing more.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Generic, TypeVar

from surge.model import RouteTable, RouteTarget
from surge.policy.openai_route import ModelTable, choose_deployment

__all__ = ["CompiledRoutes", "ModelRouting", "Route", "compile_routes"]

R = TypeVar("R")  # what the proxy sends a route's requests to (a Router; a fake in tests)


class Route(Generic[R]):
    """One route_prefix and the constants of every request it takes."""

    __slots__ = ("app", "deployment", "digests", "labels", "models", "prefix", "router")

    def __init__(self, target: RouteTarget, router: R) -> None:
        self.prefix = target.route_prefix
        self.app = target.app
        self.deployment = target.deployment
        self.router = router
        # surge_http_requests_total and the access log: (application, deployment, route)
        self.labels = (target.app, target.deployment, target.route_prefix)
        # None: open to every client; else the SHA-256 digests of the accepted tokens
        self.digests = target.auth.digests if target.auth is not None else None
        # An OpenAI app: the model deployments its requests may go to directly.
        self.models: ModelRouting[R] | None = None

    def __repr__(self) -> str:
        auth = "open" if self.digests is None else f"{len(self.digests)} token(s)"
        models = "" if self.models is None else f" {self.models!r}"
        return f"<Route {self.prefix} -> {self.app}#{self.deployment} {auth}{models}>"


class ModelRouting(Generic[R]):
    """An OpenAI app's model deployments, each as a Route of the app's prefix."""

    __slots__ = ("routes", "table")

    def __init__(self, table: ModelTable, routes: dict[str, Route[R]]) -> None:
        self.table = table
        self.routes = routes  # deployment name -> its Route

    def __repr__(self) -> str:
        return f"<ModelRouting {self.table.by_model}>"

    def route_for(self, method: str, path: str, body: bytes, streamed: bool) -> Route[R] | None:
        """The model deployment's route for this request; None: the app's ingress."""
        deployment = choose_deployment(self.table, method, path, body, streamed).deployment
        return None if deployment is None else self.routes[deployment]


class CompiledRoutes(Generic[R]):
    """A route table made ready for lookups; `source` is the table it was compiled from."""

    __slots__ = ("_by_prefix", "any_auth", "listing", "root", "source")

    def __init__(self, source: RouteTable, routes: list[Route[R]]) -> None:
        self.source = source
        # reversed: of two targets with one prefix the first wins, as in RouteTable.match
        self._by_prefix = {r.prefix: r for r in reversed(routes) if r.prefix != "/"}
        self.root = next((r for r in routes if r.prefix == "/"), None)
        # Whether any route needs a token (a table without one never checks a bearer).
        self.any_auth = any(r.digests is not None for r in routes)
        # The body of /-/routes, Ray's shape: {route_prefix: application}.
        self.listing = json.dumps({r.prefix: r.app for r in routes}).encode()

    def __len__(self) -> int:
        return len(self._by_prefix) + (self.root is not None)

    def __repr__(self) -> str:
        return (f"<CompiledRoutes {sorted(self._by_prefix)} root={self.root is not None} "
                f"any_auth={self.any_auth}>")

    def match(self, path: str) -> Route[R] | None:
        """The route with the longest prefix that is `path` or a whole-segment start of it."""
        by_prefix = self._by_prefix
        route = by_prefix.get(path)
        if route is not None:
            return route
        end = path.rfind("/")
        while end > 0:
            route = by_prefix.get(path[:end])
            if route is not None:
                return route
            end = path.rfind("/", 0, end)
        return self.root


def compile_routes(table: RouteTable,
                   router_for: Callable[[RouteTarget], R]) -> CompiledRoutes[R]:
    """Compile `table`; `router_for` is called once per route and model deployment (it
    makes routers exist)."""
    return CompiledRoutes(table, [_route(t, router_for) for t in table.targets])


def _route(target: RouteTarget, router_for: Callable[[RouteTarget], R]) -> Route[R]:
    route = Route(target, router_for(target))
    if target.models is not None:
        routes = {}
        for deployment in sorted({name for _, name in target.models.models}):
            model_target = dataclasses.replace(target, deployment=deployment, models=None)
            routes[deployment] = Route(model_target, router_for(model_target))
        route.models = ModelRouting(ModelTable(target.route_prefix, target.models.models),
                                    routes)
    return route
