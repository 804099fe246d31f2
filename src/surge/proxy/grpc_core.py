"""The gRPC side of one connection, sans I/O: HTTP/2 bytes and replica frames in,
decisions out.

`GrpcCore` owns the connection's HTTP/2 codec (codecs/h2.py) and its calls
(proxy/grpc_call.py), and decides everything about a call when its headers (and, for a
unary request, its message) are in: the route, the refusals (NOT_FOUND,
UNAUTHENTICATED, UNAVAILABLE while draining, UNIMPLEMENTED), the deadline (the client's
`grpc-timeout`, capped by `request_timeout_s`), the submission. It never touches a
socket, a loop or a router: what it decides waits in its lists for the shell
(proxy/grpc_connection.py) to carry out, in this order: `submits` (give the call's
`pending` to its target's router; a refusal comes back as `refused`), `timers` (arm a
deadline: `timed_out` when it passes), `sends` (client-stream messages for the
replica's link), `acks` (response bytes the client took: `Pending.consumed`), `cancels`
(cancel at the router), `ended` (a call's end with its status: disarm, count, record),
`reflecting` (start a reflection stream), `asked` (its questions, bounded, wait in
`GrpcCall.questions`: wake its task), then write `h2.out`.

A call ends exactly once (`end`, or `abandon` when the client left), and every end that
the replica did not give is cancelled at its router. Flow control: a client stream's
messages wait in the call until the replica pulls them (`Pull`), and only their bytes
are kept from the client's HTTP/2 window (the rest goes back as it arrives, so a message
larger than the window still gets in); a response message is acknowledged to the
replica once the client's windows took it and the socket is not full (`writing_paused`).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

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
from surge.codecs.h2 import H2Connection
from surge.codecs.hpack import Header
from surge.errors import BackPressureError
from surge.model import RouteTarget
from surge.policy.auth import check_bearer
from surge.proxy.grpc_call import CallSink, GrpcCall, call_trailers, failure_of
from surge.proxy.grpc_local import (
    DRAINING,
    HEALTH_WATCH,
    NOT_SERVING,
    REFLECTION,
    SERVING,
    LocalServices,
    status_message,
)
from surge.proxy.grpc_status import Code, Timeout, choose_app, metadata_value, status_of, truncate
from surge.router.replica_link import Pending
from surge.transport.grpc_methods import GrpcMethod, pack_metadata
from surge.transport.messages import Failure, GrpcEnd, GrpcMessage, GrpcRequest, Item, Message, Pull

__all__ = ["MAX_STREAMS", "REFLECTION_QUEUE", "GrpcCore", "GrpcSite"]

# Calls one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); a
# router's queue limits bound what they cost further in.
MAX_STREAMS = 1024
NOT_FOUND_METHOD = "Method not found!"  # grpc's own details for an unknown method
UNIMPLEMENTED = 12
CANCEL = 8  # RST_STREAM's CANCEL
# Reflection requests a stream may have waiting for their answers: a reflection client
# asks one question at a time, so only one that sends and never reads comes near it.
REFLECTION_QUEUE = 64
_LINGERING = frozenset((HEALTH_WATCH, REFLECTION))  # local streams a drain does not wait for


class GrpcSite(Protocol):
    """What every connection's core reads of the ingress (proxy/grpc_ingress.py)."""

    local: LocalServices
    request_timeout_s: float | None
    max_header_bytes: int

    @property
    def methods(self) -> Mapping[str, GrpcMethod]: ...

    def apps(self) -> Mapping[str, RouteTarget]: ...

    @property
    def draining(self) -> bool: ...


