"""DeploymentHandle: call a deployment from Python, through the same router as HTTP.

`handle.remote()` returns a `DeploymentResponse` at once; `.result(timeout_s=)` blocks
for it (outside an event loop) and `await response` awaits it. With
`.options(stream=True)` it returns a `DeploymentResponseGenerator` to iterate. A
`DeploymentResponse` passed as an argument is resolved before the call is sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import pickle
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import cloudpickle

from surge.errors import (
    DeploymentUnavailableError,
    GetTimeoutError,
    RayServeException,
    RequestCancelledError,
    UserCodeError,
)
from surge.model import DeploymentId
from surge.router.replica_link import Pending
from surge.router.runtime import RouterRuntime, current_runtime
from surge.transport.messages import Call, End, Failure, Item, Message, Result

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator",
           "decode_failure"]

_END = object()


def dumps(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:
        return bytes(cloudpickle.dumps(value, protocol=5))


def decode_failure(message: Failure) -> BaseException:
    if message.payload:
        try:
            exc = pickle.loads(message.payload)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    if message.kind == "cancelled":
        return RequestCancelledError(message.message)
    if message.kind == "unavailable":
        return DeploymentUnavailableError(message.message)
    if message.kind == "user":
        return UserCodeError(message.message)
    return RayServeException(message.message)


AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


class _UnarySink:
    """Delivers one result into an asyncio future or (from another thread) a concurrent one."""

    __slots__ = ("future",)

    def __init__(self, future: AnyFuture) -> None:
        self.future = future

    def deliver(self, message: Message) -> None:
        if isinstance(message, Result):
            try:
                value = pickle.loads(message.payload)
            except Exception as exc:
                self.fail(exc)
                return
            if not self.future.done():
                with contextlib.suppress(asyncio.InvalidStateError,
                                         concurrent.futures.InvalidStateError):
                    self.future.set_result(value)
        elif isinstance(message, Failure):
            self.fail(decode_failure(message))
        else:
            self.fail(RayServeException(
                f"expected a result, got {type(message).__name__}; call a generator method "
                "with handle.options(stream=True)"))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            with contextlib.suppress(asyncio.InvalidStateError,
                                     concurrent.futures.InvalidStateError):
                self.future.set_exception(exc)


class _StreamSink:
    """A stream's items as they come. The queue holds at most a flow-control window of
    them (transport/flow.py): each item is reported consumed once the caller takes it."""

    __slots__ = ("pending", "queue")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.pending: Pending | None = None

    def deliver(self, message: Message) -> None:
        if isinstance(message, Item):
            self.queue.put_nowait(_Item(pickle.loads(message.payload), len(message.payload)))
        elif isinstance(message, End):
            self.queue.put_nowait(_END)
        elif isinstance(message, Failure):
            self.queue.put_nowait(decode_failure(message))
        elif isinstance(message, Result):  # a plain method called with stream=True
            self.queue.put_nowait(_Item(pickle.loads(message.payload), 0))
            self.queue.put_nowait(_END)

    def fail(self, exc: BaseException) -> None:
        self.queue.put_nowait(exc)

    async def next(self) -> Any:
        """The next value, _END, or an exception (returned, not raised)."""
        item = await self.queue.get()
        if isinstance(item, _Item):
            if self.pending is not None:
                self.pending.consumed(item.size)
            return item.value
        return item


class _Item:
    __slots__ = ("size", "value")

    def __init__(self, value: Any, size: int) -> None:
        self.value, self.size = value, size


async def _resolve(value: Any) -> Any:
    if isinstance(value, DeploymentResponse):
        return await value
    return value


_ids = itertools.count(1)
_ID_PREFIX = os.urandom(4).hex()


def new_request_id() -> str:
    """A handle call's request id (unique per process run; logs and contexts carry it)."""
    return f"{_ID_PREFIX}-h{next(_ids):x}"


