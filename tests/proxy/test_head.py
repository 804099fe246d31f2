"""proxy/head.py: one RequestHead per request, each header read once."""

from __future__ import annotations

import httptools
import pytest

from surge.proxy.head import (
    HeadFields,
    RequestHead,
    new_request_id,
    parse_timeout,
    read_head,
    split_target,
    usable_request_id,
)
from tests.proxy.wire import TOKEN, make_site


@pytest.mark.parametrize(("value", "expected"), [
    (None, 7.0),  # no header: the configured timeout
    (b"2.5", 2.5),
    (b" 3 ", 3.0),
    (b"0", 0.0),
    (b"-4", 0.0),  # already late: times out at once
    (b"inf", None),  # no deadline at all
    (b"1e400", None),
    (b"nan", 7.0),  # unreadable: the configured timeout
    (b"soon", 7.0),
    (b"", 7.0),
])
def test_parse_timeout(value: bytes | None, expected: float | None) -> None:
    assert parse_timeout(value, 7.0) == expected


@pytest.mark.parametrize(("value", "usable"), [
    (b"abc-123", True),
    (b"x" * 200, True),
    (b"x" * 201, False),
    (b"", False),
    (b"has space", False),
    (b"\xff\xfe", False),  # not ASCII: once left a request unanswered
    (b"tab\there", False),
])
def test_usable_request_id(value: bytes, usable: bool) -> None:
    assert usable_request_id(value) is usable


def test_new_request_ids_are_usable_and_distinct() -> None:
    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100 and all(usable_request_id(i) for i in ids)


def test_fields_note_what_matters_once_each() -> None:
    fields = HeadFields()
    for name, value in [(b"x-request-id", b"\xff"), (b"x-request-id", b"first"),
                        (b"x-request-id", b"second"), (b"x-request-timeout-seconds", b"1"),
                        (b"x-request-timeout-seconds", b"2"),
                        (b"x-request-disconnect-disabled", b"?1"),
                        (b"content-length", b"12"), (b"expect", b"100-Continue"),
                        (b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]:
        fields.note(name, value)
    assert fields.request_id == b"first"  # the first usable one
    assert fields.timeout == b"1"  # the first
    assert fields.detached and fields.expect_continue and fields.declared == 12
    assert fields.authorization == [b"Bearer a", b"Bearer b"]  # all: two are refused
    fields.note(b"x-request-disconnect-disabled", b"no")  # the last one says
    assert not fields.detached
    fields.reset()
    assert (fields.request_id, fields.timeout, fields.declared, fields.authorization,
            fields.noted) == (None, None, -1, None, False)
    fields.note(b"transfer-encoding", b"chunked")
    assert fields.declared == 1 and fields.noted


@pytest.mark.parametrize(("url", "expected"), [
    (b"/a/b?x=1&y=2", ("/a/b", b"x=1&y=2", b"/a/b")),
    (b"/a%20b/c%2Fd", ("/a b/c/d", b"", b"/a%20b/c%2Fd")),  # decoded; the raw bytes kept
    (b"/caf%C3%A9", ("/café", b"", b"/caf%C3%A9")),
    (b"http://example.com/x?q", ("/x", b"q", b"/x")),  # absolute form
    (b"http://example.com", ("/", b"", b"/")),
    (b"*", ("*", b"", b"*")),
])
def test_split_target(url: bytes, expected: tuple[str, bytes, bytes]) -> None:
    assert split_target(url) == expected


def test_split_target_raises_for_what_is_not_a_url() -> None:
    with pytest.raises(httptools.HttpParserInvalidURLError):
        split_target(b"http://h:99999/x")


def head_of(url: bytes, *headers: tuple[bytes, bytes], method: bytes = b"GET",
            locked: tuple[str, ...] = ()) -> RequestHead:
    fields = HeadFields()
    for name, value in headers:
        fields.note(name, value)
    site = make_site("/app", "/locked", request_timeout_s=9.0, locked=locked)
    return read_head(method, url, "1.1", list(headers), fields, site)


def test_a_routed_head_says_where_it_goes_and_needs_no_answer() -> None:
    head = head_of(b"/app/x?q=1", (b"x-request-id", b"mine"),
                   (b"x-request-timeout-seconds", b"2"))
    assert (head.method, head.path, head.query, head.raw_path) == (
        "GET", "/app/x", b"q=1", b"/app/x")
    assert head.route is not None and head.route.prefix == "/app" and head.answer is None
    assert head.labels == ("app/app", "Ingress", "/app")
    assert (head.request_id, head.timeout) == (b"mine", 2.0)
    assert head_of(b"/app").timeout == 9.0


@pytest.mark.parametrize(("url", "status", "reason", "labels"), [
    (b"/nowhere", 404, "no_route", ("", "", "")),
    (b"/-/healthz", 200, "", ("", "", "/-/healthz")),
    (b"/-/routes", 200, "", ("", "", "/-/routes")),
    (b"/-/nope", 404, "", ("", "", "/-/other")),  # no metric series per unknown path
    (b"http://h:99999/app", 400, "", ("", "", "")),
])
def test_heads_the_proxy_answers_itself(url: bytes, status: int, reason: str,
                                        labels: tuple[str, str, str]) -> None:
    head = head_of(url)
    assert head.answer is not None
    assert (head.answer.status, head.answer.reason) == (status, reason)
    assert head.labels == labels


@pytest.mark.parametrize(("authorization", "status"), [
    ((), 401),
    (((b"authorization", b"Bearer " + TOKEN.encode()),), None),
    (((b"authorization", b"bearer " + TOKEN.encode()),), None),
    (((b"authorization", b"Bearer wrong-token-wrong-token"),), 401),
    (((b"authorization", b"Basic abc"),), 401),
    (((b"authorization", b"Bearer a b"),), 400),
    (((b"authorization", b"Bearer " + TOKEN.encode()),) * 2, 400),
])
def test_the_bearer_check_is_decided_with_the_head(
        authorization: tuple[tuple[bytes, bytes], ...], status: int | None) -> None:
    head = head_of(b"/locked/x", *authorization, locked=("/locked",))
    if status is None:
        assert head.answer is None
    else:
        assert head.answer is not None and head.answer.status == status
        assert head.answer.extra[0][0] == b"www-authenticate"
        assert not head.answer.invites_body
    assert head.labels == ("app/locked", "Ingress", "/locked")
