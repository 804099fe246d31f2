"""The OpenAI HTTP API as a bare ASGI app: no framework between the replica and the engine.

`GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/chat/completions`,
`POST /v1/completions`, `POST /v1/embeddings`, and `GET /health`. The app only moves
bytes: `answer()` (shared with the multi-model ingress) turns one request into a head and
either a whole body or the stream's parts, and every failure into OpenAI's error body
with its status. A stream's parts go to `send` as they come (the replica flushes each at
once; it waits only while the client is a flow-control window behind).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from contextlib import aclosing
from typing import Any

from surge.llm.protocol import OpenAIError
from surge.llm.responses import DONE, encode, sse
from surge.llm.service import OpenAIService, engine_error
from surge.policy.admission import retry_after_header
from surge.policy.dispatch import SHED_HEADER

__all__ = ["ROUTES", "Head", "OpenAIApp", "answer", "error_head", "relative_path"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
# (status, headers, body): body None means the stream's parts follow.
Head = tuple[int, list[tuple[bytes, bytes]], bytes | None]

JSON = [(b"content-type", b"application/json")]
EVENTS = [(b"content-type", b"text/event-stream; charset=utf-8"),
          (b"cache-control", b"no-cache")]
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/v1/embeddings": "embeddings"}


def error_head(error: OpenAIError) -> Head:
    headers = list(JSON)
    if error.status == 429 and error.type == "rate_limit_error":  # this engine is behind:
        headers.append((SHED_HEADER, b"1"))  # the router tries one other replica first
    if error.retry_after_s is not None:
        # whole seconds, rounded up as the proxy's own: a client never comes back early
        headers.append((b"retry-after",
                        retry_after_header(max(1.0, error.retry_after_s)).encode()))
    return error.status, headers, encode(error.body())


def relative_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


async def answer(service: OpenAIService, method: str, path: str, body: bytes,
                 ) -> tuple[Head, AsyncGenerator[bytes, None] | None]:
    """The head of the answer to one request, and the stream's parts when it streams."""
    try:
        if method == "GET":
            if path == "/v1/models":
                return (200, JSON, encode({"object": "list", "data": service.cards()})), None
            if path.startswith("/v1/models/"):
                return (200, JSON, encode(service.card(path[len("/v1/models/"):]))), None
            if path in ("/health", "/-/healthz"):
                await service.engine.check_health()
                return (200, JSON, b"{}"), None
        kind = ROUTES.get(path)
        if kind is None:
            if path in ("/v1/models", "/health") or path.startswith("/v1/models/"):
                raise OpenAIError(405, f"Method {method} not allowed for {path}")
            raise OpenAIError(404, f"Not Found: {path}", code="not_found")
        if method != "POST":
            raise OpenAIError(405, f"Method {method} not allowed for {path}; use POST")
        if kind == "embeddings":
            return (200, JSON, encode(await service.embeddings(body))), None
        run = await (service.prepare_chat(body) if kind == "chat"
                     else service.prepare_completion(body))
        if run.stream_requested:
            return (200, EVENTS, None), _guarded(run.stream())
        return (200, JSON, encode(await run.complete())), None
    except OpenAIError as exc:
        return error_head(exc), None
    except Exception as exc:  # the engine's, translated at the boundary
        return error_head(engine_error(exc)), None


async def _guarded(parts: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """A stream whose failure after the head ends it with an error event, as vLLM does."""
    try:
        async with aclosing(parts) as stream:
            async for part in stream:
                yield part
    except Exception as exc:
        error = engine_error(exc)
        yield sse(error.body()) + DONE


class OpenAIApp:
    """The ASGI app of one model's OpenAI API (the LLM server's replica serves it)."""

    def __init__(self, service: OpenAIService) -> None:
        self.service = service

    def __repr__(self) -> str:
        return f"<OpenAIApp {self.service.model_id}>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan and websockets: nothing to do
        body = await read_body(receive)
        head, parts = await answer(self.service, scope["method"], relative_path(scope), body)
        await respond(head, parts, send)


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def respond(head: Head, parts: AsyncGenerator[bytes, None] | None, send: Send) -> None:
    status, headers, body = head
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if parts is None:
        await send({"type": "http.response.body", "body": body or b"", "more_body": False})
        return
    ended = False
    async with aclosing(parts) as stream:  # closed (engine request aborted) if cut short
        async for part in stream:
            ended = part.endswith(DONE)  # the last part: end the body with it
            await send({"type": "http.response.body", "body": part, "more_body": not ended})
    if not ended:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
