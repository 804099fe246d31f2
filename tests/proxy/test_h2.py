"""The gRPC ingress's own HTTP/2 (codecs/h2.py) against an independent client,
python-hyper's h2: the handshake, streams, header blocks in pieces, flow control both
ways, PING, resets, GOAWAY, and the connection errors that close it."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from surge.codecs import h2 as core
from surge.codecs.h2_send import CLOSED_KEPT, MAX_HELD_BYTES, HeldLimitError
from surge.codecs.hpack import Header

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Svc/Say"),
           (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def headers(self, stream_id: int, headers: list[Header], size: int,
                end_stream: bool) -> None:
        self.events.append(("headers", stream_id, dict(headers), end_stream))

    def data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None:
        self.events.append(("data", stream_id, bytes(data), end_stream))

    def reset(self, stream_id: int, code: int) -> None:
        self.events.append(("reset", stream_id, code))

    def drained(self, stream_id: int) -> None:
        self.events.append(("drained", stream_id))


class Pair:
    """An h2 client and surge's server side, bytes carried between them by hand."""

    def __init__(self, **server: Any) -> None:
        self.recorder = Recorder()
        self.server = core.H2Connection(self.recorder, **server)
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.client.initiate_connection()
        self.client_events: list[Any] = []
        self.pump()

    def to_server(self, data: bytes | None = None) -> None:
        self.server.receive(self.client.data_to_send() if data is None else data)

    def to_client(self) -> list[Any]:
        out = b"".join(self.server.out)
        self.server.out.clear()
        events = self.client.receive_data(out) if out else []
        self.client_events += events
        return events

    def pump(self) -> list[Any]:
        self.to_server()
        events = self.to_client()
        self.to_server()
        return events

    def answer_after(self, setting: h2.settings.SettingCodes, value: int) -> None:
        """The client sets `setting` to `value` and sends REQUEST, ending stream 1; the
        server has both and starts its answer (HEADERS, :status 200)."""
        self.client.update_settings({setting: value})
        self.client.send_headers(1, REQUEST, end_stream=True)
        self.pump()
        self.server.send_headers(1, b"\x88")


def test_the_handshake_advertises_this_sides_limits() -> None:
    pair = Pair(max_streams=7, max_header_list=9000)
    settings = next(e for e in pair.client_events
                    if isinstance(e, h2.events.RemoteSettingsChanged)).changed_settings
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 7
    assert settings[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE].new_value == core.STREAM_WINDOW
    assert settings[h2.settings.SettingCodes.MAX_FRAME_SIZE].new_value == core.FRAME_SIZE
    assert settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE].new_value == 9000
    assert pair.client.outbound_flow_control_window == core.CONNECTION_WINDOW


def test_a_stream_delivers_its_headers_data_and_end() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST)
    pair.client.send_data(1, b"abc")
    pair.client.send_data(1, b"def", end_stream=True)
    pair.to_server()
    assert pair.recorder.events == [
        ("headers", 1, {**{k.encode(): v.encode() for k, v in REQUEST}}, False),
        ("data", 1, b"abc", False), ("data", 1, b"def", True)]


def test_a_header_block_in_continuations_and_trailers_that_end_the_stream() -> None:
    pair = Pair()
    block = hpack.Encoder().encode([*REQUEST, ("x-long", "v" * 3000)])
    pair.to_server(core.frame(core.HEADERS, 0, 3, block[:1000])
                   + core.frame(core.CONTINUATION, 0, 3, block[1000:2000])
                   + core.frame(core.CONTINUATION, core.END_HEADERS, 3, block[2000:])
                   + core.frame(core.DATA, 0, 3, b"x")
                   + core.frame(core.HEADERS, core.END_HEADERS | core.END_STREAM, 3,
                                hpack.Encoder().encode([("x-trailer", "1")])))
    kinds = [(event[0], event[-1]) for event in pair.recorder.events]
    assert kinds == [("headers", False), ("data", False), ("data", True)]
    assert pair.recorder.events[0][2][b"x-long"] == b"v" * 3000


