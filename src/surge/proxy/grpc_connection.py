"""The asyncio shell of one gRPC connection: HTTP/2 (codecs/h2.py) in, calls through
their routers, answers out.

Everything about a call is decided when its headers (and, for a unary request, its
message) are in, synchronously: the route, the refusals (NOT_FOUND, UNAUTHENTICATED,
UNAVAILABLE while draining, UNIMPLEMENTED), the submission. Its deadline (the client's
`grpc-timeout`, capped by `request_timeout_s`) is armed then; when it passes, or the
client resets the stream or goes away, the call is cancelled at its router. A call
ends exactly once (`end`, or `_abandon` when the client left), and every end that the
replica did not give cancels it there.

Flow control: a client stream's messages wait in the call until the replica pulls them
(`Pull`), and only their bytes are kept from the client's HTTP/2 window (the rest of the
stream's bytes go back as they arrive, so a message larger than the window still gets
in); a response message is acknowledged to the replica (`Pending.consumed`) once the
client's windows took it and the socket is not full. While the socket is full the
connection reads nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from surge.codecs.grpc_wire import (
    ACCEPT_ENCODING,
    RESPONSE_HEADERS,
    Metadata,
    WireError,
    frame_message,
    http_error,
    read_head,
    trailers,
)
from surge.codecs.h2 import H2Connection, H2Error
from surge.codecs.h2_send import HeldLimitError
from surge.codecs.hpack import Header
from surge.errors import BackPressureError, DeploymentUnavailableError
from surge.policy.auth import check_bearer
from surge.proxy.grpc_call import GrpcCall, call_trailers, failure_of
from surge.proxy.grpc_local import DRAINING, HEALTH_WATCH, REFLECTION, SERVING, status_message
from surge.proxy.grpc_status import Code, Timeout, choose_app, metadata_value, status_of, truncate
from surge.router.replica_link import Pending, is_final
from surge.transport.grpc_methods import pack_metadata
from surge.transport.messages import Failure, GrpcEnd, GrpcMessage, GrpcRequest, Item, Message, Pull

if TYPE_CHECKING:
    from surge.proxy.grpc import GrpcIngress

__all__ = ["MAX_STREAMS", "REFLECTION_QUEUE", "GrpcConnection"]

log = logging.getLogger("surge.proxy")

# Calls one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); a
# router's queue limits bound what they cost further in.
MAX_STREAMS = 1024
NOT_FOUND_METHOD = "Method not found!"  # grpc's own details for an unknown method
UNIMPLEMENTED = 12
# Reflection requests a stream may have waiting for their answers: a reflection client
# asks one question at a time, so only one that sends and never reads comes near it.
REFLECTION_QUEUE = 64
_LINGERING = frozenset((HEALTH_WATCH, REFLECTION))  # local streams a drain does not wait for


class GrpcConnection(asyncio.Protocol):
    __slots__ = ("_flush_scheduled", "_preface_timer", "calls", "h2", "holding", "ingress",
                 "peer", "transport", "writing_paused")

    def __init__(self, ingress: GrpcIngress) -> None:
        self.ingress = ingress
        self.h2 = H2Connection(self, MAX_STREAMS, ingress.max_header_bytes)
        self.calls: dict[int, GrpcCall] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = ""  # as grpc names it: "ipv4:127.0.0.1:5555"
        self.writing_paused = False
        self.holding: dict[GrpcCall, None] = {}  # acknowledgements held while paused
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
        self.holding.clear()
        self.h2.close()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.transport is not None:
            self.transport.pause_reading()  # nothing more in while nothing goes out

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.transport is not None:
            self.transport.resume_reading()
        holding, self.holding = self.holding, {}
        for call in holding:
            self._acknowledge(call)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def going_away(self) -> None:
        self.h2.goaway()
        self._flush()

    def busy(self) -> bool:
        """Calls are open or answers still held. A health watch or a reflection stream
        does not count: it stays open as long as its client likes (a watch has heard
        NOT_SERVING by then), and draining must not wait out its timeout for it."""
        return self.h2.busy() and (bool(self.h2.blocked) or any(
            call.local not in _LINGERING for call in self.calls.values()))

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self.h2.out
        if out:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.writelines(out)
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
        call = self.calls[stream_id] = GrpcCall(self, stream_id, ingress.proxy.now())
        if size > ingress.max_header_bytes:  # before reading them: they were not all kept
            self.end(call, Code.RESOURCE_EXHAUSTED, f"request headers of {size} bytes exceed "
                                                   f"the limit of {ingress.max_header_bytes}")
            return
        head = read_head(headers)
        if head.errors:
            error = head.errors[0]
            if error.code < 0:  # not gRPC at all: an HTTP status
                self.calls.pop(stream_id)
                self.h2.send_headers(stream_id, http_error(-error.code, str(error)), True)
                return
            extra = ((("grpc-accept-encoding", ACCEPT_ENCODING),)
                     if error.code == UNIMPLEMENTED else ())
            self.end(call, error.code, str(error), extra)
            return
        metadata = call.metadata = head.metadata
        call.reader.encoding = head.encoding
        call.request_id = metadata_value(metadata, "request_id") or str(uuid.uuid4())
        timeout, limit = head.timeout_s, ingress.request_timeout_s
        path = head.path
        method = ingress.methods.get(path)
        if method is None:
            if not ingress.local.serves(path):
                self.end(call, UNIMPLEMENTED, NOT_FOUND_METHOD)
                return
            call.local = path
            if path == REFLECTION:
                call.queue = asyncio.Queue(REFLECTION_QUEUE)
                call.task = ingress.loop.create_task(self._reflect(call))
        else:
            target, not_found = choose_app(metadata_value(metadata, "application"),
                                           ingress.apps())
            if target is None:
                call.labels = ("", "", path)
                self.end(call, Code.NOT_FOUND, not_found)
                return
            call.labels = (target.app, target.deployment, path)
            if target.auth is not None:  # the application's bearer tokens, as over HTTP
                refusal = check_bearer([value.encode("latin-1") for key, value in metadata
                                        if key == "authorization" and isinstance(value, str)],
                                       target.auth.digests)
                if refusal is not None:
                    self.end(call, Code.UNAUTHENTICATED, refusal.message.decode())
                    return
            if ingress.proxy.site.draining:
                self.end(call, Code.UNAVAILABLE, DRAINING)
                return
            call.method, call.target = method, target
            if limit is not None:  # the app's limit; a local call has the client's only
                timeout = limit if timeout is None else min(timeout, limit)
        if timeout is not None:
            call.timer = ingress.loop.call_later(timeout, self._timed_out, call, timeout)
        if method is not None and method.request_streaming:
            self._submit(call, b"")
        if end_stream and not call.ended:
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
        if call.streamed:
            if call.queue is not None:  # reflection takes every message at once
                self.h2.consumed(stream_id, len(data))
                self._ask_reflection(call, [body for body, _ in messages], end_stream)
                return
            call.inbox.extend(messages)
            call.inbox_bytes += sum(size for _, size in messages)
            call.unreturned += len(data)
            call.client_done = end_stream
            self._pump(call)
            return
        self.h2.consumed(stream_id, len(data))
        for body, _ in messages:
            if call.body is not None:
                self.end(call, Code.INTERNAL, "a unary call sent more than one message")
                return
            call.body = body
        if not end_stream:
            return
        if call.body is None:
            self.end(call, Code.INTERNAL, "a unary call sent no message")
        elif call.local:
            self._answer_locally(call, call.body)
        else:
            self._submit(call, call.body)
            call.body = None  # the request holds it now

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

    def _submit(self, call: GrpcCall, body: bytes) -> None:
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
            self.end(call, code, details, settled=True)
            return
        call.submitted = True
        ingress.ongoing += 1

    def delivered(self, call: GrpcCall, message: Message) -> None:
        """A frame of the call's answer, from its replica."""
        if call.ended:
            return
        try:
            self._deliver(call, message)
        except Exception as exc:  # one call's bad answer must not close the replica's link
            log.exception("gRPC call %s: its answer could not be sent", call.request_id)
            if not call.ended:
                self.end(call, Code.INTERNAL, f"the answer could not be sent: {exc}",
                         settled=is_final(message))
        self._flush_soon()

    def _deliver(self, call: GrpcCall, message: Message) -> None:
        if isinstance(message, Item):
            self.send_message(call, message.payload, ack=True)
        elif isinstance(message, Pull):
            call.pulls += message.count
            self._pump(call)
        elif isinstance(message, GrpcEnd):
            trailing = call_trailers(call.request_id, message.trailers)
            if message.code == Code.OK:
                if message.has_body:
                    self.send_message(call, message.body, ack=False)
                self.end(call, Code.OK, "", trailing, settled=True)
            else:  # the user's method failed, or set its own code
                self.end(call, message.code, truncate(message.details), trailing, settled=True)
        elif isinstance(message, Failure):
            self.end(call, *status_of(failure_of(message), call.request_id), settled=True)
        else:
            self.end(call, Code.INTERNAL, f"a gRPC call cannot take {type(message).__name__}")

    def failed(self, call: GrpcCall, exc: BaseException) -> None:
        """The router gave up on the call (its replica died, no replica will come)."""
        if not call.ended:
            self.end(call, *status_of(exc, call.request_id), settled=True)
            self._flush_soon()

    def _pump(self, call: GrpcCall) -> None:
        """Send the client's stream as the replica pulls it, and give the client's window
        back for every byte but those of the messages still waiting here."""
        pending = call.pending
        link = pending.link if pending is not None else None
        if link is not None and pending is not None and not pending.cancelled:
            request_id = pending.message.id
            while call.pulls > 0:
                if call.inbox:
                    body, size = call.inbox.popleft()
                    call.inbox_bytes -= size
                    link.send(GrpcMessage(request_id, body, True))
                elif call.client_done and not call.end_sent:
                    call.end_sent = True
                    link.send(GrpcMessage(request_id, b"", False))
                else:
                    break
                call.pulls -= 1
        returned = call.unreturned - call.inbox_bytes
        if returned > 0:
            call.unreturned -= returned
            self.h2.consumed(call.stream_id, returned)

    def send_message(self, call: GrpcCall, body: bytes, ack: bool) -> None:
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

    def _acknowledge(self, call: GrpcCall) -> None:
        if self.writing_paused:  # the socket's buffer is full: the replica waits
            self.holding[call] = None
            return
        pending, unacked = call.pending, call.unacked
        call.unacked = 0
        if pending is not None and unacked:
            pending.consumed(unacked)

    def end(self, call: GrpcCall, code: int, details: str, metadata: Metadata | None = None,
            settled: bool = False) -> None:
        """The call's last word: its status and trailing metadata. Unless its router
        `settled` it (the replica's answer, a refusal, a failure), it is cancelled there."""
        if call.ended:
            return
        if not settled:
            self._cancel(call)
        request_id = (("request_id", call.request_id),) if call.request_id else ()
        if metadata is None:
            metadata = request_id
        elif not any(key == "request_id" for key, _ in metadata):
            metadata = (*request_id, *metadata)
        block = trailers(code, details, metadata, trailers_only=not call.headers_sent)
        self.h2.send_headers(call.stream_id, block, end_stream=True)
        self._finish(call, code)

    def _finish(self, call: GrpcCall, code: int) -> None:
        call.ended = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self.calls.pop(call.stream_id, None)
        ingress = self.ingress
        ingress.watchers.discard(call)
        self.holding.pop(call, None)
        if call.task is not None:
            call.task.cancel()
        if call.submitted:
            ingress.ongoing -= 1
        ingress.record(call, code)
        call.release()

    def _abandon(self, call: GrpcCall) -> None:
        """The client is gone: stop the call where it is."""
        if call.ended:
            return
        self.h2.reset(call.stream_id, 8)  # CANCEL (a no-op once the client reset it)
        self._cancel(call)
        self._finish(call, Code.CANCELLED)

    def _cancel(self, call: GrpcCall) -> None:
        if call.submitted and call.pending is not None and call.router is not None:
            call.router.cancel(call.pending)

    def _timed_out(self, call: GrpcCall, timeout_s: float) -> None:
        call.timer = None
        if not call.ended:
            self.end(call, *status_of(Timeout(round(timeout_s, 3)), call.request_id))
            self._flush()

    # -- local services --------------------------------------------------------------------

    def _answer_locally(self, call: GrpcCall, body: bytes) -> None:
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

    def _ask_reflection(self, call: GrpcCall, bodies: list[bytes], end_stream: bool) -> None:
        queue = call.queue
        assert queue is not None
        try:
            for body in bodies:
                queue.put_nowait(body)
            if end_stream:
                queue.put_nowait(None)
        except asyncio.QueueFull:
            self.end(call, Code.RESOURCE_EXHAUSTED, f"more than {REFLECTION_QUEUE} reflection "
                                                    "requests wait for their answers")

    async def _reflect(self, call: GrpcCall) -> None:
        queue = call.queue
        assert queue is not None

        async def requests() -> AsyncIterator[bytes]:
            while (body := await queue.get()) is not None:
                yield body

        try:
            async for response in self.ingress.local.reflect(requests()):
                self.send_message(call, response, ack=False)
            self.end(call, Code.OK, "")
        except HeldLimitError as exc:  # a client that asks and never reads
            self.end(call, Code.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            self.end(call, Code.INTERNAL, truncate(str(exc)))
        self._flush()
