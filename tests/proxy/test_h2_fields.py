"""codecs/h2_fields.py: which request and trailer lists RFC 9113 8.2-8.3 calls malformed."""

from __future__ import annotations

import pytest

from surge.codecs.h2_fields import content_length, request_problem, trailers_problem

CALL = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/pkg.Svc/Say"),
        (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
        (b"te", b"trailers")]


def plus(name: bytes, value: bytes) -> list[tuple[bytes, bytes]]:
    return [*CALL, (name, value)]


def without(name: bytes) -> list[tuple[bytes, bytes]]:
    return [field for field in CALL if field[0] != name]


@pytest.mark.parametrize("headers", [
    CALL,
    without(b":authority"),
    without(b"te"),
    plus(b"x-bin", b"AAEC"),
    plus(b"content-length", b"12"),
    plus(b"x-empty", b""),
    plus(b"x-inner", b"a b\tc"),  # whitespace inside a value is fine
    plus(b"x-obs", b"\xe9t\xe9"),  # obs-text
    [(b":method", b"CONNECT"), (b":authority", b"example:443")],
])
def test_well_formed_requests(headers: list[tuple[bytes, bytes]]) -> None:
    assert request_problem(headers) is None


@pytest.mark.parametrize(("headers", "problem"), [
    (plus(b"X-Test", b"a"), "field name 'X-Test' is not lowercase"),
    (plus(b"x test", b"a"), "field name 'x test' is not lowercase"),
    (plus(b"x:test", b"a"), "field name 'x:test' is not lowercase"),
    (plus(b"", b"a"), "field name '' is not lowercase"),
    (plus(b"x-\xe9", b"a"), "field name 'x-é' is not lowercase"),
    (plus(b"connection", b"close"), "connection-specific field 'connection'"),
    (plus(b"keep-alive", b"5"), "connection-specific field 'keep-alive'"),
    (plus(b"proxy-connection", b"x"), "connection-specific field 'proxy-connection'"),
    (plus(b"transfer-encoding", b"chunked"), "connection-specific field 'transfer-encoding'"),
    (plus(b"upgrade", b"h2c"), "connection-specific field 'upgrade'"),
    ([*without(b"te"), (b"te", b"gzip")], "te 'gzip'"),
    (plus(b"x", b"a\r\nb: c"), "the value of 'x' holds NUL, CR or LF"),
    (plus(b"x", b"a\x00"), "the value of 'x' holds NUL"),
    (plus(b"x", b" a"), "starts or ends with a space"),
    (plus(b"x", b"a\t"), "starts or ends with a space"),
    (plus(b"content-length", b"1,1"), "content-length '1,1' is not a number"),
    ([(b":test", b"x"), *CALL], "pseudo-header ':test' is not a request's"),
    ([(b":status", b"200"), *CALL], "pseudo-header ':status' is not a request's"),
    ([(b":protocol", b"websocket"), *CALL], "pseudo-header ':protocol' is not a request's"),
    (plus(b":path", b"/other"), "pseudo-header ':path' after a regular field"),
    ([(b":path", b"/other"), *CALL], "pseudo-header ':path' repeated"),
    ([(b":method", b"POST"), *CALL], "pseudo-header ':method' repeated"),
    (without(b":method"), "no :method"),
    (without(b":scheme"), "no :scheme"),
    (without(b":path"), "no :path"),
    ([(k, b"" if k == b":path" else v) for k, v in CALL], "no :path, or an empty one"),
    ([(k, v + b"\r" if k == b":path" else v) for k, v in CALL], "the value of ':path' holds"),
    ([(b":method", b"CONNECT"), (b":authority", b"a:1"), (b":path", b"/")],
     "a CONNECT needs :authority"),
    ([(b":method", b"CONNECT")], "a CONNECT needs :authority"),
])
def test_malformed_requests(headers: list[tuple[bytes, bytes]], problem: str) -> None:
    found = request_problem(headers)
    assert found is not None and problem in found, found


@pytest.mark.parametrize(("headers", "problem"), [
    ([(b"x-trailer", b"1"), (b"x-bin", b"AA")], None),
    ([], None),
    ([(b":path", b"/x")], "pseudo-header ':path' in trailers"),
    ([(b"connection", b"close")], "connection-specific field 'connection'"),
    ([(b"X", b"1")], "field name 'X' is not lowercase"),
    ([(b"x", b"1\n")], "the value of 'x' holds NUL, CR or LF"),
])
def test_trailers(headers: list[tuple[bytes, bytes]], problem: str | None) -> None:
    found = trailers_problem(headers)
    assert found == problem if problem is None else (found or "").startswith(problem)


def test_content_length() -> None:
    assert content_length(plus(b"content-length", b"17")) == 17
    assert content_length(CALL) is None
    assert content_length(plus(b"content-length", b"x")) is None
