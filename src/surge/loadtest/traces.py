"""LLM request traces as they are published, and prompts made from them.

* **Mooncake** (JSON Lines): `{"timestamp": ms, "input_length": tokens, "output_length":
  tokens, "hash_ids": [...]}`: `hash_ids` name the prompt's 512-token blocks, so two
  requests that share leading ids share that prefix.
* **BurstGPT** (CSV, header row): `Timestamp` (seconds), `Model`, `Request tokens`,
  `Response tokens`, `Total tokens`, `Log Type`; no prefix information (every prompt is
  its own).

Both read into `TraceRequest`s (arrival in seconds from the trace's first, input and
output lengths, block ids), with the file and line of anything malformed. `prompt_words`
makes a prompt for one: equal block ids give equal blocks of words (a word is a token
for the mock engine; about one for real tokenizers), so prefix reuse survives the
synthesis. `gamma_arrivals` draws arrival times as `vllm bench serve` does
(`--burstiness`: a gamma distribution's shape, 1 is Poisson, lower is burstier).
`mooncake_shaped` and `burstgpt_shaped` generate seeded traces of the published shapes
(scripts/make_sample_traces.py writes them as files), so nothing is downloaded at run time.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BLOCK_TOKENS", "TraceError", "TraceRequest", "block_reuse", "burstgpt_shaped",
           "gamma_arrivals",
           "mooncake_shaped", "prompt_words", "read_burstgpt", "read_mooncake", "read_trace",
           "write_burstgpt", "write_mooncake"]

BLOCK_TOKENS = 512  # Mooncake's tokens per hash id
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type")
_WORDS = 4096  # distinct words prompts are made of


class TraceError(ValueError):
    """A trace file that cannot be read: says where and what."""


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # after the trace's first request
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()  # the prompt's blocks; () for none known


def read_trace(path: str | Path) -> list[TraceRequest]:
    """A Mooncake `.jsonl` or a BurstGPT `.csv`, by its suffix."""
    path = Path(path)
    if path.suffix in (".jsonl", ".json"):
        return read_mooncake(path)
    if path.suffix == ".csv":
        return read_burstgpt(path)
    raise TraceError(f"{path}: a trace is Mooncake JSON Lines (.jsonl) or BurstGPT CSV (.csv)")


def read_mooncake(path: str | Path) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
                request = TraceRequest(
                    float(row["timestamp"]) / 1000.0, _count(row["input_length"]),
                    _count(row["output_length"]),
                    tuple(int(h) for h in row.get("hash_ids") or ()))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise TraceError(f"{where}: not a Mooncake request ({_why(exc)}); a line is "
                                 '{"timestamp": ms, "input_length": n, "output_length": n, '
                                 '"hash_ids": [...]}') from None
            out.append(request)
    return _from_zero(out)


def read_burstgpt(path: str | Path) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8", newline="") as file:
        reader = csv.DictReader(file)
        missing = [c for c in ("Timestamp", "Request tokens", "Response tokens")
                   if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}:1: a BurstGPT header names {', '.join(BURSTGPT_COLUMNS)}; "
                             f"missing {', '.join(missing)}")
        for number, row in enumerate(reader, 2):
            try:
                request = TraceRequest(float(row["Timestamp"]), _count(row["Request tokens"]),
                                       _count(row["Response tokens"]))
            except (TypeError, ValueError) as exc:
                raise TraceError(f"{path}:{number}: not a BurstGPT request ({_why(exc)})") \
                    from None
            if request.output_length > 0:  # failed requests are logged with 0 tokens out
                out.append(request)
    return _from_zero(out)


def _count(value: object) -> int:
    number = int(float(str(value)))
    if number < 0:
        raise ValueError(f"a token count is >= 0, got {number}")
    return number


def _why(exc: BaseException) -> str:
    return f"missing {exc}" if isinstance(exc, KeyError) else str(exc)


def _from_zero(requests: list[TraceRequest]) -> list[TraceRequest]:
    requests.sort(key=lambda r: r.at_s)
    if not requests:
        return requests
    first = requests[0].at_s
    return [TraceRequest(r.at_s - first, r.input_length, r.output_length, r.hash_ids)
            for r in requests]


def prompt_words(request: TraceRequest, index: int) -> list[str]:
    """`input_length` words; equal hash ids give equal blocks. A request without hash
    ids gets words of its own (from `index`), shared with no other."""
    blocks = request.hash_ids or (-(index + 1),)
    words: list[str] = []
    for block in blocks:
        if len(words) >= request.input_length:
            break
        rng = random.Random(block)
        words += (f"w{rng.randrange(_WORDS)}" for _ in range(BLOCK_TOKENS))
    while len(words) < request.input_length:  # longer than its blocks: its own words
        rng = random.Random(f"{index}:{len(words)}")
        words += (f"w{rng.randrange(_WORDS)}" for _ in range(BLOCK_TOKENS))
    return words[:request.input_length]


def gamma_arrivals(count: int, rate: float, burstiness: float,
                   rng: random.Random) -> list[float]:
    """Arrival times (s) of `count` requests at `rate`/s on average, gaps drawn from a
    gamma distribution of shape `burstiness` (as `vllm bench serve --burstiness`)."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    at, out = 0.0, []
    for _ in range(count):
        out.append(at)
        at += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def mooncake_shaped(count: int, rate: float, rng: random.Random, *,
                    burstiness: float = 1.0) -> list[TraceRequest]:
    """Conversations of growing turns after Zipf-popular system prompts: each turn's
    blocks are the last turn's plus 1-3 new ones, after one of 30 system prompts of 2-6
    blocks; a conversation ends past 24 blocks."""
    systems = [tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + rng.randint(2, 6)))
               for i in range(30)]
    weights = [1 / (i + 1) for i in range(30)]
    fresh = iter(range(10_000_000, 1 << 62))
    sessions: list[list[int]] = []
    times = iter(gamma_arrivals(count, rate, burstiness, rng))
    out: list[TraceRequest] = []
    while len(out) < count:
        if sessions and rng.random() < 0.6:
            blocks = rng.choice(sessions)
        else:
            blocks = list(rng.choices(systems, weights)[0])
            sessions.append(blocks)
            if len(sessions) > 200:
                sessions.pop(0)
        blocks += [next(fresh) for _ in range(rng.randint(1, 3))]
        if len(blocks) > 24:
            sessions.remove(blocks)
            continue
        length = len(blocks) * BLOCK_TOKENS - rng.randint(0, BLOCK_TOKENS - 1)
        out.append(TraceRequest(next(times), length, rng.randint(50, 400), tuple(blocks)))
    return out


