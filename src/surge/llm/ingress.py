"""`OpenAiIngress`: one OpenAI endpoint in front of several models' LLMServers.

With more than one model in an app, a request's `model` field picks the LLMServer
deployment. The proxy does that itself for chat, completions and embeddings whose body
it holds (`__surge_model_routes__` names the map it gets; policy/openai_route.py), so
those go proxy → LLMServer replica → engine, one hop. What reaches this replica: `GET
/v1/models` (every model), `/v1/models/{id}`, unknown or omitted models (OpenAI's 404 or
400), and bodies the proxy streamed. For those it decodes the `model` field alone
(msgspec; `base:adapter` picks the base's, routed by adapter as a multiplexed model:
policy/llm_models.py) and streams that server's answer back: two
hops, as Ray's default. The body crosses the second hop as bytes and the answer comes
back as the bytes of its SSE parts; nothing is re-parsed on the way. (One model needs no
ingress: its LLMServer is the app's ingress.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from surge.llm.asgi import (
    JSON,
    Head,
    Receive,
    Scope,
    Send,
    error_head,
    read_body,
    relative_path,
)
from surge.llm.protocol import OpenAIError, model_of
from surge.llm.responses import encode
from surge.llm.service import unknown_model
from surge.policy.llm_models import resolve_model
from surge.replica.ingress import ingress

__all__ = ["OpenAiIngress"]


@ingress()
class OpenAiIngress:
    # The proxy routes chat, completions and embeddings by their `model` field straight
    # to `llm_deployments[model]` (one hop); this replica answers what it does not read.
    __surge_model_routes__ = "llm_deployments"

    def __init__(self, llm_deployments: Mapping[str, Any], model_cards: Any = None,
                 lora_paths: Any = None, **_extra: Any) -> None:
        self.handles = dict(llm_deployments)  # model id -> LLMServer handle
        self.forwarded = 0  # requests this replica passed on to an LLMServer

    def __repr__(self) -> str:
        return f"<OpenAiIngress models={sorted(self.handles)} forwarded={self.forwarded}>"

    async def ingress_stats(self) -> dict[str, int]:
        """What this replica did: with the proxy routing by model, `forwarded` counts only
        what the proxy left to it (streamed or unreadable bodies, `/v1/models/{id}`)."""
        return {"forwarded": self.forwarded}

    async def __serve_build_asgi_app__(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        return self.asgi  # not __call__: Ray's ingress() refuses classes that define one

    def handle_for(self, model: str | None) -> Any:
        """The handle of `model`'s server; for an adapter (`base:adapter`) with it as the
        multiplexed model id, so it goes to a replica holding the adapter (as Ray's)."""
        handle, model_id = resolve_model(model, self.handles)
        if handle is None:
            if model is None:
                raise OpenAIError(400, "`model` is required: this endpoint serves "
                                       f"{', '.join(sorted(self.handles))}", param="model")
            raise unknown_model(model)
        return handle.options(multiplexed_model_id=model_id) if model_id else handle

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        method, path = scope["method"], relative_path(scope)
        try:
            if method == "GET" and path == "/v1/models":
                await _send(send, (200, JSON, encode(await self._models())))
                return
            model = path[len("/v1/models/"):] if path.startswith("/v1/models/") \
                else model_of(body)
            handle = self.handle_for(model)
        except OpenAIError as exc:
            await _send(send, error_head(exc))
            return
        self.forwarded += 1
        stream = handle.options(stream=True).openai_http.remote(method, path, body)
        try:
            head = await stream.__anext__()
            await send({"type": "http.response.start", "status": head[0], "headers": head[1]})
            if head[2] is not None:
                await send({"type": "http.response.body", "body": head[2], "more_body": False})
                return
            async for part in stream:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            stream.cancel()  # the client went away: the LLMServer aborts its engine request
            raise

    async def _models(self) -> dict[str, Any]:
        cards: list[Any] = []
        for handle in self.handles.values():
            stream = handle.options(stream=True).openai_http.remote("GET", "/v1/models", b"")
            async for item in stream:
                if isinstance(item, tuple) and item[2] is not None:
                    import msgspec

                    cards += msgspec.json.decode(item[2])["data"]
        return {"object": "list", "data": cards}


async def _send(send: Send, head: Head) -> None:
    await send({"type": "http.response.start", "status": head[0], "headers": head[1]})
    await send({"type": "http.response.body", "body": head[2] or b"", "more_body": False})
