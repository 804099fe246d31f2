"""proxy/routes.py: a route table compiled once, looked up by path segments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.model import RouteTable
from surge.proxy.routes import compile_routes
from tests.proxy.wire import FakeRouter, table


@pytest.mark.parametrize(
    ("prefixes", "path", "expected"),
    [
        ((), "/", None),
        (("/",), "/", "/"),
        (("/",), "/anything/at/all", "/"),
        (("/",), "", "/"),
        (("/a",), "/a", "/a"),
        (("/a",), "/a/", "/a"),
        (("/a",), "/a/b", "/a"),
        (("/a",), "/ab", None),
        (("/a",), "/", None),
        (("/", "/a"), "/ab", "/"),
        (("/", "/a"), "/a/x", "/a"),
        (("/a", "/a/b", "/"), "/a/b/c", "/a/b"),  # longest prefix wins, in any order
        (("/a/b", "/a", "/"), "/a/bc", "/a"),
        (("/a/b", "/", "/a"), "/a/b", "/a/b"),
        (("/a/b/c",), "/a/b", None),
        (("/a",), "a/b", None),  # not a path: only "/" could take it
        (("/a",), "//a", None),
    ],
)
def test_match(prefixes: tuple[str, ...], path: str, expected: str | None) -> None:
    route = compile_routes(table(*prefixes), FakeRouter).match(path)
    if expected is None:
        assert route is None
    else:
        assert route is not None
        assert (route.prefix, route.app) == (expected, f"app{expected}")


segments = st.sampled_from(["a", "b", "ab", "", "x%2F", "é"])
prefixes = st.lists(segments, min_size=1, max_size=3).map(lambda s: "/" + "/".join(s)).filter(
    lambda p: p == "/" or not p.endswith("/"))  # as config.py allows
paths = st.lists(segments, max_size=5).map(lambda s: "/" + "/".join(s)) | st.text(max_size=8)


@given(st.lists(prefixes, max_size=6), paths)
def test_the_same_answer_as_route_table_match(chosen: list[str], path: str) -> None:
    source = table(*chosen)
    expected = source.match(path)
    route = compile_routes(source, FakeRouter).match(path)
    assert (route.prefix if route else None) == (expected.route_prefix if expected else None)


def test_each_route_carries_its_constants_and_routers_are_made_once_per_compile() -> None:
    made: list[str] = []

    def router_for(target: object) -> FakeRouter:
        router = FakeRouter(target)  # type: ignore[arg-type]
        made.append(router.name)
        return router

    source = table("/open", "/locked", "/", locked=("/locked",))
    routes = compile_routes(source, router_for)
    assert made == ["app/open#Ingress", "app/locked#Ingress", "app/#Ingress"]
    locked, open_ = routes.match("/locked/x"), routes.match("/open")
    assert locked is not None and open_ is not None
    assert locked.labels == ("app/locked", "Ingress", "/locked")
    assert locked.digests is not None and open_.digests is None
    assert locked.router.name == "app/locked#Ingress"
    assert routes.any_auth and not compile_routes(table("/open"), FakeRouter).any_auth
    assert json.loads(routes.listing) == {"/open": "app/open", "/locked": "app/locked",
                                          "/": "app/"}
    for _ in range(3):
        routes.match("/open/deeper/still")
    assert len(made) == 3  # lookups make nothing
    assert routes.source is source and len(routes) == 3
    assert repr(routes) == "<CompiledRoutes ['/locked', '/open'] root=True any_auth=True>"
    assert repr(locked) == "<Route /locked -> app/locked#Ingress 1 token(s)>"


def test_an_empty_table_matches_nothing() -> None:
    routes = compile_routes(RouteTable(), FakeRouter)
    assert routes.match("/") is None and routes.listing == b"{}" and not routes.any_auth