def test_a_response_waits_for_the_clients_window_and_its_trailers_wait_behind() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST, end_stream=True)
    pair.to_server()
    pair.server.send_headers(1, b"\x88")
    body = bytes(range(256)) * 300  # 76,800 > the client's 65,535
    assert pair.server.send_data(1, body) is False
    pair.server.send_headers(1, b"\x00\x0bgrpc-status\x010", True)
    events = pair.to_client()
    got = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert len(got) == 65_535 and not any(isinstance(e, h2.events.StreamEnded) for e in events)
    pair.client.acknowledge_received_data(len(got), 1)
    pair.to_server()
    assert ("drained", 1) in pair.recorder.events
    events = pair.to_client()
    got += b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert got == body
    trailers = next(e for e in events if isinstance(e, h2.events.TrailersReceived))
    assert trailers.headers == [("grpc-status", "0")]
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)
    assert 1 not in pair.server.streams


def test_consumed_data_gives_the_window_back() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST)
    pair.client.send_data(1, b"z" * 600_000)
    pair.client.send_data(1, b"z" * 600_000)
    pair.to_server()
    before = pair.client.local_flow_control_window(1)
    pair.server.consumed(1, 1_200_000)
    pair.to_client()
    assert pair.client.local_flow_control_window(1) == before + 1_200_000


def test_ping_is_answered_and_a_clients_reset_is_heard() -> None:
    pair = Pair()
    pair.client.ping(b"12345678")
    events = pair.pump()
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678"
               for e in events)
    pair.client.send_headers(1, REQUEST)
    pair.client.reset_stream(1, 8)
    pair.to_server()
    assert pair.recorder.events[-1] == ("reset", 1, 8)
    assert 1 not in pair.server.streams


def test_ending_a_stream_the_client_still_sends_on_resets_it_and_drops_late_data() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST)
    pair.to_server()
    pair.server.send_headers(1, b"\x88\x00\x0bgrpc-status\x012", end_stream=True)
    events = pair.to_client()
    assert any(isinstance(e, h2.events.StreamReset) and e.error_code == 0 for e in events)
    pair.to_server(core.frame(core.DATA, 0, 1, b"late"))  # in flight: ignored
    assert pair.recorder.events[-1][0] == "headers"


def test_streams_past_the_limit_and_after_goaway_are_refused() -> None:
    pair = Pair(max_streams=1)
    block = hpack.Encoder().encode(REQUEST)
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 1, block)
                   + core.frame(core.HEADERS, core.END_HEADERS, 3, block))
    assert [e[1] for e in pair.recorder.events] == [1]
    assert pair.server.out[-1] == core.frame(core.RST_STREAM, 0, 3, bytes((0, 0, 0, 7)))
    pair.server.goaway()
    assert pair.server.out[-1] == core.frame(core.GOAWAY, 0, 0, bytes((0, 0, 0, 3)) + bytes(4))
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 5, hpack.Encoder().encode(REQUEST)))
    assert pair.server.out[-1] == core.frame(core.RST_STREAM, 0, 5, bytes((0, 0, 0, 7)))
    assert [e[1] for e in pair.recorder.events] == [1]


@pytest.mark.parametrize(("data", "code"), [
    (b"GET / HTTP/1.1\r\n\r\n" + b"x" * 10, core.PROTOCOL_ERROR),
    (core.frame(core.PING, 0, 1, b"12345678"), core.PROTOCOL_ERROR),
    (core.frame(core.DATA, 0, 5, b"x"), core.PROTOCOL_ERROR),  # an idle stream
    (core.frame(core.HEADERS, core.END_HEADERS, 2, b"\x82"), core.PROTOCOL_ERROR),  # even
    (core.frame(core.HEADERS, core.END_HEADERS, 1, b"\xff\x7f"), core.COMPRESSION_ERROR),
    (core.frame(core.HEADERS, 0, 1, b"\x82") + core.frame(core.PING, 0, 0, b"12345678"),
     core.PROTOCOL_ERROR),  # a header block interrupted
    (core.frame(core.SETTINGS, 0, 0, b"\x00\x05\x00\x00\x00\x01"), core.PROTOCOL_ERROR),
    ((core.FRAME_SIZE + 1).to_bytes(3, "big") + bytes(6), core.FRAME_SIZE_ERROR),
    (core.frame(core.WINDOW_UPDATE, 0, 0, bytes(4)), core.PROTOCOL_ERROR),
    (core.frame(core.PUSH_PROMISE, core.END_HEADERS, 1, bytes(4)), core.PROTOCOL_ERROR),
])
def test_connection_errors_send_goaway_and_raise(data: bytes, code: int) -> None:
    pair = Pair()
    if data.startswith(b"GET"):
        pair = Pair.__new__(Pair)
        pair.server = core.H2Connection(Recorder())
    with pytest.raises(core.H2Error) as info:
        pair.server.receive(data)
    assert info.value.code == code
    goaway = pair.server.out[-1]
    assert goaway[3] == core.GOAWAY and int.from_bytes(goaway[13:17], "big") == code


