"""One router's connection to the replica: its frames in, its requests run, answers out.

A request is admitted against the server's slots (replica/server.py) or answered
`Rejected` at once, so that the router retries elsewhere. Each admitted request runs as
its own task so that `Cancel` (client gone, timeout) can cancel it, except a handle call
to a plain `def` method: that one runs on the pool and its worker answers it
(sync_calls.py), so the slot counts are locked and a Cancel ends it through its
`Baton`. Either way a Cancel then cancels the handle calls the request made that have
not finished, and so on down the call tree (router/children.py: the request's context
carries them). A request's own stream (a streamed upload's parts, a WebSocket's
messages) reaches its task through an `Inbox` (replica/streams.py). Everything a
connection keeps of one request (its task or baton, calls, stream, window) is one
`Request` (replica/request.py), from admission until it is answered. Handle calls are
served here; HTTP requests by replica/http.py, WebSockets by replica/websocket.py, gRPC
calls by replica/grpc.py. Over TCP, a connection must prove it knows the instance's
token before anything else (transport/handshake.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import pickle
import secrets
import traceback
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from surge.observability.logs import request_id_var
from surge.replica.context import RequestContext, request_context_var
from surge.replica.grpc import pull_sender, serve_call
from surge.replica.grpc_context import RayServegRPCContext, gRPCInputStream
from surge.replica.http import serve_http
from surge.replica.request import Request
from surge.replica.sync_calls import Baton, Ran
from surge.replica.websocket import serve_websocket
from surge.router.children import ChildCalls, child_calls_var
from surge.transport.flow import SendWindow
from surge.transport.grpc_methods import unpack_metadata
from surge.transport.handshake import NONCE_BYTES, HandshakeFailed, ServerHandshake
from surge.transport.messages import (
    Call,
    Cancel,
    Credit,
    End,
    Failure,
    GrpcMessage,
    GrpcRequest,
    HttpBody,
    HttpRequest,
    HttpStart,
    Item,
    Message,
    Rejected,
    Result,
    WsClose,
    WsData,
)
from surge.transport.threadsafe import ThreadSafeProtocol

if TYPE_CHECKING:
    from surge.replica.server import ReplicaServer

__all__ = ["RouterConnection"]

log = logging.getLogger("surge.replica")

# A request's first frame, and the frames of a request under way (tuples made once: `A | B`
# builds a Union at every isinstance call, and every frame asks)
_REQUESTS = (HttpRequest, Call, GrpcRequest)
_REQUEST_FRAMES = (Credit, GrpcMessage, HttpBody, WsData, WsClose, Cancel)


def _dumps(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:
        import cloudpickle

        return bytes(cloudpickle.dumps(value, protocol=5))


def _failure(request_id: int, exc: BaseException) -> Failure:
    try:
        payload = _dumps(exc)
        pickle.loads(payload)
    except Exception:
        payload = b""
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return Failure(id=request_id, kind="user", message=message, payload=payload)


class RouterConnection(ThreadSafeProtocol):  # workers answer sync calls from their threads
    def __init__(self, server: ReplicaServer, token: str | None = None) -> None:
        super().__init__()
        self.server = server
        # Set until the router has proved it knows the instance's token.
        self.handshake = ServerHandshake(token, secrets.token_bytes(NONCE_BYTES)) \
            if token else None
        # The requests admitted and not yet answered, by id (replica/request.py); a
        # worker answering a sync call removes its own with `lock` held.
        self.requests: dict[int, Request] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)
        if self.handshake is not None:
            self.expect_token()
        else:
            self.server.greet(self)

    def message_received(self, message: Message) -> None:
        if self.handshake is not None:
            self._handshake_step(self.handshake, message)
            return
        if isinstance(message, _REQUESTS):
            self._request(message)
        elif isinstance(message, _REQUEST_FRAMES):
            request = self.requests.get(message.id)
            if request is None:
                return  # it ended already
            if isinstance(message, Credit):
                request.credit(message.amount)
            elif isinstance(message, GrpcMessage):
                if request.input is not None:
                    request.input.feed(message.body, message.more)
            elif isinstance(message, Cancel):
                self._cancel(request)
            elif request.inbox is not None:
                request.inbox.put(message)
        else:  # a router sends nothing else: whatever sent this is not one of ours
            log.warning("%s: closing a connection that sent a %s frame", self.server.name,
                        type(message).__name__)
            self.close()

    def _cancel(self, request: Request) -> None:
        if request.inbox is not None:
            request.inbox.close()
        if request.disconnected is not None:
            request.disconnected.set()
        if request.task is not None:
            request.task.cancel()
        self._cancel_sync(request)
        # After its task: the handler sees CancelledError, not its calls' errors.
        children, request.children = request.children, None
        if children is not None:
            children.cancel()

    def _request(self, message: HttpRequest | Call | GrpcRequest) -> None:
        if not self.server.admit():
            self.send(Rejected(id=message.id, ongoing=self.server.ongoing))
            return
        started = self.server.clock.monotonic()
        route = message.route_prefix if isinstance(message, HttpRequest) else message.method
        request = self.requests[message.id] = Request(message.id, route, started)
        if isinstance(message, HttpRequest):
            coro = (serve_websocket(self, request, message) if message.upgrade
                    else serve_http(self, request, message))
        elif isinstance(message, GrpcRequest):
            coro = self._grpc(request, message)
        else:
            if self._start_sync(request, message):
                return
            coro = self._call(request, message)
        self._run(request, coro)

    def _run(self, request: Request, coro: Coroutine[Any, Any, bool]) -> None:
        """Run a request as a task. Its context carries its `ChildCalls`: `coro` sets the
        variable first thing (serve_http, serve_websocket, `_grpc`, `_call`), in the
        task's own copy of this context, before any of the user's code runs. Set here,
        around `create_task`, it cost a set and a reset of this context as well."""
        if request.children is None:
            request.children = ChildCalls()
        task = request.task = self._loop.create_task(coro)
        task.add_done_callback(functools.partial(self._finished, request))

    def _handshake_step(self, handshake: ServerHandshake, message: Message) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # refused already: ignore the rest of what it sent
        try:
            for frame in handshake.receive(message):
                self.send(frame)
        except HandshakeFailed as exc:
            log.warning("%s: closing a connection that did not prove it knows the token "
                        "(%s)", self.server.name, exc)
            self.close()
            return
        if handshake.done:
            self.handshake = None
            self.token_accepted()
            self.server.greet(self)

    async def send_stream(self, message: HttpStart | HttpBody | Item, nbytes: int) -> None:
        """Send a non-final stream frame once the consumer's window allows it."""
        request = self.requests[message.id]  # (its task is running: it is there)
        window = request.window
        if window is None:
            window = request.window = SendWindow()
        while not window.open:  # the consumer is a window behind: wait for its credit
            waiter = request.waiter = self._loop.create_future()
            await waiter
        window.sent(nbytes)
        self.send(message)

    def _finished(self, request: Request, task: asyncio.Task[bool]) -> None:
        # what it left running goes on: its children are not cancelled
        if self.requests.get(request.id) is request:
            del self.requests[request.id]
        self.server.release()
        if task.cancelled():  # cancelled before it ran: its own handler never saw it
            self.send(Failure(id=request.id, kind="cancelled", message="request cancelled"))
        if self.server.metrics:
            ok = task.cancelled() or (task.exception() is None and task.result())
            elapsed = self.server.clock.monotonic() - request.started
            self.server.recorder.processed(request.route, elapsed * 1000.0, ok)

    def _start_sync(self, request: Request, message: Call) -> bool:
        """A unary call to a plain method: on the pool, answered by its worker."""
        sync = self.server.sync_calls
        method = None if message.stream else sync.method(message.method)
        if method is None:
            return False
        try:
            call = pickle.loads(message.payload)
        except Exception:
            return False  # the task reports it, as for any other call
        baton = Baton()
        children = ChildCalls()
        with self.lock:  # before its worker may answer and remove it
            request.baton, request.children = baton, children
        try:
            sync.run(method, call, message, baton, children,
                     functools.partial(self._answer_on_worker, request, message),
                     functools.partial(self._hand_back, request, message, baton))
        except RuntimeError:  # the pool is shut down: the replica is stopping
            with self.lock:
                request.baton = request.children = None
            return False
        return True

    def _answer_on_worker(self, request: Request, message: Call, ran: Ran) -> None:
        """(On the worker that ran the call, holding its baton.) Free the slot, then
        send the answer from this thread, then leave its latency for the loop."""
        error = ran.error
        frame: Result | Failure | None = None
        if error is None:
            try:
                frame = Result(id=message.id, payload=_dumps(ran.value))
            except Exception as exc:
                error = exc
        if error is not None:  # (the worker runs in the request's context: its id logs)
            log.error("%s.%s raised", self.server.name, message.method, exc_info=error)
            frame = _failure(message.id, error)
        assert frame is not None
        with self.lock:
            request.baton = request.children = None
            if self.requests.get(request.id) is request:
                del self.requests[request.id]
        self.server.release_from_worker(functools.partial(self.send, frame))
        if self.server.metrics:
            self.server.record_from_worker(
                message.method, (ran.finished - request.started) * 1000.0,
                "" if error is None else type(error).__name__)

    def _hand_back(self, request: Request, message: Call, baton: Baton, ran: Ran) -> None:
        """(The loop.) The method returned an awaitable: a task awaits it."""
        with self.lock:
            request.baton = None
        if not baton.take():
            return  # cancelled meanwhile: answered and freed already
        self._run(request, self._call(request, message, ran))

    def _cancel_sync(self, request: Request) -> None:
        """A Cancel, or the connection gone: end the call now if its worker has not."""
        with self.lock:
            baton, request.baton = request.baton, None
            if baton is not None and self.requests.get(request.id) is request:
                del self.requests[request.id]
        if baton is None or not baton.take():
            return
        self.send(Failure(id=request.id, kind="cancelled", message="request cancelled"))
        self.server.release()  # the worker may still be running it: a task's slot was too
        if self.server.metrics:
            elapsed = self.server.clock.monotonic() - request.started
            self.server.recorder.processed(request.route, elapsed * 1000.0, True)

    async def _result(self, message: Call, ran: Ran | None) -> Any:
        if ran is None:
            args, kwargs = pickle.loads(message.payload)
            return await self.server.user.call(message.method, args, kwargs)
        return await ran.value  # what a sync method returned to be awaited

    async def _call(self, request: Request, message: Call, ran: Ran | None = None) -> bool:
        """Run a handle call (`ran`: a sync method's awaitable outcome); False when the
        user's code raised."""
        rid = message.id
        child_calls_var.set(request.children)  # (this task's context: see _run)
        request_id_var.set(message.request_id)  # this task's log lines carry it
        request_context_var.set(RequestContext(
            "", message.request_id, self.server.app, message.model_id,
            session_id=message.session_id))
        try:
            result = await self._result(message, ran)
            if message.stream:
                async for item in self.server.user.iterate(result):
                    payload = _dumps(item)
                    await self.send_stream(Item(id=rid, payload=payload), len(payload))
                self.send(End(id=rid))
            else:
                self.send(Result(id=rid, payload=_dumps(result)))
        except asyncio.CancelledError:
            self.send(Failure(id=rid, kind="cancelled", message="request cancelled"))
        except Exception as exc:
            log.exception("%s.%s raised", self.server.name, message.method)
            self.send(_failure(rid, exc))
            if self.server.metrics:
                self.server.recorder.exception(message.method, type(exc).__name__)
            return False
        return True

    async def _grpc(self, request: Request, message: GrpcRequest) -> bool:
        """Serve a gRPC call (replica/grpc.py); False when the user's code raised."""
        rid = message.id
        child_calls_var.set(request.children)  # (this task's context: see _run)
        request_id_var.set(message.request_id)
        context = RayServegRPCContext(list(unpack_metadata(message.metadata)), message.client)
        request_context = RequestContext(message.method, message.request_id,
                                         self.server.app, message.model_id,
                                         client=message.client)
        request_context.grpc_context = context
        request_context_var.set(request_context)
        stream = None
        if message.streamed:
            stream = request.input = gRPCInputStream(None, pull_sender(rid, self.send))
        ok = await serve_call(message, self.server.user, self.server.grpc, context, stream,
                              self.send, self.send_stream)
        if not ok and self.server.metrics:
            self.server.recorder.exception(message.method, "gRPCError")
        return ok

    def closed(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        with self.lock:
            requests = list(self.requests.values())
        for request in requests:
            if request.inbox is not None:
                request.inbox.close()
        for request in requests:
            request.waiter = None  # their tasks are cancelled below
            if request.disconnected is not None:
                request.disconnected.set()
        for request in requests:
            if request.input is not None:
                request.input.cancel()
        for request in requests:
            if request.task is not None:
                request.task.cancel()
        with self.lock:
            children = [request.children for request in requests]
            for request in requests:
                request.children = None
        for request in requests:
            self._cancel_sync(request)
        for calls in children:
            if calls is not None:
                calls.cancel()
