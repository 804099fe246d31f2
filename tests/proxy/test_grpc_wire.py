"""gRPC on HTTP/2, sans I/O: a call's headers read (path, metadata, deadline, what is
refused), messages split from any cut of the stream, the trailers written."""

from __future__ import annotations

import zlib

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.codecs.grpc_wire import MessageReader, WireError, frame_message, read_head, trailers

BASE = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/pkg.Svc/Say"),
        (b":authority", b"h:1"), (b"content-type", b"application/grpc+proto"),
        (b"te", b"trailers")]


def test_the_head_names_the_path_metadata_and_deadline() -> None:
    head = read_head([*BASE, (b"grpc-timeout", b"1500m"), (b"application", b"echo"),
                           (b"user-agent", b"grpc-python/1"),
                           (b"x-trace-bin", b"AAEC"), (b"grpc-accept-encoding", b"gzip")])
    assert head.errors == []
    assert head.path == "/pkg.Svc/Say"
    assert head.timeout_s == pytest.approx(1.5)
    assert head.metadata == (("application", "echo"), ("user-agent", "grpc-python/1"),
                             ("x-trace-bin", b"\x00\x01\x02"))


@pytest.mark.parametrize(("value", "seconds"), [
    (b"2H", 7200.0), (b"3M", 180.0), (b"10S", 10.0), (b"250m", 0.25), (b"5u", 5e-6),
    (b"99999999n", 0.099999999)])
def test_every_timeout_unit(value: bytes, seconds: float) -> None:
    assert read_head([*BASE, (b"grpc-timeout", value)]).timeout_s == pytest.approx(seconds)


@pytest.mark.parametrize(("extra", "code", "text"), [
    ([(b"grpc-timeout", b"1x")], 13, "malformed grpc-timeout"),
    ([(b"grpc-timeout", b"123456789S")], 13, "malformed grpc-timeout"),
    ([(b"grpc-encoding", b"snappy")], 12, "grpc-encoding snappy"),
])
def test_a_head_grpc_cannot_serve_says_why(extra: list[tuple[bytes, bytes]], code: int,
                                           text: str) -> None:
    error = read_head([*BASE, *extra]).errors[0]
    assert error.code == code and text in str(error)


def test_not_grpc_is_an_http_answer() -> None:
    not_post = [(b":method", b"GET") if name == b":method" else (name, value)
                for name, value in BASE]
    assert read_head(not_post).errors[0].code == -405
    json = [(b"content-type", b"application/json") if name == b"content-type" else
            (name, value) for name, value in BASE]
    assert read_head(json).errors[0].code == -415


def _wire(*bodies: bytes) -> bytes:
    return b"".join(b"".join(frame_message(body)) for body in bodies)


@given(st.lists(st.binary(max_size=300), max_size=5), st.data())
def test_messages_come_out_whole_from_any_cut_of_the_stream(bodies: list[bytes],
                                                            data: st.DataObject) -> None:
    wire = _wire(*bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    reader, got = MessageReader(1000), []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += reader.feed(wire[start:end])
    assert got == [(body, len(body) + 5) for body in bodies] and not reader.partial


def test_a_large_message_is_framed_apart_and_read_back() -> None:
    body = bytes(range(256)) * 1000
    parts = frame_message(body)
    assert len(parts) == 2 and parts[1] is body
    reader = MessageReader(len(body))
    wire = b"".join(parts)
    assert reader.feed(wire[:70_000]) == [] and reader.partial
    assert reader.feed(wire[70_000:]) == [(body, len(wire))]


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
def test_compressed_messages_are_inflated_within_the_limit(encoding: bytes) -> None:
    bits = read_head([*BASE, (b"grpc-encoding", encoding)]).encoding
    packer = zlib.compressobj(wbits=bits)
    body = bytes(range(200)) * 5
    packed = packer.compress(body) + packer.flush()
    wire = b"\x01" + len(packed).to_bytes(4, "big") + packed
    assert MessageReader(1000, bits).feed(wire[:7]) == []
    reader = MessageReader(1000, bits)
    assert reader.feed(wire) == [(body, len(wire))]  # the size on the wire: compressed
    with pytest.raises(WireError, match="inflating past the limit of 999") as info:
        MessageReader(999, bits).feed(wire)  # a small message that inflates large: refused
    assert info.value.code == 8


def test_bad_compressed_and_too_large_messages_are_refused() -> None:
    with pytest.raises(WireError, match="without a grpc-encoding") as info:
        MessageReader(100).feed(b"\x01\x00\x00\x00\x01x")
    assert info.value.code == 13
    with pytest.raises(WireError, match="does not inflate"):
        MessageReader(100, 31).feed(b"\x01\x00\x00\x00\x03abc")
    packer = zlib.compressobj(wbits=31)
    packed = packer.compress(b"x" * 50) + packer.flush()
    with pytest.raises(WireError, match="cut short"):
        MessageReader(100, 31).feed(b"\x01" + (len(packed) - 4).to_bytes(4, "big")
                                    + packed[:-4])
    with pytest.raises(WireError, match="larger than the limit of 100") as info:
        MessageReader(100).feed(b"\x00\x00\x00\x00\x65")
    assert info.value.code == 8


def test_trailers_carry_status_message_and_metadata() -> None:
    block = trailers(13, "boom: 100% ünïcode\n", (("request_id", "r-1"), ("x-bin", b"\xff\x00"),
                                                ("X-Mixed", "v")), trailers_only=True)
    decoded = hpack.Decoder().decode(block, raw=True)
    assert decoded == [(b":status", b"200"), (b"content-type", b"application/grpc"),
                       (b"grpc-status", b"13"),
                       (b"grpc-message", b"boom: 100%25 %C3%BCn%C3%AFcode%0A"),
                       (b"request_id", b"r-1"), (b"x-bin", b"/wA"), (b"x-mixed", b"v")]
    assert hpack.Decoder().decode(trailers(0, "", (), trailers_only=False), raw=True) == [
        (b"grpc-status", b"0")]


def test_trailers_leave_out_what_http2_cannot_carry() -> None:
    block = trailers(0, "", (("Bad Key", "v"), ("grpc-status", "3"), ("x-text", "ü"),
                             ("x-bin", "ключ"), ("x-ok", "fine"), ("", "empty")),
                     trailers_only=False)
    assert hpack.Decoder().decode(block, raw=True) == [
        (b"grpc-status", b"0"), (b"x-bin", b"0LrQu9GO0Yc"), (b"x-ok", b"fine")]
