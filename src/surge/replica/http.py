"""An HTTP request at the replica: the ASGI `http` scope and events over frames.

The app gets the request's first frame as its one `http.request` event, or, when the
body streams (an upload), its parts as they come through an `Inbox`
(replica/streams.py); then `http.disconnect` once the client has gone. What it sends
becomes `HttpStart` (the head with the first body part) and `HttpBody` frames; a body
sent in parts goes within the window the proxy returns (transport/flow.py). A deployment
without an ASGI app answers with what its `__call__` returned, in one `HttpStart`. The app
raising before its head is a 500; after it, a `Failure` that ends the stream (the proxy
cuts the connection). WebSockets are replica/websocket.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from surge.observability.logs import request_id_var
from surge.replica.context import RequestContext, request_context_var
from surge.replica.request import Request
from surge.replica.streams import Inbox, Receive, upload_receiver
from surge.replica.user_code import asgi_scope
from surge.router.children import child_calls_var
from surge.transport.messages import Failure, HttpBody, HttpRequest, HttpStart

if TYPE_CHECKING:
    from surge.replica.connection import RouterConnection

__all__ = ["SESSION_HEADER", "serve_http"]

log = logging.getLogger("surge.replica")

_INTERNAL_ERROR = b"Internal Server Error"
# Ray's RAY_SERVE_SESSION_ID_HEADER_KEY default: the request context's session_id.
SESSION_HEADER = b"x-session-id"


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return ""


async def serve_http(conn: RouterConnection, request: Request, message: HttpRequest) -> bool:
    """Serve an HTTP request; False when the user's code raised."""
    rid = message.id
    child_calls_var.set(request.children)  # this task's context (connection.py's _run)
    request_id_var.set(message.request_id)
    request_context_var.set(RequestContext(
        message.route_prefix, message.request_id, conn.server.app,
        message.model_id, is_http_request=True,
        client=message.client, session_id=_header(message.headers, SESSION_HEADER)))
    scope = asgi_scope(message.method, message.path, message.query, message.headers,
                       message.client, message.route_prefix, message.http_version,
                       message.root_path, message.raw_path, message.scheme)
    disconnected = request.disconnected = asyncio.Event()
    body_sent = False

    async def first_frame() -> MutableMapping[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": message.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    receive: Receive = first_frame
    if message.more_body:  # the body streams in after this frame
        request.inbox = Inbox(conn, rid)
        receive = upload_receiver(request.inbox, message, disconnected)

    start: MutableMapping[str, Any] | None = None
    started = False

    async def send(event: MutableMapping[str, Any]) -> None:
        nonlocal start, started
        kind = event["type"]
        if kind == "http.response.start":
            start = event
        elif kind == "http.response.body":
            body = bytes(event.get("body", b""))
            more = bool(event.get("more_body", False))
            frame: HttpStart | HttpBody
            if not started:
                started = True
                head = start or {"status": 200, "headers": []}
                frame = HttpStart(id=rid, status=int(head["status"]),
                                  headers=list(head.get("headers") or []), body=body,
                                  more=more)
            else:
                frame = HttpBody(id=rid, body=body, more=more)
            if more:
                await conn.send_stream(frame, len(body))
            else:
                conn.send(frame)

    try:
        simple = await conn.server.user.handle_http(scope, receive, send)
        if simple is not None:
            started = True
            conn.send(HttpStart(id=rid, status=simple[0], headers=simple[1], body=simple[2],
                                more=False))
        elif not started:
            raise RuntimeError("the ASGI app returned without sending a response")
    except asyncio.CancelledError:
        conn.send(Failure(id=rid, kind="cancelled", message="request cancelled"))
    except Exception as exc:
        log.exception("%s: %s %s raised", conn.server.name, message.method, message.path)
        if conn.server.metrics:
            conn.server.recorder.exception(message.route_prefix, type(exc).__name__)
        if started:  # the head is gone: end the stream; the proxy cuts the connection
            conn.send(Failure(id=rid, kind="user", message="response stream failed"))
        else:
            conn.send(HttpStart(id=rid, status=500,
                                headers=[(b"content-type", b"text/plain; charset=utf-8")],
                                body=_INTERNAL_ERROR, more=False))
        return False
    return True
