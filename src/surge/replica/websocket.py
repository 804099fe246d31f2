"""A WebSocket at the replica: the ASGI `websocket` scope and events over whole messages.

The proxy speaks the WebSocket protocol with the client (codecs/websocket.py); here the
app sees ASGI's events: `websocket.connect`, then `websocket.receive` per message (its
`WsData`) and `websocket.disconnect` with the client's code (its `WsClose`: 1000 and
the like, 1006 if it vanished, 1009 for a message over the limit, 1001 when idle). What
the app sends becomes `WsAccept` (the 101), `WsData`, `WsClose`. As under uvicorn (Ray
Serve's proxy): a close before the accept is a 403; returning without a close closes
with 1000 (without an accept: 500); raising closes with 1011 (before the accept: 500);
sending after the client left raises `ClientDisconnected` (an OSError: starlette turns
it into `WebSocketDisconnect`). The denial-response extension
(`websocket.http.response.*`) answers the handshake with an HTTP response of the app's.

The app's messages are sent within the window the proxy returns as they reach the client
(as streamed bodies are, transport/flow.py); the client's come through an `Inbox`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from surge.observability.logs import request_id_var
from surge.replica.context import RequestContext, request_context_var
from surge.replica.request import Request
from surge.replica.streams import Inbox
from surge.replica.user_code import asgi_scope
from surge.router.children import child_calls_var
from surge.transport.flow import SendWindow
from surge.transport.messages import HttpRequest, HttpStart, WsAccept, WsClose, WsData

if TYPE_CHECKING:
    from surge.replica.connection import RouterConnection

__all__ = ["ClientDisconnected", "serve_websocket", "websocket_scope"]

log = logging.getLogger("surge.replica")

NORMAL, INTERNAL_ERROR, ABNORMAL = 1000, 1011, 1006
_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
NOT_ASGI = b"WebSocket routes need an ASGI app: serve the deployment with @serve.ingress."


class ClientDisconnected(OSError):
    """The app sent on a WebSocket whose client has closed it."""


def websocket_scope(message: HttpRequest) -> dict[str, Any]:
    scope = asgi_scope(message.method, message.path, message.query, message.headers,
                       message.client, message.route_prefix, message.http_version,
                       message.root_path, message.raw_path, message.scheme)
    del scope["method"]
    scope["type"] = "websocket"
    scope["scheme"] = "wss" if message.scheme == "https" else "ws"
    offered = [value.decode("latin-1") for name, value in message.headers
               if name == b"sec-websocket-protocol"]
    scope["subprotocols"] = [p.strip() for value in offered for p in value.split(",")
                             if p.strip()]
    scope["extensions"] = {"websocket.http.response": {}}
    return scope


class _Session:
    __slots__ = ("accepted", "conn", "denial", "disconnect", "finished", "inbox", "request",
                 "rid", "window")

    def __init__(self, conn: RouterConnection, request: Request) -> None:
        self.conn = conn
        self.request = request
        self.rid = request.id
        self.inbox = request.inbox = Inbox(conn, request.id)
        self.window = request.window = SendWindow()
        self.accepted = False
        self.finished = False  # the final frame (close or HTTP answer) went out
        self.disconnect: dict[str, Any] | None = None  # once the app has heard it
        self.denial: list[Any] | None = None  # [start event, body parts] of a denial

    @property
    def client_gone(self) -> bool:
        return self.inbox.ended or self.inbox.closed

    async def receive(self) -> dict[str, Any]:
        if self.disconnect is not None:
            return self.disconnect
        frame = await self.inbox.get()
        if isinstance(frame, WsData):
            if frame.text:
                return {"type": "websocket.receive", "text": frame.data.decode()}
            return {"type": "websocket.receive", "bytes": frame.data}
        code, reason = (frame.code, frame.reason) if isinstance(frame, WsClose) else (ABNORMAL, "")
        self.disconnect = {"type": "websocket.disconnect", "code": code, "reason": reason}
        return self.disconnect

    async def send(self, event: MutableMapping[str, Any]) -> None:
        kind = event["type"]
        if self.finished:
            raise RuntimeError(f"cannot send {kind!r}: the WebSocket is closed")
        if self.client_gone and self.accepted and kind != "websocket.close":
            raise ClientDisconnected("the WebSocket's client has closed it")
        rid = self.rid
        if kind == "websocket.send":
            if not self.accepted:
                raise RuntimeError("websocket.send before websocket.accept")
            data = event.get("bytes")
            if data is not None:
                await self._windowed(WsData(id=rid, data=bytes(data)))
            else:
                await self._windowed(WsData(id=rid, data=str(event["text"]).encode(),
                                            text=True))
        elif kind == "websocket.accept":
            if self.accepted:
                raise RuntimeError("websocket.accept sent twice")
            self.accepted = True
            await self._windowed(WsAccept(id=rid, subprotocol=event.get("subprotocol"),
                                          headers=list(event.get("headers") or [])))
            self.inbox.grant()  # the client may speak now
        elif kind == "websocket.close":
            code = int(event.get("code") or NORMAL)
            self._final(WsClose(id=rid, code=code, reason=str(event.get("reason") or ""))
                        if self.accepted else HttpStart(id=rid, status=403, headers=[],
                                                        body=b"", more=False))
        elif kind == "websocket.http.response.start" and not self.accepted:
            self.denial = [event, []]
        elif kind == "websocket.http.response.body" and self.denial is not None:
            self.denial[1].append(bytes(event.get("body", b"")))
            if not event.get("more_body", False):
                start = self.denial[0]
                self._final(HttpStart(id=rid, status=int(start["status"]),
                                      headers=list(start.get("headers") or []),
                                      body=b"".join(self.denial[1]), more=False))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} on a WebSocket")

    async def _windowed(self, frame: WsData | WsAccept) -> None:
        """Send once the proxy's window allows: a slow client holds a chatty app back."""
        window = self.window
        while not window.open:
            if self.client_gone:
                raise ClientDisconnected("the WebSocket's client has closed it")
            waiter = self.request.waiter = asyncio.get_running_loop().create_future()
            await waiter
        window.sent(len(frame.data) if isinstance(frame, WsData) else 0)
        self.conn.send(frame)

    def _final(self, frame: WsClose | HttpStart) -> None:
        self.finished = True
        self.conn.send(frame)

    def client_left(self) -> None:
        """A close came from the client: an app waiting for window room gives up."""
        self.request.wake()

    def end(self, failed: bool) -> None:
        """The app returned (or raised): close as uvicorn would if it did not."""
        if self.finished:
            return
        if self.accepted:
            self._final(WsClose(id=self.rid, code=INTERNAL_ERROR if failed else NORMAL))
        else:
            self._final(HttpStart(id=self.rid, status=500, headers=_TEXT,
                                  body=b"Internal Server Error", more=False))


