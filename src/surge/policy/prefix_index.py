"""Which replica's engine holds how much of a prompt: prompt chunks, an index, a choice.

A prompt is read as a stream of bytes that is the same for every request that shares
its beginning, whatever the body's JSON field order: the model (and adapter), then each
chat message's role and text (or the completion prompt), with separators. The stream is
cut into CHUNK_BYTES chunks, each named by a hash chained from the one before, so equal
names mean equal prefixes; only full chunks count. A chunk is about CHUNK_BYTES / 4
tokens: a few of vLLM's 16-token blocks.

`PrefixIndex` maps chunk names to the replicas believed to hold them, a bit per
replica, bounded to `max_chunks` names (least recently used forgotten first). It learns
from where requests were sent (`record`: the engine computed that prefix there) and
from what engines report (`record` / `forget` / `drop` from their KV events), so it is
right about what the engines hold as long as they keep it; its cost is one dict lookup
per chunk of the prompt, and it stops at the first chunk nobody holds.

`choose_by_prefix`: among replicas with room whose score is within the slack of the
least loaded one (the same bounded spill as affinity, policy/engine_routing.py), the
one holding the longest prefix (ties: lower score, then fewer in flight); with no
prefix held within the slack, `choose_by_score` (power of two choices on the score).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from surge.policy.engine_routing import (
    AFFINITY_SLACK_MIN,
    AFFINITY_SLACK_RATIO,
    NO_REPLICA,
    choose_by_score,
)
from surge.policy.routing import Loads

__all__ = ["CHUNK_BYTES", "MAX_PROMPT_CHUNKS", "PrefixIndex", "choose_by_prefix",
           "chunk_names", "prompt_stream"]

# About 64 tokens: fine enough that a shared system prompt of a few hundred tokens
# counts, coarse enough that a 220 KB prompt is ~860 lookups.
CHUNK_BYTES = 256
# Chunks of one prompt that are looked at: 1 MiB of prompt, so one request's cost is
# bounded whatever its size.
MAX_PROMPT_CHUNKS = 4096
# Names the index keeps by default: ~64 MB of KV-cache-worth of prompt per replica at
# 512 replicas would be far more; this bounds the router's memory (~25 MB) instead.
DEFAULT_MAX_CHUNKS = 200_000
_MESSAGE_END = b"\x1e"
_ROLE_END = b"\x1f"


class _Part(msgspec.Struct):
    type: str = "text"
    text: str = ""


class _Message(msgspec.Struct):
    role: str = ""
    content: str | list[_Part] | None = None


class _Body(msgspec.Struct):
    model: str = ""
    messages: list[_Message] | None = None
    prompt: str | list[str] | None = None


_BODY = msgspec.json.Decoder(_Body)


def prompt_stream(body: bytes, adapter: str = "") -> bytes | None:
    """The canonical byte stream of an OpenAI chat or completion body's prompt; None
    when it has none or is not such a body (the caller falls back to other keys)."""
    try:
        parsed = _BODY.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    head = (adapter or parsed.model).encode() + _MESSAGE_END
    if parsed.messages:
        parts = [head]
        for message in parsed.messages:
            content = message.content
            if isinstance(content, list):
                content = "".join(p.text for p in content if p.type == "text")
            parts += (message.role.encode(), _ROLE_END, (content or "").encode(),
                      _MESSAGE_END)
        return b"".join(parts)
    if isinstance(parsed.prompt, str) and parsed.prompt:
        return head + parsed.prompt.encode()
    return None


def chunk_names(stream: bytes, chunk_bytes: int = CHUNK_BYTES,
                max_chunks: int = MAX_PROMPT_CHUNKS) -> list[int]:
    """The chained names of the stream's full chunks (at most `max_chunks`)."""
    names: list[int] = []
    parent = b""
    end = min(len(stream) // chunk_bytes, max_chunks) * chunk_bytes
    view = memoryview(stream)
    for start in range(0, end, chunk_bytes):
        parent = hashlib.blake2b(view[start:start + chunk_bytes], digest_size=8,
                                 key=parent).digest()
        names.append(int.from_bytes(parent, "big"))
    return names


class PrefixIndex:
    """Chunk name -> bitmask of the replicas that hold it, least recently used first."""

    def __init__(self, max_chunks: int = DEFAULT_MAX_CHUNKS) -> None:
        self.max_chunks = max_chunks
        self.chunks: OrderedDict[int, int] = OrderedDict()
        self.bits: dict[str, int] = {}  # replica id -> its bit
        self.ids: dict[int, str] = {}  # and back
        self._free_bits: list[int] = []

    def __repr__(self) -> str:
        return (f"<PrefixIndex chunks={len(self.chunks)}/{self.max_chunks} "
                f"replicas={len(self.bits)}>")

    def _bit(self, replica_id: str) -> int:
        bit = self.bits.get(replica_id)
        if bit is None:
            bit = self._free_bits.pop() if self._free_bits else len(self.bits)
            self.bits[replica_id] = bit
            self.ids[bit] = replica_id
        return bit

    def record(self, replica_id: str, names: Iterable[int]) -> None:
        """`replica_id`'s engine holds these chunks (now the most recently used)."""
        flag = 1 << self._bit(replica_id)
        chunks = self.chunks
        for name in names:
            chunks[name] = chunks.get(name, 0) | flag
            chunks.move_to_end(name)
        while len(chunks) > self.max_chunks:
            chunks.popitem(last=False)

    def forget(self, replica_id: str, names: Iterable[int]) -> None:
        """`replica_id`'s engine evicted these chunks."""
        bit = self.bits.get(replica_id)
        if bit is None:
            return
        keep = ~(1 << bit)
        for name in names:
            mask = self.chunks.get(name, 0) & keep
            if mask:
                self.chunks[name] = mask
            else:
                self.chunks.pop(name, None)

    def drop(self, replica_id: str) -> None:
        """The replica is gone (or its cache was cleared): it holds nothing. Its bit is
        cleared everywhere before another replica may take it."""
        bit = self.bits.pop(replica_id, None)
        if bit is None:
            return
        del self.ids[bit]
        keep = ~(1 << bit)
        for name in [n for n, mask in self.chunks.items() if mask >> bit & 1]:
            mask = self.chunks[name] & keep
            if mask:
                self.chunks[name] = mask
            else:
                del self.chunks[name]
        self._free_bits.append(bit)

    def matched(self, names: Sequence[int]) -> dict[str, int]:
        """Replica id -> how many leading chunks of `names` it holds (only replicas that
        hold at least the first). Each replica's bit is read once, where it drops out."""
        ids = self.ids
        held: dict[str, int] = {}
        alive = 0
        depth = 0
        for depth, name in enumerate(names):
            mask = self.chunks.get(name, 0)
            if depth:
                mask &= alive
            if not mask:
                break
            self.chunks.move_to_end(name)
            _settle(alive & ~mask, depth, ids, held)
            alive = mask
        else:
            depth = len(names)
        _settle(alive, depth, ids, held)
        return held


def _settle(bits: int, depth: int, ids: Mapping[int, str], held: dict[str, int]) -> None:
    while bits:
        low = bits & -bits
        held[ids[low.bit_length() - 1]] = depth
        bits ^= low


def choose_by_prefix(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int],
                     capacity: int, held: Mapping[int, int], rng: random.Random,
                     local: int = 0, slack_min: int = AFFINITY_SLACK_MIN,
                     slack_ratio: float = AFFINITY_SLACK_RATIO) -> int:
    """The replica holding the longest prefix within the slack, else power of two."""
    if held:
        n = len(in_flight)
        room = [i for i in range(n) if in_flight[i] < capacity and scores[i] < capacity]
        if room:
            least = min(scores[i] for i in room)
            bound = least + max(slack_min, slack_ratio * least)
            best = NO_REPLICA
            best_key = (0, 0, 0)
            for index, depth in held.items():
                if index >= n or in_flight[index] >= capacity or scores[index] >= capacity:
                    continue
                if scores[index] > bound:
                    continue
                key = (depth, -scores[index], -in_flight[index])
                if best == NO_REPLICA or key > best_key:
                    best, best_key = index, key
            if best != NO_REPLICA:
                return best
    return choose_by_score(in_flight, scores, capacity, rng, local)