def test_the_preface_may_come_a_byte_at_a_time() -> None:
    server = core.H2Connection(Recorder())
    for byte in core.PREFACE:
        server.receive(bytes((byte,)))
    server.receive(core.frame(core.SETTINGS, 0, 0))
    assert server.out[-1] == core.frame(core.SETTINGS, core.ACK, 0)


def test_a_data_frame_reaches_the_listener_in_the_pieces_its_reads_bring() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST)
    pair.to_server()
    wire = core.frame(core.DATA, core.END_STREAM, 1, b"a" * 1000)
    for start in (0, 5, 400, 999):  # a cut inside the frame header, then in the payload
        pair.to_server(wire[start:{0: 5, 5: 400, 400: 999, 999: None}[start]])
    pieces = [(len(e[2]), e[3]) for e in pair.recorder.events if e[0] == "data"]
    assert pieces == [(391, False), (599, False), (10, True)]


def test_a_client_past_a_streams_window_gets_that_stream_reset() -> None:
    pair = Pair()
    block = hpack.Encoder().encode(REQUEST)
    piece = core.frame(core.DATA, 0, 1, b"x" * core.FRAME_SIZE)
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 1, block) + piece * 4)
    assert pair.recorder.events[-1][0] == "data"
    pair.to_server(core.frame(core.DATA, 0, 1, b"x"))  # one octet past the 4 MiB window
    assert pair.recorder.events[-1] == ("reset", 1, core.FLOW_CONTROL_ERROR)
    assert pair.server.out[-1] == core.frame(core.RST_STREAM, 0, 1, bytes((0, 0, 0, 3)))


def test_the_connections_window_comes_back_as_data_arrives() -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    wire = b""
    for stream_id in range(1, 10, 2):  # five streams of 4 MiB - 4: 20 MiB > 16 MiB in all
        wire += core.frame(core.HEADERS, core.END_HEADERS, stream_id, encoder.encode(REQUEST))
        wire += core.frame(core.DATA, 0, stream_id, b"y" * (core.FRAME_SIZE - 1)) * 4
    pair.to_server(wire)  # within each stream's window: taken
    updates = [chunk for chunk in pair.server.out if chunk[3:4] == bytes((core.WINDOW_UPDATE,))
               and chunk[5:9] == bytes(4)]
    assert len(updates) == 2  # 8 MiB back each time half the window was used
    assert [event[1] for event in pair.recorder.events if event[0] == "headers"] == [
        1, 3, 5, 7, 9]


def test_a_flood_of_pings_is_enhance_your_calm() -> None:
    now = [0.0]
    server = core.H2Connection(Recorder(), clock=lambda: now[0])
    server.receive(core.PREFACE + core.frame(core.SETTINGS, 0, 0))
    ping = core.frame(core.PING, 0, 0, b"12345678")
    server.receive(ping * 1000)
    now[0] = 0.5  # 1,000 more tokens by now: the next 1,000 pass too
    server.receive(ping * 1000)
    with pytest.raises(core.H2Error) as info:
        server.receive(ping * 1000)
    assert info.value.code == core.ENHANCE_YOUR_CALM


