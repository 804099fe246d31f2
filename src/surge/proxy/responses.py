"""Encoding HTTP/1.1 responses: status lines and headers as bytes, built once where we can."""

from __future__ import annotations

import http
import json

__all__ = ["CONTINUE", "LAST_CHUNK", "chunk", "forbids_body", "head", "openai_error", "simple"]

_STATUS_LINES = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in http.HTTPStatus
}
_STATUS_LINES[499] = b"HTTP/1.1 499 Client Closed Request\r\n"

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"  # ends a chunked body


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} Unknown\r\n".encode()


def forbids_body(status: int) -> bool:
    """1xx, 204 and 304 responses never have a body (RFC 9110 6.4.1)."""
    return status < 200 or status == 204 or status == 304


# Framing is ours to write: an app's Content-Length is kept only for a body sent whole.
_FRAMING = frozenset({b"content-length", b"connection", b"transfer-encoding", b"x-request-id"})


def head(status: int, headers: list[tuple[bytes, bytes]], request_id: bytes,
         body_length: int | None, keep_alive: bool, chunked: bool = True,
         http_10: bool = False) -> bytes:
    """Status line and headers.

    `body_length=None` means a streamed body: framed as chunked, or, for an HTTP/1.0
    client (`chunked=False`), delimited by closing the connection. 1xx, 204 and 304
    responses get no framing headers of ours (and 1xx/204 none of the app's either).
    """
    line = _STATUS_LINES.get(status)
    parts = [line if line is not None else status_line(status)]
    no_body = status < 200 or status == 204 or status == 304
    has_length = False
    for name, value in headers:
        lower = name.lower()
        if lower in _FRAMING:
            if lower != b"content-length" or body_length is None or (no_body and status != 304):
                continue  # streamed: we re-frame it; 1xx/204 must not carry one
            has_length = True
        parts += (name, b": ", value, b"\r\n")
    if not no_body:
        if body_length is None:
            if chunked:
                parts.append(b"transfer-encoding: chunked\r\n")
        elif not has_length:
            parts += (b"content-length: ", b"%d" % body_length, b"\r\n")
    parts += (b"x-request-id: ", request_id,
              b"\r\nconnection: close\r\n\r\n" if not keep_alive
              else b"\r\nconnection: keep-alive\r\n\r\n" if http_10 else b"\r\n\r\n")
    return b"".join(parts)


def simple(status: int, body: bytes, request_id: bytes, keep_alive: bool,
           content_type: bytes = b"text/plain; charset=utf-8",
           extra: tuple[tuple[bytes, bytes], ...] = (), *, http_10: bool = False,
           head_only: bool = False) -> bytes:
    headers = [(b"content-type", content_type), *extra]
    data = head(status, headers, request_id, len(body), keep_alive, http_10=http_10)
    return data if head_only or forbids_body(status) else data + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


# OpenAI's error `type` and `code` for the statuses the proxy answers itself.
_OPENAI_ERRORS = {408: ("timeout_error", "request_timeout"),
                  429: ("rate_limit_error", "rate_limit_exceeded"),
                  499: ("invalid_request_error", "request_cancelled"),
                  503: ("server_error", "service_unavailable")}


def openai_error(status: int, message: str) -> bytes:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    kind, code = _OPENAI_ERRORS.get(status, ("server_error", "internal_error"))
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()