async def serve_websocket(conn: RouterConnection, request: Request, message: HttpRequest) -> bool:
    """Run the app for one WebSocket; False when it raised."""
    server = conn.server
    rid = message.id
    child_calls_var.set(request.children)  # this task's context (connection.py's _run)
    request_id_var.set(message.request_id)
    session = next((v.decode("latin-1") for k, v in message.headers if k == b"x-session-id"), "")
    request_context_var.set(RequestContext(message.route_prefix, message.request_id,
                                           server.app, message.model_id, is_http_request=True,
                                           client=message.client, session_id=session))
    app = server.user.asgi_app
    if app is None:
        conn.send(HttpStart(id=rid, status=403, headers=_TEXT, body=NOT_ASGI, more=False))
        return True
    websocket = _Session(conn, request)
    websocket.inbox.on_end = websocket.client_left
    connected = False

    async def receive() -> dict[str, Any]:
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        return await websocket.receive()

    try:
        await server.user.handle_websocket(websocket_scope(message), receive, websocket.send)
    except asyncio.CancelledError:  # its client went before the accept, or the proxy
        websocket.end(True)
        return True
    except Exception as exc:
        if not isinstance(exc, ClientDisconnected):
            log.exception("%s: WebSocket %s raised", server.name, message.path)
            if server.metrics:
                server.recorder.exception(message.route_prefix, type(exc).__name__)
        websocket.end(True)
        return isinstance(exc, ClientDisconnected)
    websocket.end(False)
    return True
