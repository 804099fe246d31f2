"""The conformance table (tests/proxy/h2_conformance.py: h2spec's cases for RFC 9113 and
RFC 7541, and the issue's extra rules) against a real surge gRPC port, one connection a
case; and the port's bound on reflection requests, over the same socket."""

from __future__ import annotations

from collections.abc import Iterator

import hpack
import pytest

from surge.proxy.grpc_core import REFLECTION_QUEUE
from surge.proxy.grpc_local import REFLECTION
from tests.proxy.h2_client import CALL, END_STREAM, HEADERS, Client, serving
from tests.proxy.h2_conformance import CASES, Case, run_case


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving() as port:
        yield port


@pytest.mark.parametrize("item", CASES, ids=[item.id for item in CASES])
def test_conformance(port: int, item: Case) -> None:
    assert run_case(item, port) is None


def test_the_table_holds_every_h2spec_case_once() -> None:
    ids = [item.id for item in CASES]
    assert len(ids) == len(set(ids))
    groups = {group: sum(item.group == group for item in CASES)
              for group in ("generic", "http2", "hpack")}
    assert groups == {"generic": 44, "http2": 95, "hpack": 8}  # h2spec 2.6's 147


def test_reflection_requests_past_the_bound_end_the_call_resource_exhausted(port: int) -> None:
    asks = b"\x00" + len(b"\x3a\x01*").to_bytes(4, "big") + b"\x3a\x01*"  # list_services
    with Client(port) as client:
        client.handshake()
        headers = [(k, REFLECTION if k == ":path" else v) for k, v in CALL]
        client.headers(1, headers)
        client.data(1, asks * (REFLECTION_QUEUE + 1), end_stream=False)
        decoder = hpack.Decoder()
        while True:
            answer = client.wait_for(HEADERS)
            fields = dict(decoder.decode(answer.payload))
            if answer.flags & END_STREAM:
                break
    assert fields["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert fields["grpc-message"] == (f"more than {REFLECTION_QUEUE} reflection requests wait "
                                      "for their answers")
