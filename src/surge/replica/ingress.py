"""`serve.ingress(...)`: serve an ASGI app (FastAPI, an APIRouter, any ASGI callable, or
one a builder makes in the replica) from a deployment class, as Ray Serve does.

The forms, as in Ray 2.60 (ray/serve/api.py `ingress`):
- `@serve.ingress(app)` on a class: `app` is a FastAPI app or APIRouter whose routes may
  be methods of the class (class-based views: `self` is the replica's instance), or any
  ASGI callable; as in Ray, which freezes the app there, the routes served are those
  the app had when the class was decorated (one added afterwards answers 404);
- `@serve.ingress(build_app)` with a plain function: called in each replica, after the
  constructor, to make the app (so it may build handles or load things);
- `@serve.ingress()` with no app: the class defines `__serve_build_asgi_app__(self)`,
  called after the constructor, which returns the app (sync or async);
- `serve.ingress(app)()` with no class: a deployment that serves only the app.
`build_app` runs the ASGI lifespan's startup (replica/asgi_lifespan.py) and registers
the answer for a child deployment's refusal (`refusal_answer`, also what a plain
`__call__` that lets one through answers, as in Ray): 503 or the configured 429 for
`BackPressureError`, with Retry-After only when it advises one; 503 for
`DeploymentUnavailableError`.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Any

from surge.errors import BackPressureError, DeploymentUnavailableError
from surge.policy.admission import retry_after_header

__all__ = ["BUILD_METHOD", "INGRESS_ATTRIBUTE", "REFUSALS", "build_app", "ingress",
           "refusal_answer"]

INGRESS_ATTRIBUTE = "__surge_ingress_app__"
BUILD_METHOD = "__serve_build_asgi_app__"
_LATE = "late-bound"  # ingress() without an app: the class builds it


def ingress(app: Any = None) -> Any:
    def decorator(cls: type | None = None) -> type:
        if cls is None:
            cls = _app_only_class()
        if not inspect.isclass(cls):
            raise ValueError("@serve.ingress must be used with a class.")
        if "__call__" in _own_names(cls):
            raise ValueError("Classes passed to @serve.ingress may not have __call__ method.")
        if app is None and not hasattr(cls, BUILD_METHOD):
            raise ValueError(f"serve.ingress() called without an app argument requires "
                             f"{cls.__name__} to define `{BUILD_METHOD}`.")
        setattr(cls, INGRESS_ATTRIBUTE, _LATE if app is None else app)
        if app is not None and not inspect.isfunction(app):
            _resolve_annotations(app, cls)
            _claim_routes(app, cls)
            routes = _route_list(app)
            if routes is not None:  # as Ray freezes the app here: later routes are not served
                setattr(cls, _FROZEN_ROUTES, list(routes))
        return cls

    return decorator


def _own_names(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ if klass is not object for name in vars(klass)}


def _app_only_class() -> type:
    class ASGIIngressDeployment:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.args = args
            self.kwargs = kwargs

    return ASGIIngressDeployment


async def build_app(cls: type, instance: Any) -> Any:
    """The ASGI app the replica of `cls` serves (None: `cls` is not an ingress)."""
    declared = getattr(cls, INGRESS_ATTRIBUTE, None)
    if declared is None:
        return None
    build = getattr(instance, BUILD_METHOD, None)
    if build is not None:
        app = build()
        if inspect.isawaitable(app):
            app = await app
        if app is None:
            raise TypeError(f"`{BUILD_METHOD}` must return an ASGI app.")
    elif declared == _LATE:
        raise TypeError(f"the ASGI app was not given to serve.ingress() and `{BUILD_METHOD}` "
                        "is not defined on the deployment.")
    elif inspect.isfunction(declared):
        app = declared()
        if inspect.isawaitable(app):
            app = await app
    else:
        app = declared
        frozen = cls.__dict__.get(_FROZEN_ROUTES)
        routes = _route_list(app)
        if frozen is not None and routes is not None:
            routes[:] = frozen
    _bind_class_routes(app, cls, instance)
    app = _served(app)
    if hasattr(app, "add_exception_handler"):
        for refusal in REFUSALS:
            app.add_exception_handler(refusal, _refusal_response)
    return app


# What a child deployment raises when it refuses a call: answered for what it is (as
# Ray and as surge's proxy answer them), not as the app's 500.
REFUSALS = (BackPressureError, DeploymentUnavailableError)


def refusal_answer(exc: Exception) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and text body for a child's refusal (one of REFUSALS)."""
    body = str(exc).encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]
    if not isinstance(exc, BackPressureError):
        return 503, headers, body
    if exc.advise_retry:
        headers.append((b"retry-after", retry_after_header(exc.retry_after_s).encode()))
    return exc.status_code, headers, body


