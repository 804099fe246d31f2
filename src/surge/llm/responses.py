"""OpenAI response objects and Server-Sent Events, encoded with msgspec.

Streams are as OpenAI sends them: `data: {json}\\n\\n` per chunk, a first chat chunk
with the assistant role, `finish_reason` on the last content chunk, with
`stream_options.include_usage` a `usage: null` on every chunk and a final chunk with
empty `choices` and the usage, then `data: [DONE]`.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

__all__ = ["DONE", "Usage", "chat_chunk", "chat_response", "completion_chunk",
           "completion_response", "embedding_response", "encode", "model_card", "sse",
           "usage_chunk"]

DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()
encode = _encoder.encode


class Usage:
    __slots__ = ("cached", "completion", "prompt")

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0
        self.cached = 0

    def to_dict(self) -> dict[str, Any]:
        details = {"cached_tokens": self.cached} if self.cached else None
        return {"prompt_tokens": self.prompt, "total_tokens": self.prompt + self.completion,
                "completion_tokens": self.completion, "prompt_tokens_details": details}


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def _base(kind: str, request_id: str, created: int, model: str) -> dict[str, Any]:
    return {"id": request_id, "object": kind, "created": created, "model": model}


def chat_chunk(request_id: str, created: int, model: str, index: int, delta: dict[str, Any],
               finish_reason: str | None, with_usage: bool) -> dict[str, Any]:
    chunk = _base("chat.completion.chunk", request_id, created, model)
    chunk["choices"] = [{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}]
    if with_usage:
        chunk["usage"] = None
    return chunk


def completion_chunk(request_id: str, created: int, model: str, index: int, text: str,
                     finish_reason: str | None, with_usage: bool) -> dict[str, Any]:
    chunk = _base("text_completion", request_id, created, model)
    chunk["choices"] = [{"index": index, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}]
    if with_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(kind: str, request_id: str, created: int, model: str,
                usage: Usage) -> dict[str, Any]:
    chunk = _base(kind, request_id, created, model)
    chunk["choices"] = []
    chunk["usage"] = usage.to_dict()
    return chunk


def chat_response(request_id: str, created: int, model: str, texts: list[str],
                  reasons: list[str | None], usage: Usage) -> dict[str, Any]:
    response = _base("chat.completion", request_id, created, model)
    response["choices"] = [
        {"index": i, "message": {"role": "assistant", "content": text, "tool_calls": []},
         "logprobs": None, "finish_reason": reason}
        for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))]
    response["usage"] = usage.to_dict()
    return response


def completion_response(request_id: str, created: int, model: str, texts: list[str],
                        reasons: list[str | None], usage: Usage) -> dict[str, Any]:
    response = _base("text_completion", request_id, created, model)
    response["choices"] = [{"index": i, "text": text, "logprobs": None, "finish_reason": r}
                           for i, (text, r) in enumerate(zip(texts, reasons, strict=True))]
    response["usage"] = usage.to_dict()
    return response


def embedding_response(model: str, vectors: list[Any], prompt_tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": v}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def model_card(model_id: str, created: int | None = None, *, root: str | None = None,
               max_model_len: int | None = None, parent: str | None = None) -> dict[str, Any]:
    card: dict[str, Any] = {"id": model_id, "object": "model",
                            "created": created if created is not None else int(time.time()),
                            "owned_by": "surge", "root": root or model_id, "parent": parent,
                            "permission": []}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return card
