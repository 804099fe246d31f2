"""Run the user's class or function: construct, reconfigure, health-check, call, destroy.

The constructor runs on the replica's event loop, as in Ray, so `__init__` may call
`asyncio.get_running_loop()` or start background tasks; `async def __init__` is
awaited. A graceful stop runs the ingress app's lifespan shutdown, then the user's
`__del__` (awaited when async), once. Sync methods run on a thread pool sized to
`max_ongoing_requests`, async ones on the replica's event loop (handle calls to plain
methods go through sync_calls.py, which submits them to the same pool). HTTP requests reach
`__call__` as a starlette `Request` (or the `serve.ingress` ASGI app), and whatever
comes back is turned into ASGI messages. As in Ray, a `__call__` that takes no
parameters is called without the request; that is decided once, at construction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from surge.errors import RayServeException
from surge.replica.asgi_lifespan import Lifespan
from surge.replica.ingress import REFUSALS, build_app, refusal_answer
from surge.replica.multiplex import shutdown_all

__all__ = ["Send", "UserCode", "asgi_scope", "takes_request"]

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_json = msgspec.json.Encoder()
log = logging.getLogger("surge.replica")


class UserCode:
    def __init__(self, target: Any, init_args: tuple[Any, ...], init_kwargs: dict[str, Any],
                 max_ongoing_requests: int) -> None:
        self.target = target
        self.is_function = not inspect.isclass(target)
        self.init_args = init_args
        self.init_kwargs = init_kwargs
        self.instance: Any = None
        self.asgi_app: Any = None
        self.lifespan: Lifespan | None = None
        self._destroyed = False
        self._methods: dict[str, tuple[Callable[..., Any], bool]] = {}  # name -> (fn, async)
        self.http_takes_request = True  # decided in construct(), once the callable exists
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(max_ongoing_requests, 64)), thread_name_prefix="surge-user")

    async def construct(self) -> None:
        if self.is_function:
            self.http_takes_request = takes_request(self.target)
            return
        # As Ray: `__new__`, then `__init__` here on the loop (awaited if async). The
        # instance is kept first: a replica stopped during an async `__init__` runs its
        # `__del__` (destroy) as Ray's does.
        instance = self.instance = self.target.__new__(self.target)
        initialized = instance.__init__(*self.init_args, **self.init_kwargs)
        if inspect.isawaitable(initialized):
            await initialized
        if self.has_method("__call__"):
            self.http_takes_request = takes_request(self.method("__call__"))
        self.asgi_app = await build_app(self.target, instance)
        if self.asgi_app is not None:
            self.lifespan = Lifespan(self.asgi_app)
            await self.lifespan.startup()

    async def destroy(self) -> None:
        """On a graceful stop: the lifespan's shutdown, then the user's `__del__`, once;
        what they raise is logged, never raised."""
        if self._destroyed or (self.instance is None and not self.is_function):
            return
        self._destroyed = True
        if self.lifespan is not None:
            await self.lifespan.shutdown()
        destructor = getattr(self.instance, "__del__", None) if not self.is_function else None
        try:
            if destructor is not None:
                result = destructor()
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.exception("__del__ of %s raised", type(self.instance).__name__)
        await shutdown_all()  # multiplexed models: unloaded, their __del__ run (as Ray)

    @property
    def servable(self) -> Any:
        return self.target if self.is_function else self.instance

    def defines(self, name: str) -> bool:
        """Whether the user's class has a method `name` (a function deployment has none)."""
        return not self.is_function and callable(getattr(self.instance, name, None))

    async def call_optional(self, name: str, *args: Any) -> bool:
        """Call `name` if the user defined it (`defines`); False when they did not."""
        if not self.defines(name):
            return False
        await self._invoke(getattr(self.instance, name), args, {})
        return True

    def method(self, name: str) -> Callable[..., Any]:
        if self.is_function:
            if name != "__call__":
                raise RayServeException(f"a function deployment has only __call__, not {name!r}")
            return self.target  # type: ignore[no-any-return]
        method = getattr(self.instance, name, None)
        if method is None or (name.startswith("__") and name != "__call__"):
            available = [attr for attr in dir(self.instance) if not attr.startswith("__")
                         and callable(getattr(self.instance, attr, None))]
            raise RayServeException(f"Tried to call a method '{name}' that does not exist. "
                                    f"Available methods: {available}.")
        return method  # type: ignore[no-any-return]

    def has_method(self, name: str) -> bool:
        try:
            self.method(name)
        except RayServeException:
            return False
        return True

    def plain_method(self, name: str) -> Callable[..., Any] | None:
        """The method `name` if it is a plain `def` (not async, not a generator)."""
        try:
            method = self.method(name)
        except RayServeException:
            return None
        if (inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
                or inspect.isgeneratorfunction(method)):
            return None
        return method

    async def _invoke(self, method: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any], in_loop: bool | None = None) -> Any:
        if in_loop is None:
            in_loop = inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
        if in_loop:
            result = method(*args, **kwargs)
        else:
            loop = asyncio.get_running_loop()
            # In this request's context, so the user's log lines carry its request id.
            result = await loop.run_in_executor(self.pool, functools.partial(
                contextvars.copy_context().run, method, *args, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entry = self._methods.get(name)
        if entry is None:
            method = self.method(name)
            entry = self._methods[name] = (method, inspect.iscoroutinefunction(method)
                                           or inspect.isasyncgenfunction(method))
        return await self._invoke(entry[0], args, kwargs, entry[1])

    async def iterate(self, result: Any) -> AsyncIterator[Any]:
        """Items of a (sync or async) generator a method returned."""
        if inspect.isasyncgen(result):
            async for item in result:
                yield item
        elif inspect.isgenerator(result):
            loop = asyncio.get_running_loop()
            sentinel = object()
            while True:
                item = await loop.run_in_executor(self.pool, next, result, sentinel)
                if item is sentinel:
                    return
                yield item
        else:
            yield result

    async def handle_http(self, scope: dict[str, Any], receive: Receive,
                          send: Send) -> SimpleResponse | None:
        """Serve one HTTP request; plain return values come back for the fast path."""
        if self.asgi_app is not None:
            if self.lifespan is not None and self.lifespan.state:
                scope["state"] = dict(self.lifespan.state)  # request.state, per request
            await self.asgi_app(scope, receive, send)
            return None
        args = (Request(scope, receive),) if self.http_takes_request else ()
        try:
            result = await self.call("__call__", args, {})
        except REFUSALS as exc:  # a child deployment's refusal let through: as Ray answers it
            return refusal_answer(exc)
        simple = simple_response(result)
        if simple is None:
            await respond(result, scope, receive, send)
        return simple

    async def handle_websocket(self, scope: dict[str, Any], receive: Receive,
                               send: Send) -> None:
        """Serve one WebSocket with the ingress app (replica/websocket.py checked it has one)."""
        if self.lifespan is not None and self.lifespan.state:
            scope["state"] = dict(self.lifespan.state)
        await self.asgi_app(scope, receive, send)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


SimpleResponse = tuple[int, list[tuple[bytes, bytes]], bytes]


def takes_request(entry: Callable[..., Any]) -> bool:
    """Whether an HTTP entry point (a function, or a bound `__call__`) takes the request:
    one with no parameters at all is called without it (Ray's rule); `*args` takes it."""
    try:
        return len(inspect.signature(entry).parameters) > 0
    except (TypeError, ValueError):  # no signature to read (a builtin): pass the request
        return True


def simple_response(result: Any) -> SimpleResponse | None:
    """Status, headers and body for plain return values (the fast path), else None."""
    if isinstance(result, dict | list):
        try:
            body, content_type = _json.encode(result), b"application/json"
        except TypeError:
            return None
    elif isinstance(result, str):
        body, content_type = result.encode(), b"text/plain; charset=utf-8"
    elif result is None:  # Ray Serve answers None with an empty text/plain body, not "null"
        body, content_type = b"", b"text/plain"
    elif isinstance(result, bytes | bytearray | memoryview):
        body, content_type = bytes(result), b"application/octet-stream"
    elif isinstance(result, Response):
        return None
    else:
        try:
            body, content_type = _json.encode(result), b"application/json"
        except TypeError:
            return None
    return 200, [(b"content-type", content_type),
                 (b"content-length", str(len(body)).encode())], body


async def respond(result: Any, scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Turn what `__call__` returned into ASGI messages, as Ray Serve does."""
    if isinstance(result, Response):
        await result(scope, receive, send)
        return
    simple = simple_response(result)
    if simple is None:
        from starlette.responses import JSONResponse

        await JSONResponse(_jsonable(result))(scope, receive, send)
        return
    status, headers, body = simple
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _jsonable(value: Any) -> Any:
    try:
        from fastapi.encoders import jsonable_encoder
    except ImportError:  # pragma: no cover - fastapi is optional
        raise TypeError(f"cannot turn {type(value).__name__} into JSON; return a dict, list, "
                        "str, bytes or a starlette Response") from None
    return jsonable_encoder(value)


def asgi_scope(method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
               client: str, route_prefix: str, http_version: str,
               root_path: str = "", raw_path: bytes = b"",
               scheme: str = "http") -> dict[str, Any]:
    host, _, port = client.rpartition(":")
    prefix = "" if route_prefix == "/" else route_prefix.rstrip("/")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": http_version,
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": raw_path or path.encode(),
        "query_string": query,
        "root_path": root_path + prefix,
        "headers": headers,
        "client": (host, int(port)) if port.isdigit() else None,
        "server": None,
        "state": {},
    }
