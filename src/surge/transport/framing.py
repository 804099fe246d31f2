"""Length-prefixed msgpack frames: encode into one buffer, decode from a byte stream."""

from __future__ import annotations

import msgspec

from surge.transport.messages import Message

__all__ = ["MAX_FRAME_BYTES", "FrameDecoder", "FrameEncoder", "FrameTooLarge"]

# A frame carries at most one request or response body (limited to 100 MiB by default).
MAX_FRAME_BYTES = 1 << 30
_HEADER = 4


class FrameTooLarge(Exception):
    pass


class FrameEncoder:
    """Appends frames to a bytearray without intermediate copies."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def append(self, buffer: bytearray, message: Message) -> None:
        start = len(buffer)
        self._encoder.encode_into(message, buffer, start + _HEADER)
        size = len(buffer) - start - _HEADER
        buffer[start:start + _HEADER] = size.to_bytes(_HEADER, "big")

    def encode(self, message: Message) -> bytes:
        buffer = bytearray()
        self.append(buffer, message)
        return bytes(buffer)


class FrameDecoder:
    """Feed bytes, get back the complete messages they finish."""

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._buffer = bytearray()
        self.max_frame = MAX_FRAME_BYTES  # lowered until a peer has authenticated

    def feed(self, data: bytes) -> list[Message]:
        buffer = self._buffer
        buffer += data
        messages: list[Message] = []
        offset, end = 0, len(buffer)
        view = memoryview(buffer)
        try:
            while end - offset >= _HEADER:
                size = int.from_bytes(view[offset:offset + _HEADER], "big")
                if size > self.max_frame:
                    raise FrameTooLarge(f"frame of {size} bytes exceeds {self.max_frame}")
                if end - offset - _HEADER < size:
                    break
                start = offset + _HEADER
                messages.append(self._decoder.decode(view[start:start + size]))
                offset = start + size
        finally:
            view.release()
        if offset:
            del buffer[:offset]
        return messages
