"""DeploymentResponse and DeploymentResponseGenerator: one handle call, from its
submission to its answer.

`handle.remote()` returns a `DeploymentResponse` at once; `.result(timeout_s=)` blocks
for it (outside an event loop) and `await response` awaits it. With
`.options(stream=True)` it returns a `DeploymentResponseGenerator` to iterate. A
`DeploymentResponse` passed as an argument is resolved before the call is sent. What
the answer frames become is router/answers.py's.

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
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle

from surge.errors import GetTimeoutError, RayServeException, RequestCancelledError
from surge.model import DeploymentId
from surge.router.answers import END, StreamSink, UnarySink
from surge.router.children import child_calls_var
from surge.router.replica_link import Pending, ReplicaLink, Reservation
from surge.router.runtime import RouterRuntime, current_runtime
from surge.transport.messages import Call

if TYPE_CHECKING:
    from surge.router.handle import HandleOptions

__all__ = ["DeploymentResponse", "DeploymentResponseGenerator", "HandleCall",
           "new_request_id"]

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


async def _resolve(value: Any) -> Any:
    if isinstance(value, DeploymentResponse):
        return await value
    return value


_ids = itertools.count(1)
_ID_PREFIX = os.urandom(4).hex()


def new_request_id() -> str:
    """A handle call's request id (unique per process run; logs and contexts carry it)."""
    return f"{_ID_PREFIX}-h{next(_ids):x}"


class HandleCall:
    """Everything needed to send one call, built on the caller's thread."""

    __slots__ = ("args", "deployment", "kwargs", "method", "model_id", "request_id",
                 "reservation", "runtime", "session_id", "stream")

    def __init__(self, deployment: DeploymentId, options: HandleOptions, args: tuple[Any, ...],
                 kwargs: dict[str, Any], reservation: Reservation | None = None) -> None:
        self.runtime = current_runtime()
        self.reservation = reservation  # a slot choose_replica holds: sent there, in it
        self.deployment = deployment
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

    def _pending(self, sink: UnarySink | StreamSink) -> Pending:
        pending = Pending(Call(id=0, method=self.method, payload=dumps((self.args, self.kwargs)),
                               stream=self.stream, model_id=self.model_id,
                               request_id=self.request_id, session_id=self.session_id), sink)
        if isinstance(sink, StreamSink):
            sink.pending = pending
        return pending

    def submit_now(self, sink: UnarySink | StreamSink) -> Pending | None:
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

    def submit_from_thread(self, sink: UnarySink, own_link: bool) -> Pending | None:
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

    async def _start(self, sink: UnarySink | StreamSink) -> Pending | None:
        """Resolve response arguments and wait for a replica set, then send."""
        self.args = tuple([await _resolve(a) for a in self.args])
        self.kwargs = {k: await _resolve(v) for k, v in self.kwargs.items()}
        router = self.runtime.router(self.deployment)
        if not router.ready.is_set():
            await router.ready.wait()
        return self.submit_now(sink)

    async def unary(self) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending = await self._start(UnarySink(future))
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


def _on_loop(runtime: RouterRuntime, callback: Callable[[], None]) -> None:
    """Run `callback` on the runtime's loop: now when this is its thread, else soon."""
    if _in_loop(runtime):
        callback()
    else:
        runtime.loop.call_soon_threadsafe(callback)


class DeploymentResponse:
    """The future result of one handle call.

    In the common case (arguments ready, replica set known, a replica with room) the
    call is submitted to the router directly, from the loop or from the caller's
    thread, and the result lands in a future, with no task per call.
    """

    def __init__(self, request: HandleCall) -> None:
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
                self._pending = request.submit_now(UnarySink(self._task))
        else:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._task = future
            # Running from the start, as it may be answered before this thread goes on.
            future.set_running_or_notify_cancel()
            # No event loop on this thread: it will wait in .result(), on its own link.
            self._pending = request.submit_from_thread(UnarySink(future), running is None)
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
            self._pending = self._request.submit_now(UnarySink(self._task))

    def _start_slow(self) -> None:
        """(The loop.) A task resolves the arguments, waits for a replica set and sends;
        its outcome is copied into the response's future, which a cancel fails at once
        with RequestCancelledError (never a bare CancelledError for the awaiting caller)."""
        future = self._task
        task = self._inner = self._runtime.loop.create_task(self._request.unary())

        def copy(done: asyncio.Future[Any]) -> None:
            sink = UnarySink(future)
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
        _on_loop(self._runtime, self._cancel_in_loop)

    def cancelled(self) -> bool:
        """Whether `cancel()` was called (the call may still have finished first)."""
        return self._cancelled

    def _cancel_in_loop(self) -> None:
        if self._pending is not None:
            self._runtime.router(self._request.deployment).cancel(self._pending)
        elif self._inner is not None:
            self._inner.cancel()
        UnarySink(self._task).fail(self._cancelled_error())


class DeploymentResponseGenerator:
    """Iterate (sync or async) over what a generator method yields."""

    def __init__(self, request: HandleCall) -> None:
        self._runtime = request.runtime
        self._request = request
        self._sink: StreamSink | None = None
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
        _on_loop(self._runtime, self._cancel_in_loop)

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
            self._sink = StreamSink()
            await self._request._start(self._sink)
            if self._cancelled:  # while it was starting: it had nothing to cancel then
                self._cancel_in_loop()
        item = await self._sink.next()
        if item is END:
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
