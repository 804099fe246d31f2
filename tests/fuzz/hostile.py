"""Hypothesis strategies for hostile HTTP/1.1: each draws the bytes a client sends.

Every strategy yields `bytes`; a few are built around a valid request so that the
proxy gets past its first checks before meeting the damage.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.fuzz.harness import LIMITS

HEADER_LIMIT = int(LIMITS["max_header_bytes"])
BODY_LIMIT = int(LIMITS["max_body_bytes"])
PATHS = ("/echo", "/json/items", "/locked", "/", "/-/healthz", "/-/routes", "/nowhere")
METHODS = ("GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH")
CRLF = b"\r\n"


def request(method: str = "GET", path: str = "/echo",
            headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"",
            version: bytes = b"HTTP/1.1", length: bool = True) -> bytes:
    lines = [f"{method} {path} ".encode() + version, b"Host: 127.0.0.1"]
    lines += [name + b": " + value for name, value in headers or []]
    if body and length:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return CRLF.join(lines) + CRLF + CRLF + body


token_chars = st.sampled_from(list(b"!#$%&'*+-.^_`|~0123456789ABCXYZabcxyz"))
tokens = st.lists(token_chars, min_size=1, max_size=12).map(bytes)
any_byte_text = st.binary(min_size=0, max_size=64)
high_bytes = st.binary(min_size=1, max_size=32).map(lambda b: bytes(x | 0x80 for x in b))

methods = st.one_of(st.sampled_from([m.encode() for m in METHODS]), tokens,
                    st.binary(min_size=0, max_size=12))
targets = st.one_of(
    st.sampled_from([p.encode() for p in PATHS]),
    st.builds(lambda p, junk: p.encode() + junk, st.sampled_from(PATHS), any_byte_text),
    st.builds(lambda p, b: p.encode() + b"/" + b, st.sampled_from(PATHS), high_bytes),
    st.builds(lambda b: b"/echo/" + b"".join(b"%%%02X" % x for x in b), high_bytes),
    st.just(b"*"), st.just(b"http://example.com/echo"), st.just(b"//"),
    st.binary(min_size=0, max_size=80),
)
versions = st.one_of(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9",
                                      b"HTTP/1.1 x", b"http/1.1", b"HTTP/11", b""]),
                     st.binary(max_size=12))
line_ends = st.sampled_from([b"\r\n", b"\n", b"\r", b"", b"\r\n\r\n", b"\n\n"])


@st.composite
def malformed_request_lines(draw: st.DrawFn) -> bytes:
    separator = draw(st.sampled_from([b" ", b"  ", b"\t", b"", b" \x00 "]))
    line = draw(methods) + separator + draw(targets) + separator + draw(versions)
    return line + draw(line_ends) + draw(st.sampled_from([b"Host: x\r\n\r\n", b"", b"\r\n"]))


random_bytes = st.binary(min_size=1, max_size=4096)


@st.composite
def huge_headers(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["one-long-value", "many", "long-name", "long-target"]))
    size = draw(st.integers(HEADER_LIMIT // 2, HEADER_LIMIT * 4))
    if kind == "one-long-value":
        return request(headers=[(b"x-big", b"v" * size)])
    if kind == "many":
        return request(headers=[(b"x-h%d" % i, b"v" * 40) for i in range(size // 48)])
    if kind == "long-name":
        return request(headers=[(b"x" * size, b"v")])
    return request(path="/echo?" + "q" * size)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + CRLF


@st.composite
def bad_chunked(draw: st.DrawFn) -> bytes:
    pieces = draw(st.lists(st.binary(min_size=1, max_size=300), min_size=0, max_size=5))
    body = b"".join(chunk(p) for p in pieces)
    damage = draw(st.sampled_from([
        "bad-size", "negative", "huge-size", "no-crlf", "truncated", "no-terminator",
        "extension", "garbage-trailer", "size-too-small", "over-limit", "whitespace-size"]))
    if damage == "bad-size":
        body += draw(st.sampled_from([b"zz", b"0x10", b"1g", b"", b"\xff"])) + CRLF + b"a" + CRLF
    elif damage == "negative":
        body += b"-5\r\nhello\r\n"
    elif damage == "huge-size":
        body += b"ffffffffffffffffff\r\n" + b"a" * 10
    elif damage == "no-crlf":
        body += b"5\r\nhelloXX5\r\nhello\r\n"
    elif damage == "truncated":
        body += b"400\r\n" + b"a" * draw(st.integers(0, 100))
    elif damage == "extension":
        body += b"5;" + draw(st.binary(max_size=40)) + CRLF + b"hello" + CRLF
    elif damage == "garbage-trailer":
        body += b"0\r\n" + draw(st.binary(max_size=60)) + CRLF + CRLF
        return request("POST", headers=[(b"Transfer-Encoding", b"chunked")], body=body,
                       length=False)
    elif damage == "size-too-small":
        body += b"2\r\nhello\r\n"
    elif damage == "over-limit":
        body += b"".join(chunk(b"z" * 8192) for _ in range(BODY_LIMIT // 8192 + 2))
    elif damage == "whitespace-size":
        body += b" 5 \r\nhello\r\n"
    terminator = b"" if damage in ("no-terminator", "truncated", "huge-size") else b"0\r\n\r\n"
    encoding = draw(st.sampled_from([b"chunked", b"Chunked", b"gzip, chunked", b"chunked, gzip",
                                     b"identity", b" chunked"]))
    return request("POST", headers=[(b"Transfer-Encoding", encoding)], body=body + terminator,
                   length=False)


@st.composite
def content_length_combos(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=200))
    values = draw(st.lists(st.one_of(
        st.sampled_from([b"abc", b"-1", b"1e3", b" 5", b"+5", b"0x10", b"",
                         b"99999999999999999999999", b"5, 5", b"5,6", b"\xff"]),
        st.integers(0, 400).map(lambda n: str(n).encode())), min_size=1, max_size=3))
    headers = [(b"Content-Length", v) for v in values]
    if draw(st.booleans()):
        headers.append((b"Transfer-Encoding", b"chunked"))
    return request("POST", headers=headers, body=body, length=False)


@st.composite
def non_utf8(draw: st.DrawFn) -> bytes:
    where = draw(st.sampled_from(["path", "header", "request-id", "body", "query",
                                  "timeout-header", "authorization"]))
    junk = draw(high_bytes)
    if where == "path":
        return request(path="/echo/") .replace(b"/echo/ ", b"/echo/" + junk + b" ", 1)
    if where == "query":
        return request(path="/echo?").replace(b"/echo? ", b"/echo?q=" + junk + b" ", 1)
    if where == "header":
        return request(headers=[(b"x-junk", junk), (b"accept", junk)])
    if where == "request-id":
        return request(headers=[(b"x-request-id", junk)])
    if where == "timeout-header":
        return request(headers=[(b"x-request-timeout-seconds", junk)])
    if where == "authorization":
        return request(path="/locked", headers=[(b"authorization", b"Bearer " + junk)])
    return request("POST", body=junk)


@st.composite
def oversized_bodies(draw: st.DrawFn) -> bytes:
    size = draw(st.integers(BODY_LIMIT + 1, BODY_LIMIT * 3))
    send = draw(st.sampled_from(["all", "headers-only", "some"]))
    head = request("POST", path=draw(st.sampled_from(["/echo", "/json/items", "/locked"])),
                   headers=[(b"Content-Length", str(size).encode())], length=False)
    if send == "all":
        return head + b"b" * size
    if send == "some":
        return head + b"b" * draw(st.integers(0, BODY_LIMIT))
    return head


@st.composite
def pipelined_garbage(draw: st.DrawFn) -> bytes:
    valid = request(headers=[(b"x-n", b"1")])
    tail = draw(st.one_of(random_bytes, malformed_request_lines(), bad_chunked()))
    return valid + tail


json_bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100).map(str.encode),
    st.sampled_from([b"{", b"[]", b"null", b'{"name": 1}', b'{"name": "x", "quantity": "y"}',
                     b'{"name": "x", "quantity": 1e400}', b"NaN",
                     b'{"name": "\\ud800", "quantity": 1}',
                     b'{"name": "x", "quantity": 1}' * 3, b"[" * 5000 + b"]" * 5000,
                     b'{"a":' * 3000 + b"1" + b"}" * 3000]))


@st.composite
def invalid_json(draw: st.DrawFn) -> bytes:
    content_type = draw(st.sampled_from([b"application/json", b"text/plain", b"",
                                         b"application/json; charset=latin-1"]))
    headers = [(b"Content-Type", content_type)] if content_type else []
    return request("POST", path="/json/items", headers=headers, body=draw(json_bodies))


@st.composite
def bad_authorization(draw: st.DrawFn) -> bytes:
    values = draw(st.lists(st.one_of(
        st.binary(max_size=80),
        st.builds(lambda s, t: s + b" " + t,
                  st.sampled_from([b"Bearer", b"bearer", b"Basic", b"BEARER", b"Token"]),
                  st.binary(max_size=64))), min_size=0, max_size=3))
    return request(path="/locked", headers=[(b"Authorization", v) for v in values])


ATTACKS = {
    "malformed request line": malformed_request_lines(),
    "random bytes": random_bytes,
    "huge headers": huge_headers(),
    "bad chunked encoding": bad_chunked(),
    "Content-Length combinations": content_length_combos(),
    "non-UTF-8 path/headers/body": non_utf8(),
    "oversized body": oversized_bodies(),
    "pipelined garbage after a valid request": pipelined_garbage(),
    "invalid JSON to a JSON app": invalid_json(),
    "bad Authorization": bad_authorization(),
}
