"""HTTP/2's vocabulary (RFC 9113) for codecs/h2.py: frame types, flags, error codes,
settings, this side's limits, frames written, and the guard against floods of cheap
frames."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FloodGuard", "H2Error", "frame", "settings", "unpad"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 4, 5, 6
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
# What this side allows: a stream may hold 4 MiB unread, frames up to 1 MiB (fewer to
# parse for large messages), the connection 16 MiB in flight.
STREAM_WINDOW = 4 * 1024 * 1024
FRAME_SIZE = 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024
# Frames that cost the client nothing and this side work or memory (PING and SETTINGS
# to answer, resets of streams just opened: CVE-2023-44487, empty DATA and
# CONTINUATION): a connection may send this many a second, in bursts of as many.
CHEAP_FRAMES_PER_S = 2000.0


class H2Error(Exception):
    """A connection error: GOAWAY with `code` is in `out`; close after writing it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags))
            + stream_id.to_bytes(4, "big") + payload)


def settings(*pairs: tuple[int, int]) -> bytes:
    return b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs)


def unpad(payload: bytes) -> bytes | None:
    """A PADDED frame's content (None: the padding runs past the frame)."""
    if not payload:
        return None
    pad = payload[0]
    if pad >= len(payload):
        return None
    return payload[1:len(payload) - pad]


class FloodGuard:
    """A token bucket of `rate` cheap frames a second; `spend` is False once it is dry."""

    __slots__ = ("_at", "_clock", "_rate", "_tokens")

    def __init__(self, clock: Callable[[], float], rate: float = CHEAP_FRAMES_PER_S) -> None:
        self._clock = clock
        self._rate = rate
        self._tokens = rate
        self._at = clock()

    def spend(self) -> bool:
        self._tokens -= 1.0
        if self._tokens >= 0.0:
            return True
        now = self._clock()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        return self._tokens >= 0.0
