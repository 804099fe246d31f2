"""proxy/grpc_core.py without sockets, loops or routers: an independent HTTP/2 client
(python-hyper's h2) sends calls, the test plays the shell (submits, router frames,
deadlines) and reads the decisions and the client's answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from surge.errors import BackPressureError, RequestCancelledError
from surge.model import AccessTokens, RouteTarget
from surge.policy.auth import token_digest
from surge.proxy.grpc_call import GrpcCall
from surge.proxy.grpc_core import REFLECTION_QUEUE, GrpcCore
from surge.proxy.grpc_local import (
    HEALTH_WATCH,
    NOT_SERVING,
    REFLECTION,
    SERVING,
    LocalServices,
    status_message,
)
from surge.proxy.grpc_status import HEALTHZ, Code
from surge.testing import FakeClock
from surge.transport.grpc_methods import GrpcMethod
from surge.transport.messages import Failure, GrpcEnd, Item, Message, Pull, Result

SAY = GrpcMethod("/pkg.Svc/Say", "pkg.add_SvcServicer_to_server", False, False)
UPLOAD = GrpcMethod("/pkg.Svc/Upload", "pkg.add_SvcServicer_to_server", True, False)
TOKEN = "a-token-of-sixteen-or-more"


def message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


class Site:
    """What GrpcIngress gives a connection's core, as plain values."""

    def __init__(self, apps: Mapping[str, RouteTarget] | None = None,
                 request_timeout_s: float | None = None, reflection: bool = False) -> None:
        self.methods = {m.path: m for m in (SAY, UPLOAD)}
        self._apps = dict(apps if apps is not None else {"a": RouteTarget("a", "D", "/a")})
        self.request_timeout_s = request_timeout_s
        self.max_header_bytes = 4096
        self.draining = False
        self.local = LocalServices(lambda: self._apps, {"pkg.Svc"}, lambda: self.draining,
                                   lambda: "", health=True, reflection=False)
        if reflection:  # served (the servicer itself is the shell's, never called here)
            self.local.serves = lambda path: path == REFLECTION  # type: ignore[method-assign]

    def apps(self) -> Mapping[str, RouteTarget]:
        return self._apps


class Sink:
    def delivered(self, call: GrpcCall, message: Message) -> None:
        raise AssertionError("the shell's: never called by the core")

    def failed(self, call: GrpcCall, exc: BaseException) -> None:
        raise AssertionError("the shell's: never called by the core")


@dataclass
class Answer:
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[bytes] = field(default_factory=list)
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None

    @property
    def status(self) -> int:  # a trailers-only answer has it in its one header block
        return int((self.trailers or self.headers)["grpc-status"])

    @property
    def details(self) -> str:
        return (self.trailers or self.headers).get("grpc-message", "")


class Client:
    """An h2 client and a GrpcCore, bytes carried between them by hand."""

    def __init__(self, site: Site | None = None) -> None:
        self.site = site or Site()
        self.clock = FakeClock()
        self.core = GrpcCore(self.site, self.clock.monotonic, Sink())
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.answers: dict[int, Answer] = {}
        self.goaway = False
        self.pump()

    def pump(self) -> None:
        self.core.receive(self.h2.data_to_send())
        out = b"".join(self.core.h2.out)
        self.core.h2.out.clear()
        for event in self.h2.receive_data(out):
            stream = getattr(event, "stream_id", 0)
            if isinstance(event, h2.events.ResponseReceived):
                self.answers.setdefault(stream, Answer()).headers = dict(event.headers)
            elif isinstance(event, h2.events.TrailersReceived):
                self.answers.setdefault(stream, Answer()).trailers = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, stream)
                data = event.data
                while data:
                    size = int.from_bytes(data[1:5], "big")
                    self.answers.setdefault(stream, Answer()).messages.append(data[5:5 + size])
                    data = data[5 + size:]
            elif isinstance(event, h2.events.StreamReset):
                self.answers.setdefault(stream, Answer()).reset = event.error_code
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = True
        if self.h2.data_to_send(0):
            self.pump()

    def call(self, path: str = SAY.path, *messages: bytes, end: bool = True,
             metadata: tuple[tuple[str, str], ...] = ()) -> int:
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers"), *metadata], end_stream=end and not messages)
        for index, body in enumerate(messages):
            self.h2.send_data(stream, message(body), end_stream=end and index == len(messages) - 1)
        self.pump()
        return stream

    def submit(self, path: str = SAY.path, *messages: bytes, **options: Any
               ) -> tuple[int, GrpcCall]:
        """`call` for a call the core hands to its router at once: its stream and the
        call it submitted."""
        stream = self.call(path, *messages, **options)
        [call] = self.take()["submits"]
        return stream, call

    def take(self) -> dict[str, Any]:
        """The decisions since the last take, as the shell would read them."""
        core = self.core
        taken = {"submits": core.submits, "timers": core.timers, "sends": core.sends,
                 "acks": core.acks, "cancels": core.cancels, "ended": core.ended,
                 "reflecting": core.reflecting, "asked": core.asked}
        core.submits, core.timers, core.sends, core.acks = [], [], [], []
        core.cancels, core.ended, core.reflecting, core.asked = [], [], [], []
        return taken

    def deliver(self, call: GrpcCall, *frames: Message) -> None:
        for frame in frames:
            self.core.delivered(call, frame)
        self.pump()