async def _refusal_response(request: Any, exc: Exception) -> Any:
    from starlette.responses import Response

    status, headers, body = refusal_answer(exc)
    return Response(body, status_code=status, headers={k.decode(): v.decode() for k, v in headers})


def _served(app: Any) -> Any:
    """An APIRouter is served inside a FastAPI app (FastAPI's routes need its
    middleware); anything else as it is."""
    try:
        from fastapi import APIRouter, FastAPI
    except ImportError:  # pragma: no cover - FastAPI is optional
        return app
    if isinstance(app, APIRouter):
        wrapper = FastAPI()
        wrapper.include_router(app)
        return wrapper
    return app


def _bind_class_routes(app: Any, cls: type, instance: Any) -> None:
    """Routes whose endpoints are methods of `cls` (or its bases) become routes bound to
    this replica's instance, every other option of the route kept."""
    try:
        from fastapi.routing import APIRoute, APIWebSocketRoute
    except ImportError:  # pragma: no cover - FastAPI is optional
        return
    prefixes = tuple(f"{base.__qualname__}." for base in cls.__mro__ if base is not object)
    others: list[tuple[list[Any], int]] = []
    for routes, index, route in list(_routes(app)):
        if not isinstance(route, APIRoute | APIWebSocketRoute):
            continue
        endpoint = route.endpoint
        claimed = getattr(endpoint, _CLAIMED, ())
        if claimed and not any(owner in cls.__mro__ for owner in claimed):
            others.append((routes, index))
            continue
        if not getattr(endpoint, "__qualname__", "").startswith(prefixes) or \
                isinstance(endpoint, types.MethodType):
            continue
        kind = type(route)
        names = list(inspect.signature(kind.__init__).parameters)[1:]
        options = {name: getattr(route, name) for name in names if hasattr(route, name)}
        options["endpoint"] = types.MethodType(endpoint, instance)
        routes[index] = kind(**options)
    for routes, index in reversed(others):
        del routes[index]


_CLAIMED = "__surge_ingress_classes__"
_FROZEN_ROUTES = "__surge_ingress_routes__"  # the app's routes when the class was decorated


def _route_list(app: Any) -> list[Any] | None:
    """A FastAPI app's or an APIRouter's own list of routes (None for other apps)."""
    routes = getattr(getattr(app, "router", app), "routes", None)
    return routes if isinstance(routes, list) else None


def _claim_routes(app: Any, cls: type) -> None:
    """Mark the route methods of `cls` (and its bases) as its own: an app shared by
    several ingress classes serves, in each one's replicas, only that class's methods
    (the others' answer 404, as in Ray, not 422 for a missing `self`)."""
    prefixes = tuple(f"{base.__qualname__}." for base in cls.__mro__ if base is not object)
    for _, _, route in _routes(app):
        endpoint = getattr(route, "endpoint", None)
        if inspect.isfunction(endpoint) and endpoint.__qualname__.startswith(prefixes):
            setattr(endpoint, _CLAIMED, (*getattr(endpoint, _CLAIMED, ()), cls))


def _resolve_annotations(app: Any, cls: type) -> None:
    """Annotations of the class's route methods as objects, not strings, while their
    module's globals are at hand: the replica rebuilds these routes from a by-value
    copy of the class (a `__main__` script's), whose functions keep only the globals
    their code uses, so `ws: "WebSocket"` under `from __future__ import annotations`
    would no longer resolve there and FastAPI would take it for a query parameter."""
    import typing

    prefixes = tuple(f"{base.__qualname__}." for base in cls.__mro__ if base is not object)
    for _, _, route in _routes(app):
        endpoint = getattr(route, "endpoint", None)
        if not getattr(endpoint, "__qualname__", "").startswith(prefixes):
            continue
        try:
            endpoint.__annotations__ = typing.get_type_hints(endpoint, include_extras=True)
        except Exception:  # a name only the replica has: left as it is
            pass


def _routes(router: Any) -> Iterator[tuple[list[Any], int, Any]]:
    """(list, index, route) for every route under `router`, included routers too."""
    routes = _route_list(router)
    if routes is None:
        return
    for index, route in enumerate(routes):
        yield routes, index, route
        nested = getattr(route, "original_router", None)  # FastAPI >= 0.137 include_router
        if nested is not None:
            yield from _routes(nested)