def test_a_lowered_table_size_is_acknowledged_at_the_next_block() -> None:
    pair = Pair()
    pair.answer_after(h2.settings.SettingCodes.HEADER_TABLE_SIZE, 0)
    headers_frame = next(chunk for chunk in pair.server.out if chunk[3] == core.HEADERS)
    assert headers_frame[9:11] == b"\x20\x88"  # size update to 0, then :status 200
    events = pair.to_client()
    assert any(isinstance(e, h2.events.ResponseReceived) for e in events)


def test_bad_trailers_reset_the_stream_not_the_connection() -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 1, encoder.encode(REQUEST))
                   + core.frame(core.HEADERS, core.END_HEADERS, 1,  # no END_STREAM
                                encoder.encode([("x-t", "1")])))
    assert pair.recorder.events[-1] == ("reset", 1, core.PROTOCOL_ERROR)
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 3, encoder.encode(REQUEST)))
    assert pair.recorder.events[-1][:2] == ("headers", 3)


def test_a_header_frame_in_many_small_reads_is_joined_once() -> None:
    pair = Pair()
    block = hpack.Encoder().encode([*REQUEST, ("x-big", "b" * 12_000)])
    wire = core.frame(core.HEADERS, core.END_HEADERS | core.END_STREAM, 1, block)
    for start in range(0, len(wire), 100):
        pair.to_server(wire[start:start + 100])
    assert pair.recorder.events[0][2][b"x-big"] == b"b" * 12_000


@pytest.mark.parametrize("kind", [core.WINDOW_UPDATE, core.RST_STREAM])
def test_frames_on_an_idle_stream_are_connection_errors(kind: int) -> None:
    pair = Pair()
    with pytest.raises(core.H2Error) as info:
        pair.to_server(core.frame(kind, 0, 7, bytes((0, 0, 0, 1))))
    assert info.value.code == core.PROTOCOL_ERROR


def test_a_malformed_request_is_reset_protocol_error_and_never_reaches_the_listener() -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    malformed = [*REQUEST, (":path", "/pkg.Svc/Other")]  # a pseudo-header repeated, late
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 1, encoder.encode(malformed))
                   + core.frame(core.DATA, core.END_STREAM, 1, bytes(5)))
    assert pair.recorder.events == []
    assert pair.server.refused == "pseudo-header ':path' after a regular field"
    assert pair.server.out[-1] == core.frame(core.RST_STREAM, 0, 1, bytes((0, 0, 0, 1)))
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 3, encoder.encode(REQUEST)))
    assert pair.recorder.events[-1][:2] == ("headers", 3)  # the connection serves on


def test_client_trailers_with_a_pseudo_header_reset_the_stream() -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 1, encoder.encode(REQUEST))
                   + core.frame(core.HEADERS, core.END_HEADERS | core.END_STREAM, 1,
                                encoder.encode([(":path", "/x")])))
    assert pair.recorder.events[-1] == ("reset", 1, core.PROTOCOL_ERROR)


def test_data_that_breaks_its_content_length_resets_the_stream() -> None:
    pair = Pair()
    block = hpack.Encoder().encode([*REQUEST, ("content-length", "3")])
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 1, block)
                   + core.frame(core.DATA, core.END_STREAM, 1, b"ab"))
    assert pair.recorder.events[-1] == ("reset", 1, core.PROTOCOL_ERROR)


@pytest.mark.parametrize("close", ["ended", "client reset"])
def test_data_on_a_stream_the_client_closed_is_stream_closed(close: str) -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST, end_stream=close == "ended")
    if close == "client reset":
        pair.client.reset_stream(1, 8)
    pair.to_server()
    if close == "ended":  # this side answers: the stream is closed both ways
        pair.server.send_headers(1, b"\x88\x00\x0bgrpc-status\x010", end_stream=True)
    pair.server.out.clear()
    pair.to_server(core.frame(core.DATA, 0, 1, b"late"))
    assert pair.server.out == [core.frame(core.RST_STREAM, 0, 1, bytes((0, 0, 0, 5)))]


