"""What an exchange sends its replica after the request: a streamed upload's body parts, or
a WebSocket's messages, under the window the replica grants (transport/flow.py).

The window starts shut: a replica grants `STREAM_WINDOW` when it admits the request (a
replica that rejects it never saw a byte of the body) and more as the app reads. Frames
that do not fit wait here, and while the window is shut the connection stops reading
from the client (`H1Connection.upload_paused`), so a slow app holds the client back
instead of piling its bytes up in the proxy: what waits is at most one read's worth.
"""

from __future__ import annotations

from collections import deque

from surge.transport.flow import SendWindow
from surge.transport.messages import HttpBody, WsClose, WsData

__all__ = ["Upstream", "UpstreamFrame"]

UpstreamFrame = HttpBody | WsData | WsClose


class Upstream:
    __slots__ = ("queue", "queued", "window")

    def __init__(self) -> None:
        self.window = SendWindow(0)
        self.queue: deque[tuple[UpstreamFrame, int]] = deque()
        self.queued = 0  # payload bytes waiting for credit

    def __repr__(self) -> str:
        return f"<Upstream left={self.window.left} queued={len(self.queue)}/{self.queued}B>"

    @property
    def paused(self) -> bool:
        """Stop reading from the client: the replica has not granted room for more."""
        return not self.window.open

    def push(self, frame: UpstreamFrame, nbytes: int) -> None:
        self.queue.append((frame, nbytes))
        self.queued += nbytes

    def credit(self, amount: int) -> None:
        self.window.credit(amount)

    def ready(self) -> list[UpstreamFrame]:
        """The frames the window lets go now, charged to it (the last may overdraw it)."""
        window, queue = self.window, self.queue
        frames: list[UpstreamFrame] = []
        while queue and window.open:
            frame, nbytes = queue.popleft()
            self.queued -= nbytes
            window.sent(nbytes)
            frames.append(frame)
        return frames

    def drop(self) -> None:
        self.queue.clear()
        self.queued = 0
