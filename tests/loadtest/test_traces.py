"""Traces as published (Mooncake JSON Lines, BurstGPT CSV), prompts made from them, and
gamma arrivals as `vllm bench serve` draws them."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from surge.loadtest.traces import (
    BLOCK_TOKENS,
    VOCABULARY,
    TraceError,
    TraceRequest,
    block_reuse,
    burstgpt_shaped,
    gamma_arrivals,
    mooncake_shaped,
    prompt_words,
    read_burstgpt,
    read_mooncake,
    read_trace,
    reuse_shape,
    write_burstgpt,
    write_mooncake,
)


def test_a_mooncake_file_reads_as_published(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 27482, "input_length": 6955, "output_length": 52, '
                    '"hash_ids": [46, 47, 48]}\n\n'
                    '{"timestamp": 27000, "input_length": 10, "output_length": 1}\n')
    assert read_trace(path) == [TraceRequest(0.0, 10, 1),
                                TraceRequest(pytest.approx(0.482), 6955, 52, (46, 47, 48))]


def test_a_burstgpt_file_reads_by_its_header_and_drops_failed_requests(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "8.5,GPT-4,1000,0,1000,Conversation log\n"  # failed: no tokens out
                    "9.25,GPT-4,20,300,320,API log\n")
    assert read_trace(path) == [TraceRequest(0.0, 472, 18), TraceRequest(4.25, 20, 300)]


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("a.jsonl", '{"timestamp": 1, "input_length": 5}\n', r"a.jsonl:1: .*missing 'output_length'"),
    ("a.jsonl", '{"timestamp": 1}\nnot json\n', r"a.jsonl:1: not a Mooncake request"),
    ("a.jsonl", '{"timestamp": 1, "input_length": -5, "output_length": 1}\n',
     r"from 0 to 16,777,216, got -5"),
    ("a.jsonl", '{"timestamp": 1, "input_length": 1e12, "output_length": 1}\n',
     r"a.jsonl:1: .*a token count is from 0 to 16,777,216, got 1000000000000"),
    ("a.csv", "Timestamp,Request tokens,Response tokens\n1,2,99999999999\n",
     r"a.csv:2: .*from 0 to 16,777,216, got 99999999999"),
    ("a.csv", "Timestamp,Model\n1,x\n", r"a.csv:1: .*missing Request tokens, Response tokens"),
    ("a.csv", "Timestamp,Request tokens,Response tokens\n1,x,3\n", r"a.csv:2: not a BurstGPT"),
    ("a.txt", "", r"Mooncake JSON Lines \(.jsonl\) or BurstGPT CSV"),
    # not finite: JSON's NaN and Infinity, 1e400 (read as infinity), a CSV's "nan"
    ("a.jsonl", '{"timestamp": NaN, "input_length": 10, "output_length": 2}\n',
     r"a.jsonl:1: .*a time is a finite number, got nan"),
    ("a.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": Infinity, "input_length": 10, "output_length": 2}\n',
     r"a.jsonl:2: .*a time is a finite number, got inf"),
    ("a.jsonl", '{"timestamp": 0, "input_length": 1e400, "output_length": 2}\n',
     r"a.jsonl:1: .*a token count is a finite number, got inf"),
    ("a.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 2, "hash_ids": [1e400]}\n',
     r"a.jsonl:1: not a Mooncake request \(cannot convert float infinity"),
    ("a.csv", "Timestamp,Request tokens,Response tokens\nnan,1,3\n",
     r"a.csv:2: .*a time is a finite number, got nan"),
    ("a.csv", "Timestamp,Request tokens,Response tokens\n1,2,3\n2,inf,3\n",
     r"a.csv:3: .*a token count is a finite number, got inf"),
])
def test_a_malformed_trace_says_where(tmp_path: Path, name: str, text: str,
                                      problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=problem):
        read_trace(path)


def test_a_byte_order_mark_and_an_upper_case_suffix_are_read(tmp_path: Path) -> None:
    burst = tmp_path / "burst.CSV"
    burst.write_bytes("\ufeffTimestamp,Model,Request tokens,Response tokens\r\n"
                      "5,ChatGPT,472,18\r\n".encode())
    moon = tmp_path / "moon.jsonl"
    moon.write_bytes('\ufeff{"timestamp": 0, "input_length": 10, "output_length": 1, '
                     '"hash_ids": [1]}\n'.encode())
    assert read_trace(burst) == [TraceRequest(0.0, 472, 18)]
    assert read_trace(moon) == [TraceRequest(0.0, 10, 1, (1,))]


def test_a_prompt_without_hash_ids_shares_no_block_with_one_that_has_them() -> None:
    own = prompt_words(TraceRequest(0, 512, 1), 0)  # (once seeded -1, read as 1)
    for block in (0, 1, -1):
        assert own != prompt_words(TraceRequest(0, 512, 1, (block,)), 1)


def test_equal_hash_ids_make_equal_prompt_blocks() -> None:
    a = prompt_words(TraceRequest(0, 1200, 1, (7, 8, 9)), 0)
    b = prompt_words(TraceRequest(0, 700, 1, (7, 8)), 1)
    c = prompt_words(TraceRequest(0, 700, 1, (7, 5)), 2)
    assert len(a) == 1200 and len(b) == 700
    assert a[:700] == b  # the same blocks, the same words
    assert c[:BLOCK_TOKENS] == a[:BLOCK_TOKENS] and c[BLOCK_TOKENS:] != a[BLOCK_TOKENS:700]
    longer = prompt_words(TraceRequest(0, 1100, 1, (7,)), 3)  # longer than its blocks
    assert longer[:BLOCK_TOKENS] == a[:BLOCK_TOKENS] and len(longer) == 1100
    mine, yours = (prompt_words(TraceRequest(0, 50, 1), i) for i in (4, 5))
    assert len(mine) == 50 and mine != yours  # no hash ids: its own words


def test_prompts_are_made_of_common_words() -> None:
    """Words a common tokenizer keeps whole (not `w1234`, 3-5 tokens each), so that a
    prompt's tokens are about its trace's input length."""
    assert len(set(VOCABULARY)) == len(VOCABULARY) == 512
    assert all(word.isascii() and word.isalpha() and word.islower() for word in VOCABULARY)
    words = prompt_words(TraceRequest(0, 3000, 1, (1, 2, 3)), 0)
    words += prompt_words(TraceRequest(0, 700, 1), 1)
    assert set(words) <= set(VOCABULARY)
    assert len(set(words)) > 400  # the whole vocabulary is drawn on


def test_gamma_arrivals_keep_the_rate_and_burstiness_clusters_them() -> None:
    poisson = gamma_arrivals(20_000, 100.0, 1.0, random.Random(1))
    bursty = gamma_arrivals(20_000, 100.0, 0.25, random.Random(1))
    assert poisson[0] == 0.0
    for times in (poisson, bursty):
        assert times[-1] / len(times) == pytest.approx(0.01, rel=0.05)
    gaps = [b - a for a, b in itertools.pairwise(bursty)]
    # a gamma gap's coefficient of variation is 1 / sqrt(shape): 2 at 0.25
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError, match="must be > 0"):
        gamma_arrivals(1, 0, 1, random.Random(1))


def test_shaped_traces_round_trip_through_their_published_formats(tmp_path: Path) -> None:
    moon = mooncake_shaped(300, 5.0, random.Random(2))
    assert block_reuse(moon) >= 0.5 and all(len(r.hash_ids) <= 24 for r in moon)
    write_mooncake(moon, tmp_path / "m.jsonl")
    again = read_mooncake(tmp_path / "m.jsonl")
    assert [(r.input_length, r.output_length, r.hash_ids) for r in again] == \
        [(r.input_length, r.output_length, r.hash_ids) for r in moon]
    burst = burstgpt_shaped(300, 5.0, random.Random(3))
    write_burstgpt(burst, tmp_path / "b.csv")
    read = read_burstgpt(tmp_path / "b.csv")
    assert [(r.input_length, r.output_length) for r in read] == \
        [(r.input_length, r.output_length) for r in burst]
    assert read[-1].at_s == pytest.approx(burst[-1].at_s, abs=0.001)
    assert block_reuse(burst) == 0.0
    (tmp_path / "empty.jsonl").write_text("")
    assert read_trace(tmp_path / "empty.jsonl") == []


def test_the_conversations_mix_reuses_mostly_its_own_turns_and_the_default_shared_heads() -> None:
    conversations = mooncake_shaped(2000, 5.0, random.Random(7), mix="conversations")
    prompts = mooncake_shaped(2000, 5.0, random.Random(7))
    own, shared = reuse_shape(conversations), reuse_shape(prompts)
    assert own.reuse >= 0.45 and shared.reuse >= 0.5
    # heads 16+ requests had make most of the default's reuse, a tenth of the other's
    assert shared.widely_shared > 0.4 > 0.2 > own.widely_shared
    # so round robin finds far less of it: the ceiling of routing on the prefix over it
    assert own.ceiling > 3 > 2 > shared.ceiling > 1
    assert all(r.hash_ids[0] == 0 and len(r.hash_ids) <= 120 for r in conversations)
    with pytest.raises(ValueError, match="mix is one of"):
        mooncake_shaped(1, 1.0, random.Random(1), mix="agents")


def test_reuse_shape_counts_round_robin_hits_on_caches_that_never_evict() -> None:
    a, b = TraceRequest(0, 1024, 1, (1, 2)), TraceRequest(0, 1536, 1, (1, 2, 3))
    # on 2 replicas: a on replica 0, b on 1 (finds nothing), a on 0 again (finds a)
    shape = reuse_shape([a, b, a], replicas=2)
    assert shape.reuse == pytest.approx(4 / 7)
    assert shape.round_robin == pytest.approx(2 / 7)
    assert shape.ceiling == pytest.approx(2.0)
    assert shape.widely_shared == pytest.approx(2 / 4)  # 1 and 2 in a's second go: 2 had them
    assert reuse_shape([]) == reuse_shape([TraceRequest(0, 1, 1)])
    assert reuse_shape([]).ceiling == float("inf")