def ended(taken: dict[str, Any]) -> list[int]:
    return [code for _, code in taken["ended"]]


# -- routed calls ------------------------------------------------------------------------


def test_a_unary_call_is_submitted_once_its_message_is_in() -> None:
    client = Client()
    stream = client.call(SAY.path, b"hello", metadata=(("request_id", "r1"), ("k", "v")))
    taken = client.take()
    [call] = taken["submits"]
    request = call.pending.message
    assert (request.method, request.app, request.body, request.request_id) == (
        SAY.path, "a", b"hello", "r1")
    assert ("k", "v") in request.metadata and call.labels == ("a", "D", SAY.path)
    assert taken["timers"] == [] and call.submitted and not call.ended
    client.deliver(call, GrpcEnd(0, 0, "", [("t", "1")], b"world", True))
    answer = client.answers[stream]
    assert answer.messages == [b"world"] and answer.status == 0
    assert (answer.trailers["request_id"], answer.trailers["t"]) == ("r1", "1")
    taken = client.take()
    assert ended(taken) == [0] and taken["cancels"] == []  # the replica settled it
    assert client.core.calls == {}


def test_a_unary_call_waits_for_its_whole_message() -> None:
    client = Client()
    stream = client.call(SAY.path, b"part", end=False)
    assert client.take()["submits"] == []
    client.h2.end_stream(stream)
    client.pump()
    [call] = client.take()["submits"]
    assert call.pending.message.body == b"part"


@pytest.mark.parametrize(("bodies", "details"), [
    ((), "a unary call sent no message"),
    ((b"1", b"2"), "a unary call sent more than one message"),
])
def test_a_unary_call_needs_exactly_one_message(bodies: tuple[bytes, ...],
                                                details: str) -> None:
    client = Client()
    stream = client.call(SAY.path, *bodies)
    answer = client.answers[stream]
    assert (answer.status, answer.details) == (Code.INTERNAL, details)
    assert client.take()["submits"] == []


def test_an_unknown_method_is_unimplemented_and_never_counted() -> None:
    client = Client()
    stream = client.call("/pkg.Svc/Nope", b"x")
    answer = client.answers[stream]
    assert (answer.status, answer.details) == (12, "Method not found!")
    [(call, code)] = client.take()["ended"]
    assert code == 12 and call.labels is None  # the shell records no metric for it


def test_an_unknown_application_is_not_found_with_labels() -> None:
    client = Client(Site({"a": RouteTarget("a", "D", "/a"), "b": RouteTarget("b", "E", "/b")}))
    stream = client.call(SAY.path, b"x", metadata=(("application", "c"),))
    assert client.answers[stream].status == Code.NOT_FOUND
    [(call, _)] = client.take()["ended"]
    assert call.labels == ("", "", SAY.path)


def test_an_application_picks_its_target() -> None:
    client = Client(Site({"a": RouteTarget("a", "D", "/a"), "b": RouteTarget("b", "E", "/b")}))
    _, call = client.submit(SAY.path, b"x", metadata=(("application", "b"),))
    assert call.target is not None and call.target.deployment == "E"


