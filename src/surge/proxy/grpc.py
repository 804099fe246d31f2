"""gRPC ingress: Ray Serve's gRPC proxy on surge's data path, bytes through.

The proxy process serves gRPC beside its HTTP server, on the same event loop, on
`gRPCOptions.port` (every worker of a node binds it with SO_REUSEPORT), with HTTP/2 of
its own (proxy/h2.py, proxy/grpc_wire.py: no grpcio server, whose per-call costs were
most of the proxy's CPU). It knows the methods of the servicers named in
`grpc_servicer_functions` (learned by calling each with a recording server,
transport/grpc_methods.py) by path and kind only: a request's bytes go to the replica in
a `GrpcRequest` frame and the response's bytes come back, so a message is parsed once,
in the replica, the only process that needs the user's `_pb2`.

A call names its application in the `application` metadata (any name, or none, picks the
only one) and reaches the deployment's method named like the RPC, through the app's
ingress Router: the admission path, queue limits and backpressure of HTTP. Everything
is decided when the call's headers (and, for a unary request, its message) are in,
synchronously: the route, the refusals (NOT_FOUND, UNAUTHENTICATED, UNAVAILABLE while
draining), the submission. Its deadline (the client's `grpc-timeout`, capped by
`request_timeout_s`) becomes the request's timeout, and a client that resets the stream
or goes away cancels it at the replica. Client streams flow only as the replica pulls
them (`Pull`), the stream's HTTP/2 window given back message by message; response
streams are flow-controlled like HTTP's (transport/flow.py): a message's bytes are
acknowledged to the replica once the client's windows took them. Statuses are decided in
proxy/grpc_status.py; `request_id` always comes back in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from surge.errors import BackPressureError, ConfigError, DeploymentUnavailableError
from surge.model import DeploymentId, RouteTable, RouteTarget
from surge.policy.auth import check_bearer
from surge.proxy.grpc_local import (
    DRAINING,
    HEALTH_WATCH,
    NOT_SERVING,
    REFLECTION,
    SERVING,
    LocalServices,
    status_message,
)
from surge.proxy.grpc_status import (
    CODE_NAMES,
    Code,
    Timeout,
    choose_app,
    metadata_value,
    status_of,
    truncate,
)
from surge.proxy.grpc_wire import (
    RESPONSE_HEADERS,
    MessageReader,
    Metadata,
    WireError,
    frame_message,
    http_error,
    read_head,
    trailers,
)
from surge.proxy.h2 import H2Connection, H2Error
from surge.proxy.hpack import Header
from surge.router.replica_link import Pending
from surge.transport.grpc_methods import GrpcMethod, methods_of, pack_metadata, unpack_metadata
from surge.transport.messages import Failure, GrpcEnd, GrpcMessage, GrpcRequest, Item, Message, Pull

if TYPE_CHECKING:
    from surge.proxy.server import Proxy
    from surge.router.router import Router

__all__ = ["GrpcConnection", "GrpcIngress", "start_grpc"]

log = logging.getLogger("surge.proxy")

# Ray Serve's message size limit, both ways: 2 GiB - 1 (grpc's own default is 4 MiB in).
MAX_MESSAGE_BYTES = 2**31 - 1
# Calls one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); a
# router's queue limits bound what they cost further in.
MAX_STREAMS = 1024
NOT_FOUND_METHOD = "Method not found!"  # grpc's own details for an unknown method


class _Call:
    """One RPC: what its stream carried so far, and the router's sink for it."""

    __slots__ = ("body", "client_done", "conn", "end_sent", "ended", "headers_sent", "inbox",
                 "labels", "local", "metadata", "method", "pending", "pulls", "queue",
                 "reader", "request_id", "router", "started", "stream_id", "submitted",
                 "target", "task", "timer", "unacked")

    def __init__(self, conn: GrpcConnection, stream_id: int, started: float) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.started = started
        self.request_id = ""
        self.metadata: Metadata = ()
        self.labels: tuple[str, str, str] | None = None  # counted under these when it ends
        self.method: GrpcMethod | None = None
        self.target: RouteTarget | None = None
        self.local = ""  # the path of a local service's method
        self.reader = MessageReader(MAX_MESSAGE_BYTES)
        self.body: bytes | None = None  # a unary request's message
        self.inbox: deque[bytes] = deque()  # client stream messages not yet pulled
        self.client_done = False  # the client's stream ended
        self.end_sent = False  # the replica was told so
        self.pulls = 0  # client stream messages the replica asked for, not yet sent
        self.pending: Pending | None = None
        self.router: Router | None = None
        self.submitted = False
        self.timer: asyncio.TimerHandle | None = None
        self.headers_sent = False
        self.unacked = 0  # response bytes written but not yet acknowledged to the replica
        self.ended = False
        self.queue: asyncio.Queue[bytes | None] | None = None  # reflection's requests
        self.task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        path = self.method.path if self.method is not None else self.local
        return f"<_Call {self.stream_id} {path} ended={self.ended}>"

    def deliver(self, message: Message) -> None:
        self.conn.delivered(self, message)

    def fail(self, exc: BaseException) -> None:
        self.conn.failed(self, exc)


