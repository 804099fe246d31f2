"""Messages between a replica and its node's weight store: typed, msgpack, framed.

One Unix-socket connection per process; each frame is a 4-byte big-endian length and a
msgpack-encoded tagged struct. A client sends `Load` or `Stats` and waits for the answer
with the same `request` number (`Loaded`, `Failed`, `StatsReply`); `Release` has no
answer. The connection is the unit of reference counting: the store drops every
reference a connection holds when it closes, which the kernel does for a process that
is SIGKILLed.
"""

from __future__ import annotations

import socket
import struct

import msgspec

from surge.weights.formats import Tensor

__all__ = ["MAX_FRAME_BYTES", "ClientMessage", "EntryInfo", "EntryStats", "Failed", "Load",
           "Loaded", "Release", "ServerMessage", "Stats", "StatsReply", "StoreStats",
           "decode_client", "decode_server", "encode", "recv_frame"]

MAX_FRAME_BYTES = 4 << 20  # a Stats reply of the most entries is ~0.5 MB
_LENGTH = struct.Struct(">I")


class Load(msgspec.Struct, frozen=True, tag="load"):
    request: int
    name: str
    source: str  # an absolute path


class Release(msgspec.Struct, frozen=True, tag="release"):
    key: str  # one reference, taken by a Load, given back


class Stats(msgspec.Struct, frozen=True, tag="stats"):
    request: int


class EntryInfo(msgspec.Struct, frozen=True):
    key: str  # the content hash (SHA-256, hex)
    name: str
    path: str  # the entry's file: a safetensors file
    nbytes: int
    source: str
    materialise_s: float  # how long the store took to make it
    data_start: int  # where the tensors' data starts in the file (its header's length)
    tensors: list[Tensor]  # the header, parsed once by the store
    metadata: dict[str, str]


class Loaded(msgspec.Struct, frozen=True, tag="loaded"):
    request: int
    entry: EntryInfo
    hit: bool  # it was there already


class Failed(msgspec.Struct, frozen=True, tag="failed"):
    request: int
    kind: str  # source | budget | full | internal
    message: str


class EntryStats(msgspec.Struct, frozen=True):
    key: str
    name: str
    path: str
    nbytes: int
    refs: int
    holders: list[int]  # pids of the processes holding references
    idle_s: float  # since it was last asked for


class StoreStats(msgspec.Struct, frozen=True):
    pid: int
    directory: str
    budget_bytes: int
    used_bytes: int
    entries: list[EntryStats]
    hits: int
    materialised: int
    evicted: int


class StatsReply(msgspec.Struct, frozen=True, tag="stats_reply"):
    request: int
    stats: StoreStats


ClientMessage = Load | Release | Stats
ServerMessage = Loaded | Failed | StatsReply

_encoder = msgspec.msgpack.Encoder()
_client = msgspec.msgpack.Decoder(ClientMessage)
_server = msgspec.msgpack.Decoder(ServerMessage)


def encode(message: ClientMessage | ServerMessage) -> bytes:
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def decode_client(body: bytes) -> ClientMessage:
    return _client.decode(body)


def decode_server(body: bytes) -> ServerMessage:
    return _server.decode(body)


def recv_frame(sock: socket.socket) -> bytes:
    """One frame's body from a blocking socket; ConnectionError when it closes."""
    head = _recv_exactly(sock, _LENGTH.size)
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME_BYTES:
        raise ConnectionError(f"a {length:,}-byte frame from the weight store")
    return _recv_exactly(sock, length)


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the weight store closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