class GrpcCore:
    __slots__ = ("acks", "asked", "calls", "cancels", "ended", "h2", "holding", "now", "peer",
                 "reflecting", "sends", "sink", "site", "submits", "timers", "writing_paused")

    def __init__(self, site: GrpcSite, now: Callable[[], float], sink: CallSink) -> None:
        self.site = site
        self.now = now
        self.sink = sink  # the shell: it hears the routers' frames and gives them here
        self.h2 = H2Connection(self, MAX_STREAMS, site.max_header_bytes)
        self.calls: dict[int, GrpcCall] = {}
        self.peer = ""  # as grpc names it: "ipv4:127.0.0.1:5555"
        self.writing_paused = False
        self.holding: dict[GrpcCall, None] = {}  # acknowledgements held while paused
        # Decisions, for the shell:
        self.submits: list[GrpcCall] = []
        self.timers: list[tuple[GrpcCall, float]] = []
        self.sends: list[tuple[GrpcCall, Message]] = []
        self.acks: list[tuple[Pending, int]] = []
        self.cancels: list[GrpcCall] = []
        self.ended: list[tuple[GrpcCall, int]] = []
        self.reflecting: list[GrpcCall] = []
        self.asked: list[GrpcCall] = []

    def __repr__(self) -> str:
        return f"<GrpcCore {self.peer} calls={len(self.calls)} {self.h2!r}>"

    # -- the connection --------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """The client's bytes. Raises H2Error on a connection error (GOAWAY is in `out`)."""
        self.h2.receive(data)

    def going_away(self) -> None:
        """No new calls (GOAWAY); a health watch told SERVING hears NOT_SERVING."""
        for call in list(self.calls.values()):
            if call.watching:
                call.watching = False
                self.send_message(call, status_message(NOT_SERVING), ack=False)
        self.h2.goaway()

    def lost(self) -> None:
        """The connection closed: every call still open is abandoned."""
        for call in list(self.calls.values()):
            self.abandon(call)
        self.holding.clear()
        self.h2.close()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        holding, self.holding = self.holding, {}
        for call in holding:
            self._acknowledge(call)

    def busy(self) -> bool:
        """Calls are open or answers still held. A health watch or a reflection stream
        does not count: it stays open as long as its client likes (a watch has heard
        NOT_SERVING by then), and draining must not wait out its timeout for it."""
        return self.h2.busy() and (bool(self.h2.blocked) or any(
            call.local not in _LINGERING for call in self.calls.values()))

    # -- h2.Listener -----------------------------------------------------------------------

    def headers(self, stream_id: int, headers: list[Header], size: int,
                end_stream: bool) -> None:
        """A call begins: decide where it goes, or answer it now."""
        site = self.site
        call = self.calls[stream_id] = GrpcCall(self.sink, stream_id, self.now())
        if size > site.max_header_bytes:  # before reading them: they were not all kept
            self.end(call, Code.RESOURCE_EXHAUSTED, f"request headers of {size} bytes exceed "
                                                   f"the limit of {site.max_header_bytes}")
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
        method = site.methods.get(head.path)
        if method is None:
            if not self._local(call, head.path):
                return
            timeout = head.timeout_s  # a local call has the client's deadline only
        else:
            if not self._route(call, head.path, method):
                return
            timeout, limit = head.timeout_s, site.request_timeout_s
            if limit is not None:
                timeout = limit if timeout is None else min(timeout, limit)
        if timeout is not None:
            self.timers.append((call, timeout))
        if method is not None and method.request_streaming:
            self._submit(call, b"")
        if end_stream and not call.ended:
            self.data(stream_id, b"", True)

    def _local(self, call: GrpcCall, path: str) -> bool:
        """A method the port answers itself; False when there is none (the call ended)."""
        if not self.site.local.serves(path):
            self.end(call, UNIMPLEMENTED, NOT_FOUND_METHOD)
            return False
        call.local = path
        if path == REFLECTION:
            call.questions = deque()
            self.reflecting.append(call)
        return True

    def _route(self, call: GrpcCall, path: str, method: GrpcMethod) -> bool:
        """The call's application, its tokens and the drain; False when refused (ended)."""
        metadata = call.metadata
        target, not_found = choose_app(metadata_value(metadata, "application"),
                                       self.site.apps())
        if target is None:
            call.labels = ("", "", path)
            self.end(call, Code.NOT_FOUND, not_found)
            return False
        call.labels = (target.app, target.deployment, path)
        if target.auth is not None:  # the application's bearer tokens, as over HTTP
            refusal = check_bearer([value.encode("latin-1") for key, value in metadata
                                    if key == "authorization" and isinstance(value, str)],
                                   target.auth.digests)
            if refusal is not None:
                self.end(call, Code.UNAUTHENTICATED, refusal.message.decode())
                return False
        if self.site.draining:
            self.end(call, Code.UNAVAILABLE, DRAINING)
            return False
        call.method, call.target = method, target
        return True

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
            if call.questions is not None:  # reflection takes every message at once
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
            self.abandon(call)

    def drained(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None and call.unacked:
            self._acknowledge(call)

    # -- the call's way through its router -------------------------------------------------

    def _submit(self, call: GrpcCall, body: bytes) -> None:
        method, target = call.method, call.target
        assert method is not None and target is not None
        metadata = call.metadata
        request = GrpcRequest(0, method.path, method.servicer, pack_metadata(metadata), body,
                              call.request_id, target.app,
                              metadata_value(metadata, "multiplexed_model_id"), self.peer,
                              method.request_streaming)
        call.pending = Pending(request, call)
        call.submitted = True  # until `refused` says otherwise
        self.submits.append(call)

    def refused(self, call: GrpcCall, exc: Exception) -> str:
        """The router would not take the call (BackPressureError,
        DeploymentUnavailableError): it ends with the status that says why. Returns the
        reason for the rejection counter."""
        call.submitted = False
        code, details = status_of(exc, call.request_id)
        self.end(call, code, details, settled=True)
        return "backpressure" if isinstance(exc, BackPressureError) else "unavailable"

    def delivered(self, call: GrpcCall, message: Message) -> None:
        """A frame of the call's answer, from its replica."""
        if call.ended:
            return
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

    def unsendable(self, call: GrpcCall, exc: Exception, settled: bool) -> None:
        """The replica's frame could not be sent (`settled`: it was the call's last)."""
        if not call.ended:
            self.end(call, Code.INTERNAL, f"the answer could not be sent: {exc}",
                     settled=settled)

    def timed_out(self, call: GrpcCall, timeout_s: float) -> None:
        if not call.ended:
            self.end(call, *status_of(Timeout(round(timeout_s, 3)), call.request_id))

    def _pump(self, call: GrpcCall) -> None:
        """Send the client's stream as the replica pulls it, and give the client's window
        back for every byte but those of the messages still waiting here."""
        pending = call.pending
        if pending is not None and pending.link is not None and not pending.cancelled:
            request_id = pending.message.id
            while call.pulls > 0:
                if call.inbox:
                    body, size = call.inbox.popleft()
                    call.inbox_bytes -= size
                    self.sends.append((call, GrpcMessage(request_id, body, True)))
                elif call.client_done and not call.end_sent:
                    call.end_sent = True
                    self.sends.append((call, GrpcMessage(request_id, b"", False)))
                else:
                    break
                call.pulls -= 1
        returned = call.unreturned - call.inbox_bytes
        if returned > 0:
            call.unreturned -= returned
            self.h2.consumed(call.stream_id, returned)

    def send_message(self, call: GrpcCall, body: bytes, ack: bool) -> None:
        """One response message; `ack`: tell the replica once the client took it.
        Raises HeldLimitError when the client does not read what it was sent."""
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

    def _acknowledge(self, call: GrpcCall) -> None:
        if self.writing_paused:  # the socket's buffer is full: the replica waits
            self.holding[call] = None
            return
        pending, unacked = call.pending, call.unacked
        call.unacked = 0
        if pending is not None and unacked:
            self.acks.append((pending, unacked))

    def end(self, call: GrpcCall, code: int, details: str, metadata: Metadata | None = None,
            settled: bool = False) -> None:
        """The call's last word: its status and trailing metadata. Unless its router
        `settled` it (the replica's answer, a refusal, a failure), it is cancelled there."""
        if call.ended:
            return
        if not settled and call.submitted:
            self.cancels.append(call)
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
        call.watching = False
        self.calls.pop(call.stream_id, None)
        self.holding.pop(call, None)
        self.ended.append((call, code))

    def abandon(self, call: GrpcCall) -> None:
        """The client is gone: stop the call where it is."""
        if call.ended:
            return
        self.h2.reset(call.stream_id, CANCEL)  # a no-op once the client reset it
        if call.submitted:
            self.cancels.append(call)
        self._finish(call, Code.CANCELLED)

    # -- local services --------------------------------------------------------------------

    def _answer_locally(self, call: GrpcCall, body: bytes) -> None:
        local = self.site.local
        if call.local == HEALTH_WATCH:
            status = local.serving(body)
            self.send_message(call, status_message(status), ack=False)
            call.watching = status == SERVING  # NOT_SERVING follows when draining
            return  # the stream stays open until the client leaves
        code, details, answer = local.unary[call.local](body)
        if code == Code.OK:
            self.send_message(call, answer, ack=False)
        self.end(call, code, details)

    def _ask_reflection(self, call: GrpcCall, bodies: list[bytes], end_stream: bool) -> None:
        questions = call.questions
        assert questions is not None
        questions.extend(bodies)
        if end_stream:
            questions.append(None)
        if len(questions) > REFLECTION_QUEUE:
            self.end(call, Code.RESOURCE_EXHAUSTED, f"more than {REFLECTION_QUEUE} reflection "
                                                    "requests wait for their answers")
        elif questions:
            self.asked.append(call)