class GrpcIngress:
    """What every gRPC connection of the proxy shares: the methods, the apps, the limits."""

    def __init__(self, proxy: Proxy, methods: Mapping[str, GrpcMethod],
                 request_timeout_s: float | None, health: bool = False,
                 reflection: bool = False) -> None:
        self.proxy = proxy
        self.loop = proxy.loop
        self.request_timeout_s = request_timeout_s
        self.methods = dict(methods)
        self.max_header_bytes = proxy.spec.max_header_bytes
        self.ongoing = 0  # calls submitted and not yet ended
        self.connections: set[GrpcConnection] = set()
        self.watchers: set[_Call] = set()  # Health/Watch streams told SERVING
        self.local = LocalServices(lambda: self.apps(), {m.service for m in methods.values()},
                                   lambda: self.proxy.site.draining, health, reflection)
        self._apps: dict[str, RouteTarget] = {}
        self._table: RouteTable | None = None
        self._routers: dict[tuple[str, str], Router] = {}

    def __repr__(self) -> str:
        return (f"<GrpcIngress methods={len(self.methods)} apps={len(self._apps)} "
                f"connections={len(self.connections)} ongoing={self.ongoing}>")

    def protocol(self) -> GrpcConnection:
        return GrpcConnection(self)

    def apps(self) -> dict[str, RouteTarget]:
        table = self.proxy.runtime.routes
        if table is not self._table:
            self._table = table
            self._apps = {target.app: target for target in table.targets}
        return self._apps

    def router(self, target: RouteTarget) -> Router:
        key = (target.app, target.deployment)
        router = self._routers.get(key)
        if router is None:
            router = self._routers[key] = self.proxy.runtime.router(DeploymentId(*key))
        return router

    def drain(self) -> None:
        """No new calls on any connection (GOAWAY); health watchers hear NOT_SERVING."""
        for call in list(self.watchers):
            call.conn.send_message(call, status_message(NOT_SERVING), ack=False)
        self.watchers.clear()
        for connection in list(self.connections):
            connection.going_away()

    def close(self) -> None:
        for connection in list(self.connections):
            connection.close()

    def record(self, call: _Call, code: int) -> None:
        if call.labels is None:
            return
        name = CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else str(code)
        latency_ms = (self.proxy.now() - call.started) * 1000.0
        self.proxy.record_grpc(call.labels, code, name, latency_ms, call.request_id)


