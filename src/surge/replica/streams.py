"""A request's own stream, at the replica: a streamed upload's body parts or a WebSocket's
messages, taken by the app in order, credit returned as it takes them.

The router sends such frames only against credit (transport/flow.py, the same window as
response streams, the other way): `Inbox.grant` opens `STREAM_WINDOW` when the request
is admitted (or the WebSocket accepted), and each part the app takes is passed on to
`Credits`, which returns room to the proxy in batches of half a window. A slow app so
stops its client's upload at the proxy, and what waits here is at most a window.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from surge.transport.flow import STREAM_WINDOW, Credits
from surge.transport.messages import Credit, HttpBody, HttpRequest, WsClose, WsData

if TYPE_CHECKING:
    from surge.transport.connection import FramedProtocol

__all__ = ["Inbox", "Receive", "StreamFrame", "upload_receiver"]

StreamFrame = HttpBody | WsData | WsClose
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Inbox:
    """One request's stream frames, arrived and not yet taken by the app."""

    __slots__ = ("_credits", "_frames", "_link", "_waiter", "closed", "ended", "on_end",
                 "request_id")

    def __init__(self, link: FramedProtocol, request_id: int) -> None:
        self._link = link
        self.request_id = request_id
        self._credits = Credits()
        self._frames: deque[StreamFrame] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False  # the request was cancelled, or its router went away
        self.ended = False  # the stream's last frame arrived (the body's end, a close)
        self.on_end: Callable[[], None] | None = None  # told of a close or a cancel

    def __repr__(self) -> str:
        return (f"<Inbox {self.request_id} frames={len(self._frames)} closed={self.closed} "
                f"ended={self.ended} {self._credits!r}>")

    def grant(self) -> None:
        self._link.send(Credit(id=self.request_id, amount=STREAM_WINDOW))

    def put(self, frame: StreamFrame) -> None:
        if isinstance(frame, WsClose) or (isinstance(frame, HttpBody) and not frame.more):
            self.ended = True
        if not isinstance(frame, WsClose):  # a close comes past the window: no charge
            self._give(self._credits.delivered(_size(frame)))
        self._frames.append(frame)
        self._wake()
        if self.ended and self.on_end is not None:
            self.on_end()

    def close(self) -> None:
        self.closed = True
        self._wake()
        if self.on_end is not None:
            self.on_end()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> StreamFrame | None:
        """The next frame; None once the request is cancelled and nothing is left."""
        frames = self._frames
        while not frames:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        frame = frames.popleft()
        if not isinstance(frame, WsClose):
            self._give(self._credits.consumed(_size(frame)))
        return frame

    def _give(self, amount: int) -> None:
        if amount and not self.closed:
            self._link.send(Credit(id=self.request_id, amount=amount))


def _size(frame: HttpBody | WsData) -> int:
    return len(frame.body) if isinstance(frame, HttpBody) else len(frame.data)


def upload_receiver(inbox: Inbox, message: HttpRequest, disconnected: asyncio.Event,
                    ) -> Receive:
    """ASGI `receive` for a streamed body (its parts reach `inbox`): its parts as they
    come (`more_body=True` until the last), then `http.disconnect` once the client is
    gone."""
    inbox.grant()
    first = True
    done = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal first, done
        if first:
            first = False
            return {"type": "http.request", "body": message.body, "more_body": True}
        if not done:
            frame = await inbox.get()
            if isinstance(frame, HttpBody):
                done = not frame.more
                return {"type": "http.request", "body": frame.body, "more_body": frame.more}
            done = True  # cancelled: the rest of the body will not come
        await disconnected.wait()
        return {"type": "http.disconnect"}

    return receive