def test_an_applications_tokens_are_checked() -> None:
    locked = RouteTarget("a", "D", "/a", AccessTokens((token_digest(TOKEN),), "test"))
    client = Client(Site({"a": locked}))
    refused = client.call(SAY.path, b"x")
    allowed = client.call(SAY.path, b"x", metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert client.answers[refused].status == Code.UNAUTHENTICATED
    assert allowed not in client.answers
    assert [c.stream_id for c in client.take()["submits"]] == [allowed]


def test_a_draining_proxy_refuses_new_calls() -> None:
    client = Client()
    client.site.draining = True
    stream = client.call(SAY.path, b"x")
    assert client.answers[stream].status == Code.UNAVAILABLE
    assert client.take()["submits"] == []


def test_a_refused_submission_ends_the_call_without_a_cancel() -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x")
    exc = BackPressureError(deployment="D", num_queued_requests=1, max_queued_requests=1,
                            retry_after_s=0.0)
    assert client.core.refused(call, exc) == "backpressure"
    client.pump()
    assert client.answers[stream].status == Code.RESOURCE_EXHAUSTED
    taken = client.take()
    assert ended(taken) == [Code.RESOURCE_EXHAUSTED] and taken["cancels"] == []
    assert not call.submitted  # the shell counts it neither in nor out


# -- deadlines, resets, failures ---------------------------------------------------------


@pytest.mark.parametrize(("client_s", "limit_s", "armed"), [
    (None, None, []),
    ("2S", None, [2.0]),
    (None, 0.5, [0.5]),
    ("2S", 0.5, [0.5]),  # the app's limit caps the client's deadline
    ("100m", 0.5, [0.1]),
])
def test_the_deadline_is_the_clients_capped_by_the_apps(client_s: str | None,
                                                         limit_s: float | None,
                                                         armed: list[float]) -> None:
    client = Client(Site(request_timeout_s=limit_s))
    metadata = (("grpc-timeout", client_s),) if client_s else ()
    client.call(SAY.path, b"x", metadata=metadata)
    assert [timeout for _, timeout in client.take()["timers"]] == armed


def test_a_local_call_has_the_clients_deadline_only() -> None:
    client = Client(Site(request_timeout_s=0.5))
    client.call(HEALTHZ, b"", end=False)
    assert client.take()["timers"] == []


def test_a_deadline_that_passes_ends_and_cancels_the_call() -> None:
    client = Client()
    stream = client.call(SAY.path, b"x", metadata=(("grpc-timeout", "1S"),))
    taken = client.take()
    [call] = taken["submits"]
    client.core.timed_out(call, 1.0)
    client.pump()
    answer = client.answers[stream]
    assert (answer.status, answer.details) == (
        Code.DEADLINE_EXCEEDED, "Request timed out after 1.0s.")
    taken = client.take()
    assert taken["cancels"] == [call] and ended(taken) == [Code.DEADLINE_EXCEEDED]
    client.core.timed_out(call, 1.0)  # a late timer: the call ended once
    assert client.take()["ended"] == []


def test_a_client_reset_abandons_the_call_at_its_router() -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x")
    client.h2.reset_stream(stream, 8)
    client.pump()
    taken = client.take()
    assert taken["cancels"] == [call] and ended(taken) == [Code.CANCELLED]
    client.deliver(call, GrpcEnd(0, 0, "", [], b"late", True))  # ignored: it ended
    assert client.take()["ended"] == [] and stream not in client.answers


def test_a_reset_in_the_same_read_ends_a_call_before_its_shell_submits_it() -> None:
    client = Client()
    stream = client.h2.get_next_available_stream_id()
    client.h2.send_headers(stream, [(":method", "POST"), (":scheme", "http"),
                                    (":path", SAY.path), (":authority", "x"),
                                    ("content-type", "application/grpc"), ("te", "trailers")])
    client.h2.send_data(stream, message(b"x"), end_stream=True)
    client.h2.reset_stream(stream, 8)
    client.pump()
    taken = client.take()
    [call] = taken["submits"]
    assert call.ended and taken["cancels"] == [call]  # the shell skips both: never sent


def test_the_connection_lost_abandons_every_call() -> None:
    client = Client()
    client.call(SAY.path, b"x")
    client.call(SAY.path, b"y")
    submitted = client.take()["submits"]
    client.core.lost()
    taken = client.take()
    assert taken["cancels"] == submitted and ended(taken) == [Code.CANCELLED] * 2


@pytest.mark.parametrize(("frame", "code", "details"), [
    (Failure(0, "cancelled", "gone"), Code.CANCELLED, "Client for request r1 disconnected."),
    (Failure(0, "internal", "boom"), Code.INTERNAL, "boom"),
    (GrpcEnd(0, 5, "no such thing", []), 5, "no such thing"),
])
def test_the_replicas_end_gives_the_status(frame: Message, code: int, details: str) -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x", metadata=(("request_id", "r1"),))
    client.deliver(call, frame)
    answer = client.answers[stream]
    assert (answer.status, answer.details) == (code, details)
    assert client.take()["cancels"] == []


def test_a_router_failure_settles_the_call() -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x", metadata=(("request_id", "r1"),))
    client.core.failed(call, RequestCancelledError("x"))
    client.pump()
    assert client.answers[stream].status == Code.CANCELLED
    assert client.take()["cancels"] == []


def test_an_answer_that_cannot_be_sent_is_internal() -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x")
    client.core.unsendable(call, ValueError("bad"), settled=False)
    client.pump()
    answer = client.answers[stream]
    assert (answer.status, answer.details) == (
        Code.INTERNAL, "the answer could not be sent: bad")
    assert client.take()["cancels"] == [call]  # not the replica's last frame: cancelled


# -- streams both ways -------------------------------------------------------------------


class Link:
    """Stands for the replica link the router set on the call's Pending."""


def test_a_client_stream_goes_to_the_replica_as_it_pulls() -> None:
    client = Client()
    stream, call = client.submit(UPLOAD.path, b"1", b"2", b"3")  # at its headers, with no message
    assert call.pending.message.body == b"" and call.pending.message.streamed
    assert [body for body, _ in call.inbox] == [b"1", b"2", b"3"]
    client.deliver(call, Pull(0, 2))
    assert client.take()["sends"] == []  # no replica link yet: the messages wait
    call.pending.link = Link()  # type: ignore[assignment]
    client.deliver(call, Pull(0, 0))
    assert [m.body for _, m in client.take()["sends"]] == [b"1", b"2"]
    client.deliver(call, Pull(0, 5))
    assert [(m.body, m.more) for _, m in client.take()["sends"]] == [(b"3", True),
                                                                   (b"", False)]
    client.deliver(call, Pull(0, 5))
    assert client.take()["sends"] == []  # the end went once
    client.deliver(call, GrpcEnd(0, 0, "", [], b"done", True))
    assert client.answers[stream].messages == [b"done"]


def test_a_client_streams_window_is_kept_for_the_messages_waiting() -> None:
    client = Client()
    _, call = client.submit(UPLOAD.path, b"a" * 1000, b"b" * 1000, end=False)
    assert call.unreturned == 2010  # kept from the client: the messages wait for pulls
    call.pending.link = Link()  # type: ignore[assignment]
    client.deliver(call, Pull(0, 1))
    assert call.unreturned == 1005  # the pulled message's bytes went back
    client.deliver(call, Pull(0, 1))
    assert call.unreturned == 0


def test_response_messages_are_acknowledged_once_written() -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x")
    client.deliver(call, Item(0, b"one"), Item(0, b"two"))
    assert client.answers[stream].messages == [b"one", b"two"]
    assert [n for _, n in client.take()["acks"]] == [3, 3]


def test_acknowledgements_wait_while_the_socket_is_full() -> None:
    client = Client()
    _, call = client.submit(SAY.path, b"x")
    client.core.pause_writing()
    client.deliver(call, Item(0, b"one"), Item(0, b"four"))
    assert client.take()["acks"] == [] and call in client.core.holding
    client.core.resume_writing()
    assert [(p, n) for p, n in client.take()["acks"]] == [(call.pending, 7)]


# -- the port's own services -------------------------------------------------------------


def test_healthz_is_answered_here() -> None:
    client = Client()
    stream = client.call(HEALTHZ, b"")
    answer = client.answers[stream]
    assert answer.status == 0 and answer.messages == [b"\x0a\x07success"]
    assert client.take()["submits"] == []


def test_a_health_watch_hears_not_serving_when_the_proxy_goes_away() -> None:
    client = Client()
    stream = client.call(HEALTH_WATCH, b"", end=False)
    client.h2.end_stream(stream)
    client.pump()
    assert client.answers[stream].messages == [status_message(SERVING)]
    assert not client.core.busy()  # a watch does not hold a drain
    client.core.going_away()
    client.pump()
    assert client.answers[stream].messages == [status_message(SERVING),
                                               status_message(NOT_SERVING)]
    assert client.goaway
    client.core.going_away()  # told once
    client.pump()
    assert len(client.answers[stream].messages) == 2


def test_reflection_questions_wait_bounded_for_their_task() -> None:
    client = Client(Site(reflection=True))
    stream = client.call(REFLECTION, b"q1", b"q2", end=False)
    taken = client.take()
    [call] = taken["reflecting"]
    assert set(taken["asked"]) == {call} and list(call.questions or ()) == [b"q1", b"q2"]
    client.h2.send_data(stream, b"".join(message(b"q") for _ in range(REFLECTION_QUEUE - 1)))
    client.pump()
    answer = client.answers[stream]
    assert answer.status == Code.RESOURCE_EXHAUSTED
    assert answer.details == (
        f"more than {REFLECTION_QUEUE} reflection requests wait for their answers")


def test_busy_while_a_routed_call_is_open() -> None:
    client = Client()
    assert not client.core.busy()
    _, call = client.submit(SAY.path, b"x")
    assert client.core.busy()
    client.deliver(call, GrpcEnd(0, 0, "", [], b"", True))
    assert not client.core.busy()


def test_repr_shows_the_live_state() -> None:
    client = Client()
    client.core.peer = "ipv4:1.2.3.4:5"
    client.call(SAY.path, b"x")
    assert repr(client.core).startswith("<GrpcCore ipv4:1.2.3.4:5 calls=1 ")


# -- calls refused at their head, or broken on the wire ----------------------------------


def test_headers_over_the_limit_are_resource_exhausted() -> None:
    client = Client()
    client.site.max_header_bytes = 200
    client.core = GrpcCore(client.site, client.clock.monotonic, Sink())
    client.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8"))
    client.h2.initiate_connection()
    client.pump()
    stream = client.call(SAY.path, b"x", metadata=(("big", "v" * 150),))
    answer = client.answers[stream]
    assert answer.status == Code.RESOURCE_EXHAUSTED
    assert answer.details.startswith("request headers of ")


def test_a_request_that_is_not_grpc_gets_an_http_status() -> None:
    client = Client()
    stream = client.h2.get_next_available_stream_id()
    client.h2.send_headers(stream, [(":method", "GET"), (":scheme", "http"),
                                    (":path", SAY.path), (":authority", "x")], end_stream=True)
    client.pump()
    answer = client.answers[stream]
    assert answer.headers[":status"] != "200" and answer.trailers == {}
    assert client.take()["ended"] == []  # not a call: nothing to count


def test_an_unknown_compression_is_unimplemented_with_what_this_side_accepts() -> None:
    client = Client()
    stream = client.call(SAY.path, b"x", metadata=(("grpc-encoding", "snappy"),))
    answer = client.answers[stream]
    assert answer.status == 12 and "grpc-accept-encoding" in answer.headers  # UNIMPLEMENTED


def test_a_stream_that_ends_inside_a_message_is_internal() -> None:
    client = Client()
    stream = client.call(SAY.path, end=False)
    client.h2.send_data(stream, b"\x00\x00\x00\x00\x05ab", end_stream=True)
    client.pump()
    answer = client.answers[stream]
    assert (answer.status, answer.details) == (
        Code.INTERNAL, "the client's stream ended inside a message")


def test_a_frame_a_call_cannot_take_ends_it() -> None:
    client = Client()
    stream, call = client.submit(SAY.path, b"x")
    client.deliver(call, Result(0, b""))
    assert (client.answers[stream].status, client.answers[stream].details) == (
        Code.INTERNAL, "a gRPC call cannot take Result")
    assert client.take()["cancels"] == [call]
    client.core.unsendable(call, ValueError("late"), settled=True)  # ended once
    client.core.failed(call, ValueError("late"))
    assert client.take()["ended"] == []
