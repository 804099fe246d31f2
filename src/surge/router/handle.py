"""DeploymentHandle: call a deployment from Python, through the same router as HTTP.

`handle.remote()` returns a `DeploymentResponse` at once; `.result(timeout_s=)` blocks
for it (outside an event loop) and `await response` awaits it. With
`.options(stream=True)` it returns a `DeploymentResponseGenerator` to iterate. A
`DeploymentResponse` passed as an argument is resolved before the call is sent.
`handle.method.choose_replica()` holds a slot on a replica and `.dispatch(selection, ...)`
sends the call there (router/selection.py).

Threads. The router lives on the runtime's event loop (in a driver, a background
thread). A call made on the loop submits to the router directly. A call made on any
other thread (the driver's main thread, a replica's worker running a sync method)
would cost the loop's thread a wake-up to send it and another to hand the answer
over, so the calling thread does both itself when it can (the blocking fast path):

* `Router.try_submit` takes the router's lock, picks a replica (power of two choices,
  as on the loop) and writes the frame on a link's socket (transport/threadsafe.py);
  the answer lands in a concurrent.futures.Future.
* A thread with no event loop of its own is taken to wait in `.result()`, so its
  calls go on its own link to the replica, whose reading the loop lends it:
  `.result()` reads and handles the answers there itself. Whenever the thread will
  not read (the response is awaited, cancelled or dropped, its queue is full, or
  answers wait while it does something else: the router checks every 0.1 s), the
  loop reads that link again, and the future is set as on the shared link.

Whatever cannot go at once (a DeploymentResponse argument to resolve, no replica set
yet, a queue to join, a rejection to raise) goes through the loop as before, so
queueing, back-pressure and the load counts are the router's in every case.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import pickle
import secrets
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
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
from surge.router.children import child_calls_var
from surge.router.replica_link import Pending, ReplicaLink, Reservation
from surge.router.runtime import RouterRuntime, current_runtime
from surge.router.selection import ReplicaSelection, choose_replica
from surge.transport.messages import Call, End, Failure, Item, Message, Result

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator",
           "HandleOptions", "ReplicaSelection", "decode_failure"]

_END = object()
# Ray's wording, which applications and Ray's own tests match on.
SYNC_IN_LOOP = "Sync methods should not be called from within an `asyncio` event loop."
NOT_SERIALIZABLE = (
    "`DeploymentResponse` is not serializable. If you are passing the `DeploymentResponse` "
    "in a nested object (e.g. a list or dictionary) to a downstream deployment handle "
    "call, that is no longer supported. Please only pass `DeploymentResponse` objects as "
    "top level arguments.")


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

    __slots__ = ("args", "deployment", "kwargs", "method", "model_id", "request_id",
                 "reservation", "runtime", "session_id", "stream")

    def __init__(self, handle: DeploymentHandle, args: tuple[Any, ...],
                 kwargs: dict[str, Any], reservation: Reservation | None = None) -> None:
        self.runtime = current_runtime()
        self.reservation = reservation  # a slot choose_replica holds: sent there, in it
        self.deployment = handle.deployment_id
        options = handle.handle_options
        self.method = options.method_name
        self.stream = options.stream
        self.model_id = options.multiplexed_model_id
        self.session_id = options.session_id
        self.request_id = new_request_id()
        self.args = args
        self.kwargs = kwargs

    def needs_await(self) -> bool:
        """Whether sending must wait (arguments to resolve, or no replica set yet)."""
        return (self._has_responses()
                or not self.runtime.router(self.deployment).ready.is_set())

    def _has_responses(self) -> bool:
        for value in (*self.args, *self.kwargs.values()):
            if isinstance(value, DeploymentResponse):
                return True
        return False

    def _pending(self, sink: _UnarySink | _StreamSink) -> Pending:
        pending = Pending(Call(id=0, method=self.method, payload=dumps((self.args, self.kwargs)),
                               stream=self.stream, model_id=self.model_id,
                               request_id=self.request_id, session_id=self.session_id), sink)
        if isinstance(sink, _StreamSink):
            sink.pending = pending
        return pending

    def submit_now(self, sink: _UnarySink | _StreamSink) -> Pending | None:
        """Send without awaiting anything (on the runtime's loop); None if it failed."""
        try:
            pending = self._pending(sink)
            router = self.runtime.router(self.deployment)
            if self.reservation is None:
                router.submit(pending)
            else:
                router.dispatch(self.reservation, pending)
        except Exception as exc:
            sink.fail(exc)
            return None
        return pending

    def submit_from_thread(self, sink: _UnarySink, own_link: bool) -> Pending | None:
        """Send from the caller's thread if the router takes it at once; None when the
        call must go through the loop (which also reports any error)."""
        router = self.runtime.routers.get(self.deployment)  # made on the loop, not here
        if self.reservation is not None:
            return None  # the loop dispatches it (and retires a link whose replica went)
        if router is None or not router.ready.is_set() or self._has_responses():
            return None
        try:
            pending = self._pending(sink)
        except Exception:
            return None  # the loop pickles it again and reports the error
        return pending if router.try_submit(pending, own_link) else None

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


def _running_loop() -> asyncio.AbstractEventLoop | None:
    # asyncio's own getter, without raising when there is none (cheaper on every call)
    return asyncio._get_running_loop()


def _in_loop(runtime: RouterRuntime) -> bool:
    return _running_loop() is runtime.loop


class DeploymentResponse:
    """The future result of one handle call.

    In the common case (arguments ready, replica set known, a replica with room) the
    call is submitted to the router directly, from the loop or from the caller's
    thread, and the result lands in a future, with no task per call.
    """

    def __init__(self, request: _Request) -> None:
        self._runtime = request.runtime
        self._request = request
        self._pending: Pending | None = None
        self._inner: asyncio.Task[Any] | None = None  # the slow path's task, if any
        self._task: asyncio.Future[Any] | concurrent.futures.Future[Any]
        self._cancelled = False
        loop = self._runtime.loop
        running = _running_loop()
        if running is loop:
            self._task = loop.create_future()
            if request.needs_await():
                self._start_slow()
            else:
                self._pending = request.submit_now(_UnarySink(self._task))
        else:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._task = future
            # Running from the start, as it may be answered before this thread goes on.
            future.set_running_or_notify_cancel()
            # No event loop on this thread: it will wait in .result(), on its own link.
            self._pending = request.submit_from_thread(_UnarySink(future), running is None)
            if self._pending is None:
                loop.call_soon_threadsafe(self._start_threadsafe)
        children = child_calls_var.get()
        if children is not None:  # made while serving a request: cancelled with it
            self._task.add_done_callback(children.join(self))

    def _start_threadsafe(self) -> None:
        if self._task.done():
            return  # cancelled before the loop came to it
        if self._request.needs_await():
            self._start_slow()
        else:
            self._pending = self._request.submit_now(_UnarySink(self._task))

    def _start_slow(self) -> None:
        """(The loop.) A task resolves the arguments, waits for a replica set and sends;
        its outcome is copied into the response's future, which a cancel fails at once
        with RequestCancelledError (never a bare CancelledError for the awaiting caller)."""
        future = self._task
        task = self._inner = self._runtime.loop.create_task(self._request.unary())

        def copy(done: asyncio.Future[Any]) -> None:
            sink = _UnarySink(future)
            if done.cancelled():
                sink.fail(self._cancelled_error())
            elif done.exception() is not None:
                sink.fail(done.exception())  # type: ignore[arg-type]
            elif not future.done():
                with contextlib.suppress(asyncio.InvalidStateError,
                                         concurrent.futures.InvalidStateError):
                    future.set_result(done.result())

        task.add_done_callback(copy)

    def _cancelled_error(self) -> RequestCancelledError:
        return RequestCancelledError(f"Request {self.request_id} was cancelled.")

    @property
    def request_id(self) -> str:
        return self._request.request_id

    def result(self, timeout_s: float | None = None, *,
               _skip_asyncio_check: bool = False) -> Any:
        future = self._task
        if isinstance(future, asyncio.Future) or (
                not _skip_asyncio_check and _running_loop() is not None):
            raise RuntimeError(SYNC_IN_LOOP + " Use `await response` instead.")
        wait_s = timeout_s
        link, pending = self._own_link(), self._pending
        if link is None:
            self._reclaim()  # on another thread's own link: the loop reads it for us
        elif pending is not None:  # on this thread's own link: read the answer here
            clock = self._runtime.clock
            deadline = None if timeout_s is None else clock.monotonic() + timeout_s

            def seconds_left() -> float | None:
                return None if deadline is None else deadline - clock.monotonic()

            link.read_until(lambda: future.done() or pending.link is not link, seconds_left)
            left = seconds_left()
            wait_s = None if left is None else max(0.0, left)
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            raise GetTimeoutError(f"no result within timeout_s={timeout_s}") from None
        except concurrent.futures.CancelledError:
            raise self._cancelled_error() from None

    def _own_link(self) -> ReplicaLink | None:
        """The link the call is on, if it is this thread's own."""
        pending = self._pending
        link = pending.link if pending is not None else None
        return link if link is not None and link.owner == threading.get_ident() else None

    def _reclaim(self) -> None:
        """If the answer waits on its caller's own link, have the loop read it."""
        pending, task = getattr(self, "_pending", None), getattr(self, "_task", None)
        link = pending.link if pending is not None else None
        if link is not None and link.owner is not None and task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to read
                self._runtime.loop.call_soon_threadsafe(link.reclaim)

    def __del__(self) -> None:
        self._reclaim()  # dropped unread: the call still ends, and counts as done

    def __await__(self) -> Generator[Any, None, Any]:
        future = self._task
        if not isinstance(future, asyncio.Future):
            self._reclaim()
            future = asyncio.wrap_future(future)
        try:
            return (yield from future.__await__())
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the awaiting task itself is cancelled
            # The call was (the future cancelled by another task that awaited it and
            # was cancelled): this caller is not.
            raise self._cancelled_error() from None

    def __reduce__(self) -> tuple[Any, ...]:
        raise RayServeException(NOT_SERIALIZABLE)

    def cancel(self) -> None:
        """Cancel the call wherever it is (queued, or running on a replica, with the
        calls it made in turn); awaiting it then raises RequestCancelledError."""
        if self._cancelled:
            return
        self._cancelled = True
        if _in_loop(self._runtime):
            self._cancel_in_loop()
        else:
            self._runtime.loop.call_soon_threadsafe(self._cancel_in_loop)

    def cancelled(self) -> bool:
        """Whether `cancel()` was called (the call may still have finished first)."""
        return self._cancelled

    def _cancel_in_loop(self) -> None:
        if self._pending is not None:
            self._runtime.router(self._request.deployment).cancel(self._pending)
        elif self._inner is not None:
            self._inner.cancel()
        _UnarySink(self._task).fail(self._cancelled_error())


class DeploymentResponseGenerator:
    """Iterate (sync or async) over what a generator method yields."""

    def __init__(self, request: _Request) -> None:
        self._runtime = request.runtime
        self._request = request
        self._sink: _StreamSink | None = None
        self._done = False
        self._cancelled = False
        children = child_calls_var.get()  # made while serving a request: cancelled with it
        self._leave = None if children is None else children.join(self)

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
            sink.fail(self._cancelled_error())

    def _cancelled_error(self) -> RequestCancelledError:
        return RequestCancelledError(f"Request {self.request_id} was cancelled.")

    def _finish(self) -> None:
        self._done = True
        if self._leave is not None:
            self._leave(None)

    def cancelled(self) -> bool:
        return self._cancelled

    async def _next(self) -> Any:
        if self._cancelled and self._sink is None:
            self._finish()
            raise self._cancelled_error()
        if self._sink is None:
            self._sink = _StreamSink()
            await self._request._start(self._sink)
            if self._cancelled:  # while it was starting: it had nothing to cancel then
                self._cancel_in_loop()
        item = await self._sink.next()
        if item is _END:
            self._finish()
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._finish()
            raise item
        return item

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if _running_loop() is not None:
            raise RuntimeError(
                SYNC_IN_LOOP + " Use `async for` or `await response.__anext__()` instead.")
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


@dataclass(frozen=True)
class HandleOptions:
    """What `handle.options()` sets (Ray's `handle.handle_options`). Kept in one record,
    not as the handle's own attributes, so that a deployment method named `stream`,
    `method_name` or `session_id` is reached as `handle.stream` like any other."""

    method_name: str = "__call__"
    stream: bool = False
    multiplexed_model_id: str = ""
    session_id: str = ""  # as Ray: the callee's request context says it


class DeploymentHandle:
    """A handle to a deployment (Ray Serve's `DeploymentHandle`).

    Any attribute that is not the handle's own API (`options`, `remote`,
    `choose_replica`, `dispatch`, `shutdown`, `shutdown_async`, `deployment_name`,
    `app_name`, `deployment_id`, `handle_options`, `handle_id`, `init_options`, and
    Ray's internal `request_counter`, which surge has not) is a method of the deployment.
    """

    # Ray's handles keep InitHandleOptions here once their router starts; surge's handles
    # have none of their own (routers belong to the process's runtime, shared by all).
    init_options: None = None

    def __init__(self, deployment_name: str, app_name: str, *,
                 handle_options: HandleOptions | None = None,
                 _handle_id: str | None = None) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.deployment_id = DeploymentId(app_name, deployment_name)
        self.handle_options = handle_options or HandleOptions()
        # As Ray's: random per handle, shared with the handles `.options()` and
        # `.method` make from it; a handle rebuilt from a pickle gets a new one.
        self.handle_id = _handle_id or secrets.token_hex(4)

    def __repr__(self) -> str:
        options = self.handle_options
        return (f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r}, "
                f"method={options.method_name!r}, stream={options.stream})")

    def options(self, *, method_name: str | None = None, stream: bool | None = None,
                multiplexed_model_id: str | None = None, session_id: str | None = None,
                **_ray_only: Any) -> DeploymentHandle:
        old = self.handle_options
        return DeploymentHandle(self.deployment_name, self.app_name, handle_options=HandleOptions(
            old.method_name if method_name is None else method_name,
            old.stream if stream is None else stream,
            old.multiplexed_model_id if multiplexed_model_id is None else multiplexed_model_id,
            old.session_id if session_id is None else session_id), _handle_id=self.handle_id)

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("__"):  # Python's protocols; `_private` methods are callable
            raise AttributeError(name)
        if name == "request_counter":  # an attribute on Ray's handles, so never a method
            raise AttributeError(
                "'DeploymentHandle' has no 'request_counter': Ray's per-handle metrics "
                "Counter is internal; surge counts calls per deployment "
                "(serve_deployment_request_counter_total, docs/observability.md). Call a "
                "deployment method of that name with "
                "handle.options(method_name='request_counter').")
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any
               ) -> DeploymentResponse | DeploymentResponseGenerator:
        request = _Request(self, args, kwargs)
        if self.handle_options.stream:
            return DeploymentResponseGenerator(request)
        return DeploymentResponse(request)

    def choose_replica(self, *args: Any, **kwargs: Any
                       ) -> contextlib.AbstractAsyncContextManager[ReplicaSelection]:
        """`async with handle.method.choose_replica() as selection:` holds a slot on the
        replica this call would go to, until `dispatch(selection, ...)` uses it or the
        block ends (router/selection.py). The arguments do not steer surge's routing."""
        return choose_replica(current_runtime(), self.deployment_id, self.handle_options)

    def dispatch(self, selection: ReplicaSelection, *args: Any, **kwargs: Any
                 ) -> DeploymentResponse | DeploymentResponseGenerator:
        """Send the call to the replica `selection` names, in the slot it holds, with the
        method and options of the handle that chose it (awaited before the block ends)."""
        if not isinstance(selection, ReplicaSelection):
            raise TypeError(f"dispatch takes a ReplicaSelection, not {type(selection).__name__}")
        if selection._deployment_id != self.deployment_id:
            raise ValueError(
                "Cannot dispatch a selection created for a different deployment. This handle "
                f"is for {self.deployment_id}, but the selection was created for "
                f"{selection._deployment_id}.")
        if selection._dispatched:
            raise RuntimeError(f"ReplicaSelection for {selection.replica_id} has already "
                               "been dispatched.")
        selection._dispatched = True
        chooser = DeploymentHandle(self.deployment_name, self.app_name,
                                   handle_options=selection._options or HandleOptions(),
                                   _handle_id=self.handle_id)
        request = _Request(chooser, args, kwargs, selection._reservation)
        if chooser.handle_options.stream:
            return DeploymentResponseGenerator(request)
        return DeploymentResponse(request)

    def shutdown(self) -> None:
        """As Ray's, which stops the handle's own metrics pusher; calls still work after
        it. surge's router and its load reports belong to the process's runtime and are
        shared by every handle to the deployment, so there is nothing of this handle's
        own to stop: they end with the runtime (`serve.shutdown()`, process exit)."""

    async def shutdown_async(self) -> None:
        """`shutdown()` for a caller on an event loop (Ray's way to await it)."""
        self.shutdown()

    def __reduce__(self) -> tuple[Any, ...]:
        options = self.handle_options
        return (_rebuild_handle, (self.deployment_name, self.app_name, options.method_name,
                                  options.stream, options.multiplexed_model_id,
                                  options.session_id))


def _rebuild_handle(name: str, app: str, method: str, stream: bool, model_id: str,
                    session_id: str = "") -> DeploymentHandle:
    return DeploymentHandle(name, app, handle_options=HandleOptions(method, stream, model_id,
                                                                    session_id))