class GrpcConnection(asyncio.Protocol):
    """The asyncio shell of one HTTP/2 connection, and the calls on it."""

    __slots__ = ("_flush_scheduled", "_preface_timer", "calls", "h2", "holding", "ingress",
                 "peer", "transport", "writing_paused")

    def __init__(self, ingress: GrpcIngress) -> None:
        self.ingress = ingress
        self.h2 = H2Connection(self, MAX_STREAMS, ingress.max_header_bytes)
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = ""  # as grpc names it: "ipv4:127.0.0.1:5555"
        self.writing_paused = False
        self.holding: list[_Call] = []  # calls with acknowledgements held while paused
        self._flush_scheduled = False
        self._preface_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<GrpcConnection {self.peer} calls={len(self.calls)} {self.h2!r}>"

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else \
                f"ipv4:{peer[0]}:{peer[1]}"
        ingress = self.ingress
        if len(ingress.connections) >= ingress.proxy.spec.max_connections:
            self.h2.goaway()  # too many connections: this one serves nothing
            self._flush()
            transport.close()
            return
        ingress.connections.add(self)
        if ingress.proxy.site.draining:
            self.h2.goaway()
        # A client that never starts HTTP/2 is closed as slow headers are over HTTP/1.1.
        self._preface_timer = ingress.loop.call_later(
            ingress.proxy.spec.request_header_timeout_s, self._no_preface)
        self._flush()

    def _no_preface(self) -> None:
        self._preface_timer = None
        log.debug("gRPC connection %s closed: no HTTP/2 preface in time", self.peer)
        self.close()

    def data_received(self, data: bytes) -> None:
        try:
            self.h2.receive(data)
            if self._preface_timer is not None and self.h2.started:
                self._preface_timer.cancel()
                self._preface_timer = None
        except H2Error as exc:
            log.debug("gRPC connection %s closed: %s", self.peer, exc)
            self._flush()
            self.close()
            return
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ingress.connections.discard(self)
        self.transport = None
        if self._preface_timer is not None:
            self._preface_timer.cancel()
            self._preface_timer = None
        for call in list(self.calls.values()):
            self._abandon(call)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        holding, self.holding = self.holding, []
        for call in holding:
            self._acknowledge(call)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def going_away(self) -> None:
        self.h2.goaway()
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self.h2.out
        if out:
            if self.transport is not None:
                self.transport.writelines(out)
            out.clear()

    def _flush_soon(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.ingress.loop.call_soon(self._flush)

    # -- h2.Listener -----------------------------------------------------------------------

    def headers(self, stream_id: int, headers: list[Header], size: int,
                end_stream: bool) -> None:
        """A call begins: decide where it goes, or answer it now."""
        ingress = self.ingress
        call = self.calls[stream_id] = _Call(self, stream_id, ingress.proxy.now())
        head = read_head(headers)
        if head.errors:
            error = head.errors[0]
            if error.code < 0:  # not gRPC at all: an HTTP status
                self.calls.pop(stream_id)
                self.h2.send_headers(stream_id, http_error(-error.code, str(error)), True)
                return
            self.end(call, error.code, str(error))
            return
        metadata = call.metadata = head.metadata
        call.reader.encoding = head.encoding
        call.request_id = metadata_value(metadata, "request_id") or str(uuid.uuid4())
        if size > ingress.max_header_bytes:
            self.end(call, Code.RESOURCE_EXHAUSTED, f"request headers of {size} bytes exceed "
                                                   f"the limit of {ingress.max_header_bytes}")
            return
        path = head.path
        method = ingress.methods.get(path)
        if method is None:
            if ingress.local.serves(path):
                call.local = path
                if path == REFLECTION:
                    call.queue = asyncio.Queue()
                    call.task = ingress.loop.create_task(self._reflect(call))
            else:
                self.end(call, 12, NOT_FOUND_METHOD)  # UNIMPLEMENTED, as grpc says it
            return
        target, not_found = choose_app(metadata_value(metadata, "application"), ingress.apps())
        if target is None:
            call.labels = ("", "", path)
            self.end(call, Code.NOT_FOUND, not_found)
            return
        call.labels = (target.app, target.deployment, path)
        if target.auth is not None:  # the application's bearer tokens, as over HTTP
            refusal = check_bearer([value.encode() for key, value in metadata
                                    if key == "authorization" and isinstance(value, str)],
                                   target.auth.digests)
            if refusal is not None:
                self.end(call, Code.UNAUTHENTICATED, refusal.message.decode())
                return
        if ingress.proxy.site.draining:
            self.end(call, Code.UNAVAILABLE, DRAINING)
            return
        call.method, call.target = method, target
        timeout, limit = head.timeout_s, ingress.request_timeout_s
        if limit is not None:
            timeout = limit if timeout is None else min(timeout, limit)
        if timeout is not None:
            call.timer = ingress.loop.call_later(timeout, self._timed_out, call, timeout)
        if method.request_streaming:
            self._submit(call, b"")
        if end_stream:
            self.data(stream_id, b"", True)

    def data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.ended:
            self.h2.consumed(stream_id, len(data))
            return
        try:
            messages = call.reader.feed(data) if data else []
            if end_stream and call.reader.partial:
                raise WireError(Code.INTERNAL, "the client's stream ended inside a message")
        except WireError as exc:
            self.end(call, exc.code, str(exc))
            return
        streamed = call.method.request_streaming if call.method is not None else \
            call.local == REFLECTION
        if streamed:
            if call.queue is not None:  # reflection takes every message at once
                self.h2.consumed(stream_id, len(data))
                for message in messages:
                    call.queue.put_nowait(message)
                if end_stream:
                    call.queue.put_nowait(None)
                return
            call.inbox.extend(messages)  # their window comes back as the replica pulls
            call.client_done = end_stream
            self._pump(call)
            return
        self.h2.consumed(stream_id, len(data))
        for message in messages:
            if call.body is not None:
                self.end(call, Code.INTERNAL, "a unary call sent more than one message")
                return
            call.body = message
        if not end_stream:
            return
        if call.body is None:
            self.end(call, Code.INTERNAL, "a unary call sent no message")
        elif call.local:
            self._answer_locally(call, call.body)
        else:
            self._submit(call, call.body)

    def reset(self, stream_id: int, code: int) -> None:
        """The client cancelled the call (or broke its stream's flow control)."""
        call = self.calls.get(stream_id)
        if call is not None:
            self._abandon(call)

    def drained(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None and call.unacked:
            self._acknowledge(call)

    # -- the call's way through the router -------------------------------------------------

    def _submit(self, call: _Call, body: bytes) -> None:
        method, target = call.method, call.target
        assert method is not None and target is not None
        metadata = call.metadata
        request = GrpcRequest(0, method.path, method.servicer, pack_metadata(metadata), body,
                              call.request_id, target.app,
                              metadata_value(metadata, "multiplexed_model_id"), self.peer,
                              method.request_streaming)
        ingress = self.ingress
        pending = call.pending = Pending(request, call)
        router = call.router = ingress.router(target)
        try:
            router.submit(pending)
        except (BackPressureError, DeploymentUnavailableError) as exc:
            code, details = status_of(exc, call.request_id)
            reason = "backpressure" if isinstance(exc, BackPressureError) else "unavailable"
            ingress.proxy.recorder.rejected(target.app, target.deployment, reason)
            self.end(call, code, details)
            return
        call.submitted = True
        ingress.ongoing += 1

    def delivered(self, call: _Call, message: Message) -> None:
        """A frame of the call's answer, from its replica."""
        if call.ended:
            return
        if isinstance(message, Item):
            self.send_message(call, message.payload, ack=True)
        elif isinstance(message, Pull):
            call.pulls += message.count
            self._pump(call)
        elif isinstance(message, GrpcEnd):
            if message.code == Code.OK:
                if message.has_body:
                    self.send_message(call, message.body, ack=False)
                self.end(call, Code.OK, "", _trailers(call.request_id, message.trailers))
            else:  # the user's method failed, or set its own code
                self.end(call, message.code, truncate(message.details),
                         _trailers(call.request_id, message.trailers))
        elif isinstance(message, Failure):
            self.failed(call, _failure(message))
            return
        else:
            self.failed(call, RuntimeError(f"a gRPC call cannot take {type(message).__name__}"))
            return
        self._flush_soon()

    def failed(self, call: _Call, exc: BaseException) -> None:
        if not call.ended:
            self.end(call, *status_of(exc, call.request_id))
            self._flush_soon()

    def _pump(self, call: _Call) -> None:
        """Send the client's stream as the replica pulls it."""
        pending = call.pending
        link = pending.link if pending is not None else None
        if link is None or pending is None or pending.cancelled:
            return
        request_id = pending.message.id
        while call.pulls > 0:
            if call.inbox:
                body = call.inbox.popleft()
                link.send(GrpcMessage(request_id, body, True))
                self.h2.consumed(call.stream_id, len(body) + 5)
            elif call.client_done and not call.end_sent:
                call.end_sent = True
                link.send(GrpcMessage(request_id, b"", False))
            else:
                return
            call.pulls -= 1

    def send_message(self, call: _Call, body: bytes, ack: bool) -> None:
        """One response message; `ack`: tell the replica once the client took it."""
        h2, stream_id = self.h2, call.stream_id
        if not call.headers_sent:
            call.headers_sent = True
            h2.send_headers(stream_id, RESPONSE_HEADERS)
        written = True
        for part in frame_message(body):
            written = h2.send_data(stream_id, part) and written
        if ack:
            call.unacked += len(body)
            if written:
                self._acknowledge(call)
        self._flush_soon()

    def _acknowledge(self, call: _Call) -> None:
        if self.writing_paused:  # the socket's buffer is full: the replica waits
            self.holding.append(call)
            return
        pending, unacked = call.pending, call.unacked
        call.unacked = 0
        if pending is not None and unacked:
            pending.consumed(unacked)

    def end(self, call: _Call, code: int, details: str, metadata: Metadata | None = None) -> None:
        """The call's last word: its status and trailing metadata."""
        if call.ended:
            return
        if metadata is None:
            metadata = (("request_id", call.request_id),) if call.request_id else ()
        block = trailers(code, details, metadata, trailers_only=not call.headers_sent)
        self.h2.send_headers(call.stream_id, block, end_stream=True)
        self._finish(call, code)

    def _finish(self, call: _Call, code: int) -> None:
        call.ended = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        # Its messages go now, not with a collection of the call's cycle with its Pending
        # (a 10 MB request would wait for the garbage collector in every proxy).
        call.pending = call.router = call.body = None
        call.inbox.clear()
        self.calls.pop(call.stream_id, None)
        ingress = self.ingress
        ingress.watchers.discard(call)
        if call.task is not None:
            call.task.cancel()
        if call.submitted:
            ingress.ongoing -= 1
        ingress.record(call, code)

    def _abandon(self, call: _Call) -> None:
        """The client is gone: stop the call where it is."""
        if call.ended:
            return
        self.h2.reset(call.stream_id, 8)  # CANCEL (a no-op once the client reset it)
        self._cancel(call)
        self._finish(call, Code.CANCELLED)

    def _cancel(self, call: _Call) -> None:
        if call.pending is not None and call.router is not None:
            call.router.cancel(call.pending)

    def _timed_out(self, call: _Call, timeout_s: float) -> None:
        call.timer = None
        if not call.ended:
            self._cancel(call)
            self.end(call, *status_of(Timeout(round(timeout_s, 3)), call.request_id))
            self._flush()

    # -- local services --------------------------------------------------------------------

    def _answer_locally(self, call: _Call, body: bytes) -> None:
        local = self.ingress.local
        if call.local == HEALTH_WATCH:
            status = local.serving(body)
            self.send_message(call, status_message(status), ack=False)
            if status == SERVING:
                self.ingress.watchers.add(call)  # NOT_SERVING follows when draining
            return  # the stream stays open until the client leaves
        code, details, answer = local.unary[call.local](body)
        if code == Code.OK:
            self.send_message(call, answer, ack=False)
        self.end(call, code, details)

    async def _reflect(self, call: _Call) -> None:
        queue = call.queue
        assert queue is not None

        async def requests() -> AsyncIterator[bytes]:
            while (body := await queue.get()) is not None:
                yield body

        try:
            async for response in self.ingress.local.reflect(requests()):
                self.send_message(call, response, ack=False)
            self.end(call, Code.OK, "")
        except Exception as exc:
            self.end(call, Code.INTERNAL, truncate(str(exc)))
        self._flush()


def _trailers(request_id: str, packed: list[tuple[str, str]]) -> Metadata:
    """`request_id` first, then the user's trailers (a user's own request_id wins)."""
    user = unpack_metadata(packed)
    if any(key == "request_id" for key, _ in user):
        return user
    return (("request_id", request_id), *user)


def _failure(message: Failure) -> BaseException:
    from surge.errors import RequestCancelledError

    if message.kind == "cancelled":
        return RequestCancelledError(message.message)
    return RuntimeError(message.message)


def load_methods(functions: tuple[str, ...]) -> dict[str, GrpcMethod]:
    methods: dict[str, GrpcMethod] = {}
    for path in functions:
        methods.update(methods_of(path))
    return methods


async def start_grpc(proxy: Proxy, host: str, port: int, functions: tuple[str, ...],
                     request_timeout_s: float | None, reflection: bool = False,
                     health: bool = False) -> tuple[asyncio.Server, GrpcIngress, int] | None:
    """Serve gRPC for `proxy` (None: no servicer functions, so no server, as Ray). With
    the HTTP port's certificate (http_options.ssl_*), the gRPC port serves TLS only
    (ALPN h2), with the same client-certificate mode.

    Raises ConfigError when a servicer function cannot be used or the port is taken."""
    if not functions:
        return None
    from surge.proxy.server import bind
    from surge.proxy.tls import server_context

    methods = load_methods(functions)
    ingress = GrpcIngress(proxy, methods, request_timeout_s, health, reflection)
    spec = proxy.spec
    tls = None
    if spec.ssl_certfile is not None:
        tls = server_context(spec)
        tls.set_alpn_protocols(["h2"])
    try:
        sock = bind(host, port, reuse_port=True)
    except OSError as exc:
        raise ConfigError(f"cannot listen for gRPC on {host}:{port}: "
                          f"{exc.strerror or exc}") from None
    server = await proxy.loop.create_server(
        ingress.protocol, sock=sock, backlog=4096, ssl=tls,
        ssl_handshake_timeout=spec.request_header_timeout_s if tls is not None else None)
    proxy.grpc = ingress
    return server, ingress, sock.getsockname()[1]
