"""python-hyper's `h2` behind the interface of surge's own HTTP/2 stack: the subject of
the A/B in bench/README.md ("HTTP/2: surge's stack or h2").

`HyperConnection` is what `proxy/grpc_core.py` asks of `codecs.h2.H2Connection`
(`receive`, `out`, `send_headers`, `send_data`, `reset`, `goaway`, `consumed`, `busy`,
`close`, `streams`, `blocked`, `started`, and the `Listener` callbacks) done with h2's
`H2Connection`. What h2 does not do, this adapter does, as surge's stack does it:
- it holds the data the client's windows refuse (h2 raises instead), per stream and in
  order, at most MAX_HELD_BYTES past one message, with trailers waiting behind it, and
  tells the listener `drained`;
- it decodes the ready-encoded header blocks that grpc_wire makes into the lists h2
  encodes again (the response headers once: they never change);
- it gives the connection's window back as data arrives and a stream's as the listener
  consumes it, as surge's stack does (h2 leaves both to its user);
- its GOAWAY for a drain is written beside h2 (h2 closes its state machine on one and
  would refuse the open streams' later frames), and streams opened after it are
  refused REFUSED_STREAM here.
h2 delivers DATA one whole frame at a time (surge's stack: as the reads bring it).

    python bench/h2_hyper.py [--calls 20000] [--rounds 3]

runs it as a measurement of its own: unary calls of 100 B through one connection's
GrpcCore in this process, each codec in turn (interleaved rounds), and prints the
server side's time per call (HTTP/2 in and out, the core's decisions; no sockets, no
router, no replica).

How a process gets it (`install`): bench/h2_hyper_site/sitecustomize.py replaces
`proxy/grpc_core.py`'s `H2Connection` with this class when that module is imported, in
every process started with the directory on PYTHONPATH (bench/grpc_echo.py's `hyper`
system); bench/h2_conformance.py's `--codec hyper` does it in its own process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from types import ModuleType

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from surge.codecs.h2 import H2Error
from surge.codecs.h2_frames import (
    CONNECTION_WINDOW,
    DEFAULT_WINDOW,
    FRAME_SIZE,
    GOAWAY,
    NO_ERROR,
    REFUSED_STREAM,
    STREAM_WINDOW,
    frame,
)
from surge.codecs.h2_send import BaseStream, Listener, sent_or_held
from surge.codecs.hpack import Decoder, Header

__all__ = ["HyperConnection", "install"]

_CONFIG = h2.config.H2Configuration(
    client_side=False, header_encoding=None,
    # Inbound validation is the point (RFC 9113 8.2-8.3); what this side sends is
    # surge's own and well formed, so h2 is spared checking it (surge's stack does not).
    validate_outbound_headers=False, normalize_outbound_headers=False)


class _Stream(BaseStream):
    __slots__ = ("trailers",)

    def __init__(self, remote_closed: bool) -> None:
        super().__init__(remote_closed)
        self.trailers: list[Header] | None = None


class HyperConnection:
    __slots__ = ("_conn", "_conn_unacked", "_decoder", "_received", "_response", "blocked",
                 "goaway_sent", "listener", "out", "streams")

    def __init__(self, listener: Listener, max_streams: int = 1024,
                 max_header_list: int = 16 * 1024, clock: object = None) -> None:
        self.listener = listener
        self.streams: dict[int, _Stream] = {}
        self.blocked: dict[int, None] = {}
        self.out: list[bytes | memoryview] = []
        self.goaway_sent = False
        self._decoder = Decoder()
        self._response: dict[bytes, list[Header]] = {}  # header blocks decoded once
        self._received = 0
        self._conn_unacked = 0
        conn = self._conn = h2.connection.H2Connection(_CONFIG)
        conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: FRAME_SIZE,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_list,
            h2.settings.SettingCodes.ENABLE_PUSH: 0})
        # Settings given so are h2's current ones at once, not waiting for their ACK:
        # what h2 reads from them when it starts is set again.
        conn.max_inbound_frame_size = FRAME_SIZE
        conn.decoder.max_header_list_size = max_header_list
        conn.initiate_connection()
        conn.increment_flow_control_window(CONNECTION_WINDOW - DEFAULT_WINDOW)
        self._write()

    @property
    def started(self) -> bool:
        return self._received >= 24  # the client's preface is in (h2 raised otherwise)

    def __repr__(self) -> str:
        return f"<HyperConnection streams={len(self.streams)} blocked={len(self.blocked)}>"

    def _write(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self.out.append(data)

    def close(self) -> None:
        self.streams.clear()
        self.blocked.clear()
        self.out.clear()

    def busy(self) -> bool:
        return bool(self.streams or self.blocked)

    # -- receiving -------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            if self._conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
                self._conn.close_connection(int(exc.error_code))  # a bad preface: h2 sent none
            self._write()
            raise H2Error(int(exc.error_code), str(exc) or type(exc).__name__) from exc
        self._received += len(data)
        for event in events:
            self._event(event)
        self._write()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None and not stream.remote_closed:  # after trailers
                stream.remote_closed = True
                self.listener.data(event.stream_id, b"", True)
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id:
                stream = self.streams.get(event.stream_id)
                if stream is not None and stream.held:
                    self._flush(event.stream_id, stream)
            else:
                self._flush_blocked()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._flush_blocked()
        elif isinstance(event, h2.events.StreamReset):
            sid = event.stream_id
            if sid is not None and self.streams.pop(sid, None) is not None:
                self.blocked.pop(sid, None)
                self.listener.reset(sid, int(event.error_code or 0))
        # Pings and settings are answered by h2; priorities and the rest are advice.

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        assert sid is not None and event.headers is not None
        end = event.stream_ended is not None
        if self.goaway_sent:
            self._conn.reset_stream(sid, REFUSED_STREAM)
            return
        self.streams[sid] = _Stream(end)
        headers: list[Header] = event.headers  # bytes: header_encoding=None
        size = sum(len(name) + len(value) + 32 for name, value in headers)
        self.listener.headers(sid, headers, size, end)

    def _data(self, event: h2.events.DataReceived) -> None:
        sid, data = event.stream_id, event.data
        assert sid is not None and data is not None
        length = event.flow_controlled_length or 0
        self._conn_unacked += length  # the connection's window, given back as it comes
        if self._conn_unacked >= CONNECTION_WINDOW // 2:
            self._conn.increment_flow_control_window(self._conn_unacked)
            self._conn_unacked = 0
        stream = self.streams.get(sid)
        if stream is None:
            return
        end = event.stream_ended is not None
        stream.remote_closed = end
        if length > len(data):
            self.consumed(sid, length - len(data))  # padding is consumed at once
        self.listener.data(sid, data, end)

    def consumed(self, stream_id: int, size: int) -> None:
        stream = self.streams.get(stream_id)
        owed = 0 if stream is None else stream.consumed(size)
        if owed:
            self._conn.increment_flow_control_window(owed, stream_id)
            self._write()

    # -- sending ---------------------------------------------------------------------------

    def _decoded(self, block: bytes, end_stream: bool) -> list[Header]:
        if not end_stream:  # the response headers: one block, always the same
            headers = self._response.get(block)
            if headers is None:
                headers = self._response[block] = self._decoder.decode(block, 1 << 20)[0]
            return headers
        trailers: list[Header] = self._decoder.decode(block, 1 << 20)[0]
        return trailers

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        headers = self._decoded(block, end_stream)
        if end_stream and stream.held:
            stream.trailers = headers
            return
        try:
            self._conn.send_headers(stream_id, headers, end_stream=end_stream)
        except h2.exceptions.ProtocolError:  # the stream or the connection closed
            self._gone(stream_id)  # reset later in the read whose events are being told
            return
        if end_stream:
            self._closed_local(stream_id, stream)
        self._write()

    def _gone(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)
        self.blocked.pop(stream_id, None)

    def send_data(self, stream_id: int, data: bytes) -> bool:
        stream = self.streams.get(stream_id)
        if stream is None:
            return True
        if stream.held.behind(stream_id, data):
            return False
        try:
            sent = self._send(stream_id, data)
        except h2.exceptions.ProtocolError:  # the stream or the connection closed
            self._gone(stream_id)  # reset later in the read whose events are being told
            return True
        self._write()
        return sent_or_held(stream_id, stream, data, sent, self.blocked)

    def _send(self, stream_id: int, data: bytes | memoryview) -> int:
        conn = self._conn
        allowed = min(len(data), conn.local_flow_control_window(stream_id))
        if allowed <= 0:
            return 0
        limit = conn.max_outbound_frame_size
        if allowed == len(data) and allowed <= limit:
            conn.send_data(stream_id, data)  # h2 takes any buffer: no copy before its frame
            return allowed
        view = memoryview(data)
        for at in range(0, allowed, limit):
            conn.send_data(stream_id, view[at:min(at + limit, allowed)])
        return allowed

    def _flush(self, stream_id: int, stream: _Stream) -> None:
        try:
            self._flush_held(stream_id, stream)
        except h2.exceptions.ProtocolError:  # the stream or the connection closed
            self._gone(stream_id)

    def _flush_held(self, stream_id: int, stream: _Stream) -> None:
        if not stream.held.drain(partial(self._send, stream_id)):
            self.blocked.pop(stream_id, None)  # to the back: the others go first
            self.blocked[stream_id] = None
            self._write()
            return
        self.blocked.pop(stream_id, None)
        if stream.trailers is not None:
            self._conn.send_headers(stream_id, stream.trailers, end_stream=True)
            stream.trailers = None
            self._closed_local(stream_id, stream)
        self._write()
        self.listener.drained(stream_id)

    def _flush_blocked(self) -> None:
        for stream_id in list(self.blocked):
            stream = self.streams.get(stream_id)
            if stream is None:
                self.blocked.pop(stream_id, None)
            elif self._conn.local_flow_control_window(stream_id) > 0:
                self._flush(stream_id, stream)

    def _closed_local(self, stream_id: int, stream: _Stream) -> None:
        """This side ended the stream; a client still sending is told to stop."""
        self.streams.pop(stream_id, None)
        self.blocked.pop(stream_id, None)
        if not stream.remote_closed:
            try:
                self._conn.reset_stream(stream_id, NO_ERROR)
            except h2.exceptions.ProtocolError:  # the stream or the connection closed
                pass

    def reset(self, stream_id: int, code: int) -> None:
        if self.streams.pop(stream_id, None) is not None:
            self.blocked.pop(stream_id, None)
            try:
                self._conn.reset_stream(stream_id, code)
            except h2.exceptions.ProtocolError:  # the stream or the connection closed
                pass
            self._write()

    def goaway(self) -> None:
        if not self.goaway_sent:
            self.goaway_sent = True
            last = self._conn.highest_inbound_stream_id
            self.out.append(frame(GOAWAY, 0, 0, last.to_bytes(4, "big")
                                  + NO_ERROR.to_bytes(4, "big")))


def install(module: ModuleType | None = None) -> None:
    """Make `proxy/grpc_core.py` (imported now, or `module`) build HyperConnections."""
    if module is None:
        from surge.proxy import grpc_core

        module = grpc_core
    setattr(module, "H2Connection", HyperConnection)  # noqa: B010
    print(f"h2 {h2.__version__} behind surge's gRPC core", file=sys.stderr, flush=True)


def per_call_us(codec: str, calls: int) -> float:
    """Server-side µs per unary call of 100 B, with surge's stack or h2 (`codec`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.proxy.test_grpc_core import SAY, Sink, Site

    from surge.proxy.grpc_core import GrpcCore
    from surge.transport.messages import GrpcEnd

    site = Site()
    core = GrpcCore(site, time.monotonic, Sink())
    if codec == "hyper":
        core.h2 = HyperConnection(core, 1024, site.max_header_bytes)  # type: ignore[assignment]
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    head = [(":method", "POST"), (":scheme", "http"), (":path", SAY.path),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers"), ("request_id", "r")]
    body = b"\x00" + (100).to_bytes(4, "big") + b"x" * 100
    spent = 0.0
    for _ in range(calls):
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, head)
        client.send_data(stream, body, end_stream=True)
        data = client.data_to_send()
        began = time.perf_counter()
        core.receive(data)
        for call in core.submits:
            core.delivered(call, GrpcEnd(0, 0, "", [], b"y" * 100, True))
        core.submits.clear()
        core.ended.clear()
        out = b"".join(core.h2.out)
        core.h2.out.clear()
        spent += time.perf_counter() - began
        for event in client.receive_data(out):
            if isinstance(event, h2.events.DataReceived) and event.stream_id:
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
    return spent / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description="server-side time per unary call, "
                                                 "surge's HTTP/2 vs h2, in process")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"surge": [], "hyper": []}
    for number in range(args.rounds):
        for codec in ("surge", "hyper") if number % 2 == 0 else ("hyper", "surge"):
            times[codec].append(per_call_us(codec, args.calls))
            print(f"round {number + 1} {codec}: {times[codec][-1]:.1f} µs/call", flush=True)
    surge, hyper = statistics.median(times["surge"]), statistics.median(times["hyper"])
    print(f"summary: surge_us_per_call={surge:.1f} hyper_us_per_call={hyper:.1f} "
          f"ratio={hyper / surge:.2f}")


if __name__ == "__main__":
    main()
