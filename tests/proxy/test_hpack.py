"""HPACK decoding checked against an independent encoder (python-hyper's hpack): every
representation, Huffman or not, the dynamic table and its size updates, and the
blocks a decoder must refuse."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.codecs import huffman
from surge.codecs.hpack import STATIC, Decoder, HpackError, integer, literal

names = st.sampled_from([b":path", b":method", b"content-type", b"grpc-timeout", b"x-a",
                         b"x-trace-bin", b"user-agent", b"application"])
values = st.binary(max_size=80)
header_lists = st.lists(st.tuples(names, values), max_size=12)
LIMIT = 1 << 20


@settings(max_examples=200, deadline=None)
@given(st.lists(header_lists, min_size=1, max_size=6), st.booleans())
def test_blocks_of_an_independent_encoder_decode_to_its_headers(blocks: list[list[tuple[
        bytes, bytes]]], use_huffman: bool) -> None:
    encoder, decoder = hpack.Encoder(), Decoder()
    for headers in blocks:  # one connection: the dynamic table carries over
        decoded, size = decoder.decode(encoder.encode(headers, huffman=use_huffman), LIMIT)
        assert decoded == headers
        assert size == sum(len(n) + len(v) + 32 for n, v in headers)


def test_a_smaller_table_evicts_as_the_encoder_does() -> None:
    encoder, decoder = hpack.Encoder(), Decoder()
    encoder.header_table_size = 100  # the block starts with a table size update
    for round_ in range(20):
        headers = [(b"x-long-name-%d" % round_, b"v" * 40), (b":path", b"/a/b")]
        assert decoder.decode(encoder.encode(headers), LIMIT)[0] == headers


def test_never_indexed_and_static_entries() -> None:
    encoder = hpack.Encoder()
    block = encoder.encode([hpack.NeverIndexedHeaderTuple(b"authorization", b"Bearer x")])
    assert Decoder().decode(block, LIMIT)[0] == [(b"authorization", b"Bearer x")]
    assert Decoder().decode(b"\x83\x86", LIMIT)[0] == [STATIC[2], STATIC[5]]  # POST, http


@pytest.mark.parametrize(("block", "why"), [
    (b"\xbf\x40", "index"),  # index 62 + 64: nothing in the table
    (b"\x80", "index"),  # index 0
    (b"\x40\x05ab", "past its block"),  # a name of 5 octets, 2 there
    (b"\x40", "ends inside"),
    (b"\x3f\xe2\x1f", "table size update"),  # to 4,097 > the advertised 4,096
    (b"\xff\xff\xff\xff\xff\xff", "too large"),
    (b"\x00\x81\x00\x01a", "padding"),  # a Huffman name whose last bits are 0s
    (b"\x82\x20", "after the block's first field"),  # a table size update mid-block
])
def test_bad_blocks_are_refused(block: bytes, why: str) -> None:
    with pytest.raises(HpackError, match=why):
        Decoder().decode(block, LIMIT)


def test_huffman_round_trips_every_octet_and_refuses_eos() -> None:
    encoder = hpack.huffman.HuffmanEncoder(hpack.huffman_constants.REQUEST_CODES,
                                           hpack.huffman_constants.REQUEST_CODES_LENGTH)
    every = bytes(range(256)) * 2
    assert huffman.decode(encoder.encode(every)) == every
    assert huffman.decode(b"") == b""
    with pytest.raises(huffman.HuffmanError, match="EOS"):
        huffman.decode(b"\xff\xff\xff\xff")  # 30 1s: EOS


@given(st.integers(0, 2**28), st.sampled_from([4, 5, 6, 7]))
def test_integers_and_literals_read_by_an_independent_decoder(value: int, prefix: int) -> None:
    from hpack.hpack import decode_integer

    assert decode_integer(integer(value, prefix), prefix) == (value, len(integer(value,
                                                                                 prefix)))


def test_literals_are_never_indexed_by_the_peer() -> None:
    decoder = hpack.Decoder()
    block = literal(b"grpc-status", b"0") + literal(b"x-" + b"n" * 200, b"v" * 300)
    assert decoder.decode(block, raw=True) == [(b"grpc-status", b"0"),
                                               (b"x-" + b"n" * 200, b"v" * 300)]
    assert len(decoder.header_table.dynamic_entries) == 0


def test_references_past_the_limit_are_counted_not_kept() -> None:
    """A block of one-byte references to one large entry (an HPACK bomb) decodes to its
    size, not to a list that large, and the table stays in step for the next block."""
    entry = b"\x40\x01a" + hpack.hpack.encode_integer(4000, 7) + b"v" * 4000
    block = entry + b"\xbe" * 1000  # index 62: the entry just added
    decoder = Decoder()
    headers, size = decoder.decode(block, 16 * 1024)
    assert size == 1001 * (1 + 4000 + 32)
    assert len(headers) == 4  # what fits in 16 KiB; the size says the rest
    assert decoder.decode(b"\xbe", 16 * 1024)[0] == [(b"a", b"v" * 4000)]
