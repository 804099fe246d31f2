"""Credit-based flow control for response streams: a slow consumer costs bounded memory.

A replica may have at most `STREAM_WINDOW` of one response's stream frames (an HTTP
body streamed in parts, or a handle's `stream=True` items) that its consumer has not yet
passed on. Each frame is charged its payload plus `FRAME_CHARGE` (so a stream of empty
or tiny frames is bounded too). The replica's `SendWindow` stops the user's generator
when the window is spent; the router's `Credits` for the request learns of every frame
it delivered, hears from the sink how many payload bytes it has passed on (written to
its client, or handed to the iterating caller), and returns the charge of those frames
to the replica in `Credit` frames, in batches of at least half a window (like TCP's
window updates), so a fast stream costs a credit frame per half window, not per chunk.

Neither side here does I/O: the replica server and the router link call these and send
the frames they say to send.
"""

from __future__ import annotations

from collections import deque

__all__ = ["FRAME_CHARGE", "STREAM_WINDOW", "Credits", "SendWindow", "charge"]

# What a consumer may be behind by, per stream: ~2,000 typical LLM token chunks, or 8
# chunks of 64 KiB. Small enough that 1,000 slow readers cost < 1 GiB in the worst case.
STREAM_WINDOW = 512 * 1024
# Charged per frame on top of its payload: about what a decoded frame costs in memory.
FRAME_CHARGE = 64


def charge(payload_bytes: int) -> int:
    return payload_bytes + FRAME_CHARGE


class SendWindow:
    """The replica's side of one stream: what it may still send before it must wait."""

    __slots__ = ("left",)

    def __init__(self, window: int = STREAM_WINDOW) -> None:
        self.left = window

    def __repr__(self) -> str:
        return f"<SendWindow left={self.left}>"

    @property
    def open(self) -> bool:
        """Whether the next frame may go now (it may overdraw the window once)."""
        return self.left > 0

    def sent(self, payload_bytes: int) -> None:
        self.left -= charge(payload_bytes)

    def credit(self, amount: int) -> None:
        self.left += amount


class Credits:
    """The router's side of one stream: frames delivered to the sink, and what to return.

    `delivered(n)` for each frame handed to the sink (n payload bytes); `consumed(n)`
    when the sink has passed n more payload bytes on, in order. Both return the credit
    to send to the replica now (0: nothing yet).
    """

    __slots__ = ("_frames", "_owed", "_partial", "threshold")

    def __init__(self, window: int = STREAM_WINDOW) -> None:
        self._frames: deque[int] = deque()  # payload sizes delivered, not yet passed on
        self._partial = 0  # payload bytes passed on of the oldest frame
        self._owed = 0  # charge of frames passed on, not yet returned
        self.threshold = window // 2

    def __repr__(self) -> str:
        return f"<Credits held={len(self._frames)} owed={self._owed}>"

    @property
    def held(self) -> int:
        """Frames delivered to the sink that it has not passed on."""
        return len(self._frames)

    def delivered(self, payload_bytes: int) -> int:
        self._frames.append(payload_bytes)
        if payload_bytes == 0:  # nothing to pass on: passed on as it arrives
            return self.consumed(0)
        return 0

    def consumed(self, payload_bytes: int) -> int:
        self._partial += payload_bytes
        frames = self._frames
        while frames and frames[0] <= self._partial:
            size = frames.popleft()
            self._partial -= size
            self._owed += charge(size)
        if self._owed < self.threshold:
            return 0
        owed, self._owed = self._owed, 0
        return owed
