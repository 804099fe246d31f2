"""Encoding HTTP/1.1 responses: status lines and headers as bytes, built once where we can."""

from __future__ import annotations

import http

__all__ = ["chunk", "head", "simple"]

_STATUS_LINES = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in http.HTTPStatus
}
_STATUS_LINES[499] = b"HTTP/1.1 499 Client Closed Request\r\n"


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} Unknown\r\n".encode()


def head(status: int, headers: list[tuple[bytes, bytes]], request_id: bytes,
         body_length: int | None, keep_alive: bool) -> bytes:
    """Status line and headers; `body_length=None` means a chunked (streamed) body."""
    parts = [status_line(status)]
    has_length = False
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length":
            if body_length is None:
                continue  # streamed: we re-frame it as chunked
            has_length = True
        elif lower in (b"connection", b"transfer-encoding", b"x-request-id"):
            continue
        parts.append(name + b": " + value + b"\r\n")
    if body_length is None:
        parts.append(b"transfer-encoding: chunked\r\n")
    elif not has_length:
        parts.append(b"content-length: " + str(body_length).encode() + b"\r\n")
    parts.append(b"x-request-id: " + request_id + b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def simple(status: int, body: bytes, request_id: bytes, keep_alive: bool,
           content_type: bytes = b"text/plain; charset=utf-8",
           extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    headers = [(b"content-type", content_type), *(extra or [])]
    return head(status, headers, request_id, len(body), keep_alive) + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"
