"""Hostile bytes into the gRPC port's HTTP/2 and HPACK, sans I/O: whatever arrives, the
connection either goes on or fails with H2Error (GOAWAY written), and a header block
either decodes or raises HpackError: nothing else escapes to crash the proxy."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from surge.codecs import h2 as core
from surge.codecs.hpack import Decoder, Header, HpackError


class Answering:
    """Answers every stream it hears of, so the send paths run too."""

    def __init__(self) -> None:
        self.server: core.H2Connection | None = None

    def headers(self, stream_id: int, headers: list[Header], size: int,
                end_stream: bool) -> None:
        assert self.server is not None
        self.server.send_headers(stream_id, b"\x88")
        self.server.send_data(stream_id, b"x" * 70_000)
        self.server.send_headers(stream_id, b"\x00\x0bgrpc-status\x010", True)

    def data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None:
        assert self.server is not None
        self.server.consumed(stream_id, len(data))

    def reset(self, stream_id: int, code: int) -> None:
        pass

    def drained(self, stream_id: int) -> None:
        pass


frames = st.builds(
    lambda kind, flags, stream, payload: core.frame(kind, flags, stream, payload),
    st.integers(0, 12), st.integers(0, 255), st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.one_of(st.binary(max_size=64),
              st.sampled_from([b"\x82\x87\x84", bytes(4), bytes(8), b"\x00\x04\x7f\xff\xff\xff",
                               b"\x00\x05\x00\x00\x40\x00", b"\x7f\xff\xff\xff"])))


@settings(max_examples=400, deadline=None)
@given(st.lists(frames, max_size=12), st.integers(1, 40))
def test_any_frames_either_serve_or_fail_with_goaway(sequence: list[bytes], cut: int) -> None:
    listener = Answering()
    server = listener.server = core.H2Connection(listener, max_streams=4)
    wire = core.PREFACE + core.frame(core.SETTINGS, 0, 0) + b"".join(sequence)
    try:
        for start in range(0, len(wire), cut):
            server.receive(wire[start:start + cut])
    except core.H2Error:
        assert server.out[-1][3] == core.GOAWAY
    assert all(isinstance(chunk, bytes | memoryview) for chunk in server.out)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=48), max_size=4))
def test_any_header_block_decodes_or_is_a_compression_error(blocks: list[bytes]) -> None:
    decoder = Decoder()
    for block in blocks:
        try:
            headers: Any = decoder.decode(block, 4096)
        except HpackError:
            continue
        assert all(isinstance(name, bytes) and isinstance(value, bytes)
                   for name, value in headers[0])
