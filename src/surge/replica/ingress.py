"""`serve.ingress(app)`: serve a FastAPI (or any ASGI) app from a deployment class.

Routes whose endpoints are methods of the class are re-registered bound to the replica's
instance, so `self` works as in Ray Serve's class-based views. `serve.ingress()` with no
app is Ray's late-bound ingress: the class's `__serve_build_asgi_app__` (awaited after
the constructor) returns the ASGI app, e.g. one built around a model it loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BUILD_ASGI_APP", "LATE_BOUND", "bind_ingress_app", "ingress"]

BUILD_ASGI_APP = "__serve_build_asgi_app__"  # Ray's name for the late-bound app's builder
LATE_BOUND = "late-bound"  # what `__surge_ingress_app__` holds for `serve.ingress()`


def ingress(app: Any = None) -> Callable[[type], type]:
    def decorator(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError("@serve.ingress decorates a class")
        if app is None and not hasattr(cls, BUILD_ASGI_APP):
            raise ValueError("serve.ingress() called without an app argument requires "
                             f"{cls.__name__} to define `{BUILD_ASGI_APP}`.")
        cls.__surge_ingress_app__ = LATE_BOUND if app is None else app  # type: ignore[attr-defined]
        return cls

    return decorator


def bind_ingress_app(app: Any, cls: type, instance: Any) -> Any:
    router = getattr(app, "router", None)
    routes = getattr(router, "routes", None)
    if routes is None:
        return app  # plain ASGI app: nothing to bind
    own = {name: value for klass in cls.__mro__ for name, value in vars(klass).items()
           if callable(value)}
    try:
        from fastapi.routing import APIRoute
    except ImportError:  # pragma: no cover
        return app
    for index, route in enumerate(list(routes)):
        if not isinstance(route, APIRoute):
            continue
        name = route.endpoint.__name__
        if own.get(name) is not route.endpoint:
            continue
        bound = getattr(instance, name)
        routes[index] = APIRoute(
            route.path, bound, methods=list(route.methods or ()),
            response_model=route.response_model, status_code=route.status_code,
            name=route.name, response_class=route.response_class,
            dependencies=route.dependencies, tags=route.tags, summary=route.summary,
            description=route.description, include_in_schema=route.include_in_schema,
            response_model_exclude_none=route.response_model_exclude_none)
    return app