def test_headers_on_a_stream_the_client_ended_are_a_connection_error() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST, end_stream=True)
    pair.to_server()
    pair.server.send_headers(1, b"\x88\x00\x0bgrpc-status\x010", end_stream=True)
    with pytest.raises(core.H2Error) as info:
        pair.to_server(core.frame(core.HEADERS, core.END_HEADERS | core.END_STREAM, 1,
                                  hpack.Encoder().encode(REQUEST)))
    assert info.value.code == core.STREAM_CLOSED


def test_a_stream_below_the_last_one_opened_is_a_connection_error() -> None:
    pair = Pair()
    encoder = hpack.Encoder()
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 5, encoder.encode(REQUEST)))
    with pytest.raises(core.H2Error) as info:
        pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, 3, encoder.encode(REQUEST)))
    assert info.value.code == core.PROTOCOL_ERROR


def test_closed_streams_are_remembered_up_to_a_bound() -> None:
    pair = Pair(max_streams=4096)
    encoder = hpack.Encoder()
    for stream_id in range(1, 2 * CLOSED_KEPT + 200, 2):
        pair.to_server(core.frame(core.HEADERS, core.END_HEADERS, stream_id,
                                  encoder.encode(REQUEST)))
        pair.server.reset(stream_id, 8)  # CANCEL
    assert len(pair.server.closed) == CLOSED_KEPT
    pair.server.out.clear()
    pair.to_server(core.frame(core.DATA, 0, 2 * CLOSED_KEPT + 197, b"late"))  # remembered
    assert pair.server.out == []
    pair.to_server(core.frame(core.DATA, 0, 1, b"late"))  # forgotten: no longer "in flight"
    assert pair.server.out == [core.frame(core.RST_STREAM, 0, 1, bytes((0, 0, 0, 5)))]
    pair.server.out.clear()  # late trailers on it cost that stream, not the connection
    pair.to_server(core.frame(core.HEADERS, core.END_HEADERS | core.END_STREAM, 3,
                              encoder.encode([("x-t", "1")])))
    assert pair.server.out == [core.frame(core.RST_STREAM, 0, 3, bytes((0, 0, 0, 5)))]


@pytest.mark.parametrize(("payload", "stream_id", "code"), [
    (bytes(8), 1, core.PROTOCOL_ERROR),
    (bytes(7), 0, core.FRAME_SIZE_ERROR),
])
def test_a_bad_goaway_is_a_connection_error(payload: bytes, stream_id: int, code: int) -> None:
    pair = Pair()
    with pytest.raises(core.H2Error) as info:
        pair.to_server(core.frame(core.GOAWAY, 0, stream_id, payload))
    assert info.value.code == code


def test_a_stream_holds_a_bounded_amount_for_a_client_that_does_not_read() -> None:
    pair = Pair()
    pair.answer_after(h2.settings.SettingCodes.INITIAL_WINDOW_SIZE, 0)
    big = bytes(MAX_HELD_BYTES + 10)  # one message past the bound is held whole
    assert pair.server.send_data(1, big) is False
    with pytest.raises(HeldLimitError) as info:
        pair.server.send_data(1, b"more")
    assert (info.value.held, info.value.limit) == (len(big), MAX_HELD_BYTES)
    assert str(info.value) == (f"stream 1 holds {len(big)} bytes its client has not read "
                               f"(the limit is {MAX_HELD_BYTES})")


def test_a_bad_priority_on_a_closed_stream_leaves_how_it_closed() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST, end_stream=True)
    pair.to_server()
    pair.server.send_headers(1, b"\x88\x00\x0bgrpc-status\x010", end_stream=True)
    pair.server.out.clear()
    pair.to_server(core.frame(core.PRIORITY, 0, 1, bytes(4)))  # 4 octets, not 5
    assert pair.server.out == [core.frame(core.RST_STREAM, 0, 1, bytes((0, 0, 0, 6)))]
    with pytest.raises(core.H2Error) as info:  # still a stream the client ended
        pair.to_server(core.frame(core.HEADERS, core.END_HEADERS | core.END_STREAM, 1,
                                  hpack.Encoder().encode(REQUEST)))
    assert info.value.code == core.STREAM_CLOSED