def burstgpt_shaped(count: int, rate: float, rng: random.Random, *,
                    burstiness: float = 0.25) -> list[TraceRequest]:
    """BurstGPT's shape: bursty arrivals, prompt and response lengths log-normal around
    ~600 and ~250 tokens (ChatGPT conversation logs), no prefix information."""
    return [TraceRequest(at, max(1, int(rng.lognormvariate(6.4, 0.9))),
                         max(1, int(rng.lognormvariate(5.5, 0.8))))
            for at in gamma_arrivals(count, rate, burstiness, rng)]


def write_mooncake(requests: Sequence[TraceRequest], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for r in requests:
            out.write(json.dumps({"timestamp": round(r.at_s * 1000), "input_length":
                                  r.input_length, "output_length": r.output_length,
                                  "hash_ids": list(r.hash_ids)}) + "\n")


def write_burstgpt(requests: Sequence[TraceRequest], path: str | Path,
                   model: str = "ChatGPT") -> None:
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(BURSTGPT_COLUMNS)
        for r in requests:
            writer.writerow([f"{r.at_s:.3f}", model, r.input_length, r.output_length,
                             r.input_length + r.output_length, "Conversation log"])


def block_reuse(requests: Sequence[TraceRequest]) -> float:
    """The share of blocks that an earlier request already had (Mooncake's reuse)."""
    seen: set[int] = set()
    reused = total = 0
    for r in requests:
        for block in r.hash_ids:
            total += 1
            reused += block in seen
            seen.add(block)
    return reused / total if total else 0.0
