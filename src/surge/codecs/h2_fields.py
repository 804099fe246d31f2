"""Is a decoded HTTP/2 header list a well-formed request (RFC 9113 8.2-8.3)? Pure.

`request_problem` reads a request's header list and `trailers_problem` a client's
trailing one; each returns why the list is malformed, or None. A malformed request is
a stream error of type PROTOCOL_ERROR (8.1.1): the connection resets the stream and the
call is never served. The rules:

* names: lowercase, no control octets, space, DEL or non-ASCII, no colon but a
  pseudo-header's leading one; values: no NUL, CR or LF, no leading or trailing space or
  tab (8.2.1);
* no connection-specific field (connection, keep-alive, proxy-connection,
  transfer-encoding, upgrade), and `te` only as "trailers" (8.2.2);
* the request pseudo-headers only (:method :scheme :authority :path), each at most
  once, all before the regular fields; :method, :scheme and a non-empty :path present
  (a CONNECT has :authority and neither :scheme nor :path) (8.3.1); a trailer list
  carries none (8.1);
* `content-length`, when sent, is one decimal number: `content_length` reads it for the
  connection to compare with the DATA that follows (8.1.1).

No I/O, no connection state: the caller (codecs/h2.py) decides what a problem costs.
"""

from __future__ import annotations

import re

from surge.codecs.hpack import Header

__all__ = ["content_length", "request_problem", "trailers_problem"]

_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":authority", b":path"))
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection",
                                  b"transfer-encoding", b"upgrade"))
# A field name: visible ASCII but uppercase letters and the colon (8.2.1).
_NAME = re.compile(rb"[!-9;-@\[-~]+")
_BAD_VALUE = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]$")
_DIGITS = re.compile(rb"[0-9]+")


def request_problem(headers: list[Header]) -> str | None:
    """Why `headers` is not a well-formed request, or None."""
    seen: dict[bytes, bytes] = {}
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return f"pseudo-header {_show(name)} after a regular field"
            if name not in _REQUEST_PSEUDO:
                return f"pseudo-header {_show(name)} is not a request's"
            if name in seen:
                return f"pseudo-header {_show(name)} repeated"
            seen[name] = value
            problem = _value_problem(name, value)
        else:
            regular = True
            problem = _field_problem(name, value)
        if problem is not None:
            return problem
    return _pseudo_problem(seen)


def trailers_problem(headers: list[Header]) -> str | None:
    """Why `headers` is not a well-formed trailer list, or None."""
    for name, value in headers:
        if name[:1] == b":":
            return f"pseudo-header {_show(name)} in trailers"
        problem = _field_problem(name, value)
        if problem is not None:
            return problem
    return None


def content_length(headers: list[Header]) -> int | None:
    """The request's declared content-length (None: none, or not one decimal number; a
    malformed one is refused by `request_problem` before this is asked)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if _DIGITS.fullmatch(value) else None
    return None


def _field_problem(name: bytes, value: bytes) -> str | None:
    if not _NAME.fullmatch(name):
        return f"field name {_show(name)} is not lowercase visible ASCII without a colon"
    if name in _CONNECTION_SPECIFIC:
        return f"connection-specific field {_show(name)}"
    if name == b"te" and value != b"trailers":
        return f"te {_show(value)} (only 'trailers' is allowed)"
    if name == b"content-length" and not _DIGITS.fullmatch(value):
        return f"content-length {_show(value)} is not a number"
    return _value_problem(name, value)


def _value_problem(name: bytes, value: bytes) -> str | None:
    if _BAD_VALUE.search(value):
        return f"the value of {_show(name)} holds NUL, CR or LF, or starts or ends with a space"
    return None


def _pseudo_problem(seen: dict[bytes, bytes]) -> str | None:
    method = seen.get(b":method")
    if method is None:
        return "no :method"
    if method == b"CONNECT":
        if b":authority" not in seen or b":scheme" in seen or b":path" in seen:
            return "a CONNECT needs :authority and neither :scheme nor :path"
        return None
    if b":scheme" not in seen:
        return "no :scheme"
    if not seen.get(b":path"):
        return "no :path, or an empty one"
    return None


def _show(raw: bytes) -> str:
    return repr(raw.decode("latin-1")[:64])