class _Request:
    """Everything needed to send one call, built on the caller's thread."""

    __slots__ = ("args", "deployment", "kwargs", "method", "model_id", "request_id", "runtime",
                 "session_id", "stream")

    def __init__(self, handle: DeploymentHandle, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.runtime = current_runtime()
        self.deployment = handle.deployment_id
        self.method = handle.method_name
        self.stream = handle.stream
        self.model_id = handle.multiplexed_model_id
        self.session_id = handle.session_id
        self.request_id = new_request_id()
        self.args = args
        self.kwargs = kwargs

    def needs_await(self) -> bool:
        """Whether sending must wait (arguments to resolve, or no replica set yet)."""
        return (any(isinstance(a, DeploymentResponse) for a in self.args)
                or any(isinstance(v, DeploymentResponse) for v in self.kwargs.values())
                or not self.runtime.router(self.deployment).ready.is_set())

    def submit_now(self, sink: _UnarySink | _StreamSink) -> Pending | None:
        """Send without awaiting anything (on the runtime's loop); None if it failed."""
        pending = Pending(Call(id=0, method=self.method, payload=dumps((self.args, self.kwargs)),
                               stream=self.stream, model_id=self.model_id,
                               request_id=self.request_id, session_id=self.session_id), sink)
        if isinstance(sink, _StreamSink):
            sink.pending = pending
        try:
            self.runtime.router(self.deployment).submit(pending)
        except Exception as exc:
            sink.fail(exc)
            return None
        return pending

    async def _start(self, sink: _UnarySink | _StreamSink) -> Pending | None:
        """Resolve response arguments and wait for a replica set, then send."""
        self.args = tuple([await _resolve(a) for a in self.args])
        self.kwargs = {k: await _resolve(v) for k, v in self.kwargs.items()}
        router = self.runtime.router(self.deployment)
        if not router.ready.is_set():
            await router.ready.wait()
        return self.submit_now(sink)

    async def unary(self) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending = await self._start(_UnarySink(future))
        try:
            return await future
        except asyncio.CancelledError:
            if pending is not None:
                self.runtime.router(self.deployment).cancel(pending)
            raise


def _in_loop(runtime: RouterRuntime) -> bool:
    try:
        return asyncio.get_running_loop() is runtime.loop
    except RuntimeError:
        return False


class DeploymentResponse:
    """The future result of one handle call.

    In the common case (arguments ready, replica set known) the call is submitted to
    the router directly and the result lands in a future, with no task per call.
    """

    def __init__(self, request: _Request) -> None:
        self._runtime = request.runtime
        self._request = request
        self._pending: Pending | None = None
        self._inner: asyncio.Task[Any] | None = None  # the slow path's task, if any
        self._task: asyncio.Future[Any] | concurrent.futures.Future[Any]
        loop = self._runtime.loop
        if _in_loop(self._runtime):
            if request.needs_await():
                self._task = loop.create_task(request.unary())
            else:
                self._task = loop.create_future()
                self._pending = request.submit_now(_UnarySink(self._task))
        else:
            self._task = concurrent.futures.Future()
            loop.call_soon_threadsafe(self._start_threadsafe)

    def _start_threadsafe(self) -> None:
        future = self._task
        assert isinstance(future, concurrent.futures.Future)
        if not future.set_running_or_notify_cancel():
            return  # cancelled before it was sent
        if not self._request.needs_await():
            self._pending = self._request.submit_now(_UnarySink(future))
            return
        task = self._inner = self._runtime.loop.create_task(self._request.unary())

        def copy(done: asyncio.Future[Any]) -> None:
            if future.done():
                return
            if done.cancelled():
                future.set_exception(RequestCancelledError("the request was cancelled"))
            elif done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(done.result())

        task.add_done_callback(copy)

    @property
    def request_id(self) -> str:
        return self._request.request_id

    def result(self, timeout_s: float | None = None) -> Any:
        if isinstance(self._task, asyncio.Future):
            raise RayServeException(
                "DeploymentResponse.result() blocks and cannot be called inside the event "
                "loop; use `await response` in async code")
        try:
            return self._task.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise GetTimeoutError(f"no result within timeout_s={timeout_s}") from None
        except concurrent.futures.CancelledError:
            raise RequestCancelledError("the request was cancelled") from None

    def __await__(self) -> Generator[Any, None, Any]:
        if isinstance(self._task, asyncio.Future):
            return self._task.__await__()
        return asyncio.wrap_future(self._task).__await__()

    def cancel(self) -> None:
        """Cancel the call wherever it is (queued, or running on a replica)."""
        if _in_loop(self._runtime):
            self._cancel_in_loop()
        else:
            self._runtime.loop.call_soon_threadsafe(self._cancel_in_loop)

    def _cancel_in_loop(self) -> None:
        if self._pending is not None:
            self._runtime.router(self._request.deployment).cancel(self._pending)
            _UnarySink(self._task).fail(RequestCancelledError("the request was cancelled"))
        elif self._inner is not None:
            self._inner.cancel()
        else:
            self._task.cancel()


class DeploymentResponseGenerator:
    """Iterate (sync or async) over what a generator method yields."""

    def __init__(self, request: _Request) -> None:
        self._runtime = request.runtime
        self._request = request
        self._sink: _StreamSink | None = None
        self._done = False
        self._cancelled = False

    @property
    def request_id(self) -> str:
        return self._request.request_id

    def cancel(self) -> None:
        """Stop the stream wherever it is (queued, or running on a replica); the next
        item raises RequestCancelledError."""
        self._cancelled = True
        if _in_loop(self._runtime):
            self._cancel_in_loop()
        else:
            self._runtime.loop.call_soon_threadsafe(self._cancel_in_loop)

    def _cancel_in_loop(self) -> None:
        sink = self._sink
        if sink is not None and sink.pending is not None:
            self._runtime.router(self._request.deployment).cancel(sink.pending)
            sink.fail(RequestCancelledError("the request was cancelled"))

    def cancelled(self) -> bool:
        return self._cancelled

    async def _next(self) -> Any:
        if self._cancelled and self._sink is None:
            raise RequestCancelledError("the request was cancelled")
        if self._sink is None:
            self._sink = _StreamSink()
            await self._request._start(self._sink)
        item = await self._sink.next()
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if _in_loop(self._runtime):
            raise RayServeException("use `async for` on a response generator inside async code")
        try:
            return asyncio.run_coroutine_threadsafe(self._next(), self._runtime.loop).result()
        except StopAsyncIteration:
            raise StopIteration from None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        if _in_loop(self._runtime):
            return await self._next()
        future = asyncio.run_coroutine_threadsafe(self._next(), self._runtime.loop)
        return await asyncio.wrap_future(future)


class DeploymentHandle:
    """A handle to a deployment (Ray Serve's `DeploymentHandle`)."""

    def __init__(self, deployment_name: str, app_name: str, *, method_name: str = "__call__",
                 stream: bool = False, multiplexed_model_id: str = "",
                 session_id: str = "") -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.method_name = method_name
        self.stream = stream
        self.multiplexed_model_id = multiplexed_model_id
        self.session_id = session_id  # as Ray: the callee's request context says it
        self.deployment_id = DeploymentId(app_name, deployment_name)

    def __repr__(self) -> str:
        return (f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r}, "
                f"method={self.method_name!r}, stream={self.stream})")

    def options(self, *, method_name: str | None = None, stream: bool | None = None,
                multiplexed_model_id: str | None = None, session_id: str | None = None,
                **_ray_only: Any) -> DeploymentHandle:
        return DeploymentHandle(
            self.deployment_name, self.app_name,
            method_name=self.method_name if method_name is None else method_name,
            stream=self.stream if stream is None else stream,
            multiplexed_model_id=(self.multiplexed_model_id if multiplexed_model_id is None
                                  else multiplexed_model_id),
            session_id=self.session_id if session_id is None else session_id)

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("__"):  # Python's protocols; `_private` methods are callable
            raise AttributeError(name)
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any
               ) -> DeploymentResponse | DeploymentResponseGenerator:
        request = _Request(self, args, kwargs)
        if self.stream:
            return DeploymentResponseGenerator(request)
        return DeploymentResponse(request)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_handle, (self.deployment_name, self.app_name, self.method_name,
                                  self.stream, self.multiplexed_model_id, self.session_id))


def _rebuild_handle(name: str, app: str, method: str, stream: bool, model_id: str,
                    session_id: str = "") -> DeploymentHandle:
    return DeploymentHandle(name, app, method_name=method, stream=stream,
                            multiplexed_model_id=model_id, session_id=session_id)
