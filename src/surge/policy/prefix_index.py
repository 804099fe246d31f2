"""Which replica's engine holds how much of a prompt: prompt chunks, an index, a choice.

A prompt is read as a stream of bytes that is the same for every request that shares
its beginning, whatever the body's JSON field order: the model (and adapter), then each
chat message's role and text (or the completion prompt), with separators. The stream is
cut into chunks, each named by a hash chained from the one before (SHA-1 of the
previous name and the chunk, 8 bytes kept), so equal names mean equal prefixes; only
full chunks count. A chunk is CHUNK_BYTES (about 64 tokens: a few of vLLM's 16-token
blocks) for the first FINE_BYTES, then an eighth of the stream before it, so a prompt's
chunks grow with its log size (51 for 220 KB) and its naming costs little more than
hashing its bytes once.

`PrefixIndex` maps chunk names to the replicas believed to hold them, a bit per
replica, bounded to `max_chunks` names (least recently used forgotten first). It learns
from where requests were sent (`record`: the engine computed that prefix there) and
from what engines report (`record` / `forget` / `drop` from their KV events), so it is
right about what the engines hold as long as they keep it; its cost is one dict lookup
per chunk of the prompt, and it stops at the first chunk nobody holds.

`choose_by_prefix`: the power-of-two choice on the score (`choose_by_score`) unless a
replica with room holds a prefix and its score is within the slack of that choice's
(the same bounded spill as affinity, policy/engine_routing.py): then one holding the
longest (ties: lower score, then fewer in flight). It reads the holders deepest first
and stops at the first depth with one in the slack. `read_holders` gives it a depth's
replicas: all of them while they are few; of a depth more hold (a system prompt many
replicas have, followed by a new question), first WIDE_SAMPLE of them found by random
probes (the power of two choices among them), then WIDE_RUN more, and all of them only
when those are all over the slack, so a decision stays flat at 512 replicas however
many hold the depth, and a holder with room is still found when it is the only one.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgspec

from surge.policy.engine_routing import (
    AFFINITY_SLACK_MIN,
    AFFINITY_SLACK_RATIO,
    NO_REPLICA,
    choose_by_score,
)
from surge.policy.routing import Loads

__all__ = ["CHUNK_BYTES", "FINE_BYTES", "GROWTH", "MAX_PROMPT_BYTES", "MAX_PROMPT_CHUNKS",
           "WIDE_HOLDERS", "WIDE_PROBES", "WIDE_RUN", "WIDE_SAMPLE", "PrefixIndex",
           "choose_by_prefix", "chunk_end", "chunk_names", "holders", "prompt_stream",
           "read_holders", "run_of_holders", "sample_holders"]

# About 64 tokens: fine enough that a shared system prompt of a few hundred tokens counts.
CHUNK_BYTES = 256
# Past the first FINE_BYTES, a chunk is 1/GROWTH of the stream before it (in whole
# CHUNK_BYTES): a long history is matched within 12.5% of its length, and a 220 KB
# prompt is 51 chunks to name rather than 860 of CHUNK_BYTES (naming costs ~0.5 µs a
# chunk beyond hashing its bytes; the bytes ~0.45 ns each with SHA-1).
FINE_BYTES = 4096
GROWTH = 8
# What of a prompt is named: 1 MiB, so one request's cost is bounded whatever its size.
MAX_PROMPT_BYTES = 1024 * 1024


def _chunk_ends() -> tuple[int, ...]:
    ends = [CHUNK_BYTES]
    while True:
        end = ends[-1]
        step = CHUNK_BYTES if end < FINE_BYTES else end // GROWTH // CHUNK_BYTES * CHUNK_BYTES
        if end + step > MAX_PROMPT_BYTES:
            return tuple(ends)
        ends.append(end + step)


_ENDS = _chunk_ends()
MAX_PROMPT_CHUNKS = len(_ENDS)
# Names the index keeps by default: ~64 MB of KV-cache-worth of prompt per replica at
# 512 replicas would be far more; this bounds the router's memory (~25 MB) instead.
DEFAULT_MAX_CHUNKS = 200_000
# A depth more than WIDE_HOLDERS replicas hold is read on WIDE_SAMPLE of them, found in
# WIDE_PROBES probes of its bits, then on a run of WIDE_RUN, then whole: reading a
# handful whole costs about as much as probing (~0.2 µs a holder), and the whole read is
# kept because the holders left out are not read at a shallower depth either (`held`
# leaves them out there): a request whose sample is over the slack would otherwise lose
# its cache hit to the general choice.
WIDE_HOLDERS = 16
WIDE_SAMPLE = 2
WIDE_PROBES = 8
WIDE_RUN = 8
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


def chunk_end(k: int) -> int:
    """Where chunk k (from 0, below MAX_PROMPT_CHUNKS) of a stream ends, in bytes."""
    return _ENDS[k]


def chunk_names(stream: bytes, max_chunks: int = MAX_PROMPT_CHUNKS,
                known: Sequence[int] = ()) -> list[int]:
    """The chained names of the stream's full chunks (at most `max_chunks`). `known`:
    the names of its first chunks, already known (policy/prompt_names.py checked that
    their bytes are those of a stream named before), from which the chain goes on."""
    names = list(known)
    parent = names[-1].to_bytes(8, "big") if names else b""
    view = memoryview(stream)
    start = _ENDS[len(names) - 1] if names else 0
    count = bisect.bisect_right(_ENDS, len(stream), hi=min(max_chunks, len(_ENDS)))
    for end in _ENDS[len(names):count]:
        digest = hashlib.sha1(parent, usedforsecurity=False)  # a name, not a secret
        digest.update(view[start:end])
        parent = digest.digest()[:8]
        names.append(int.from_bytes(parent, "big"))
        start = end
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

    def record(self, replica_id: str, names: Sequence[int]) -> None:
        """`replica_id`'s engine holds these chunks (now the most recently used)."""
        flag = 1 << self._bit(replica_id)
        chunks = self.chunks
        for name in reversed(names):  # the head most recent: the tail is forgotten first
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

    def follow(self, replica_id: str, stored: Iterable[Sequence[int]], removed: Sequence[int],
               cleared: bool) -> None:
        """What `replica_id`'s engine reported since its last report (policy/kv_chunks.py):
        a cleared cache first, then the chunks it evicted, then the chains it holds."""
        if cleared:
            self.drop(replica_id)
        if removed:
            self.forget(replica_id, removed)
        for chain in stored:
            self.record(replica_id, chain)

    def held(self, names: Sequence[int]) -> list[tuple[int, int]]:
        """How deep each replica holds `names`: (depth, bitmask of replicas) pairs,
        deepest first, each replica in one pair (its deepest), read on a ladder of
        depths: the deepest chunk anyone holds (binary search), then 7/8, 3/4, 1/2,
        1/4 ... of it. What a replica holds is a prefix (recorded whole, forgotten tail
        first), so a few lookups serve a prompt of any length; a depth between two rungs
        reads as the lower one. `replicas(mask)` names a pair's replicas."""
        chunks = self.chunks
        if not names or names[0] not in chunks:
            return []
        low, high = 1, len(names) + 1  # names[low - 1] is held; names[high - 1] is not
        while high - low > 1:
            middle = (low + high) // 2
            if names[middle - 1] in chunks:
                low = middle
            else:
                high = middle
        pairs: list[tuple[int, int]] = []
        seen = 0
        for depth in _ladder(low):  # deepest first: the head ends the most recent
            name = names[depth - 1]
            mask = chunks.get(name, 0)
            if mask:
                chunks.move_to_end(name)
                if mask & ~seen:
                    pairs.append((depth, mask & ~seen))
                seen |= mask
        return pairs

    def replicas(self, mask: int) -> list[str]:
        ids = self.ids
        out = []
        while mask:
            low = mask & -mask
            out.append(ids[low.bit_length() - 1])
            mask ^= low
        return out

    def matched(self, names: Sequence[int]) -> dict[str, int]:
        """Replica id -> the depth `held` reads for it."""
        return {r: depth for depth, mask in self.held(names) for r in self.replicas(mask)}


def holders(index: PrefixIndex, mask: int, at: Mapping[str, int]) -> list[int]:
    """The positions in the routable replicas (`at`: replica id -> position) of all the
    replicas in `mask` (a pair of `index.held`), ~0.2 µs each."""
    return [at[r] for r in index.replicas(mask) if r in at]


def sample_holders(index: PrefixIndex, mask: int, at: Mapping[str, int],
                   rng: random.Random) -> list[int]:
    """Up to WIDE_SAMPLE distinct routable replicas of `mask`, found in WIDE_PROBES
    probes whatever its size: each probe takes the first holder at or above a random bit
    below the mask's highest, so a holder is found in proportion to the bits from the
    holder below it to its own (random, not uniform, over the holders)."""
    found: list[int] = []
    top = mask.bit_length()
    ids = index.ids
    for _ in range(WIDE_PROBES):
        start = rng.randrange(top)
        rest = mask >> start
        position = at.get(ids[start + (rest & -rest).bit_length() - 1], -1)
        if position >= 0 and position not in found:
            found.append(position)
            if len(found) == WIDE_SAMPLE:
                break
    return found


def run_of_holders(index: PrefixIndex, mask: int, at: Mapping[str, int],
                   rng: random.Random, count: int = WIDE_RUN) -> list[int]:
    """Up to `count` routable replicas of `mask`: those at or above a random bit, in
    bit order, wrapping around to the lowest (~0.3 µs each)."""
    found: list[int] = []
    ids = index.ids
    start = rng.randrange(mask.bit_length())
    for part in (mask >> start << start, mask & ((1 << start) - 1)):
        while part:
            low = part & -part
            position = at.get(ids[low.bit_length() - 1], -1)
            if position >= 0:
                found.append(position)
                if len(found) == count:
                    return found
            part ^= low
    return found


def read_holders(index: PrefixIndex, pairs: Iterable[tuple[int, int]], at: Mapping[str, int],
                 rng: random.Random) -> Iterator[tuple[int, list[int]]]:
    """(depth, positions of its holders) for `choose_by_prefix`, from `index.held`'s
    (depth, mask) pairs: a depth WIDE_HOLDERS or fewer replicas hold, whole; a wider one
    three times, on `sample_holders` (the power of two choices), on `run_of_holders`,
    then whole. `choose_by_prefix` stops at the first with a holder with room within the
    slack, so the depth is read further only when the holders read so far are all over
    it, and whole only when the sample and the run all are: a holder left out is not
    read at a shallower depth either (`held` keeps each replica at its deepest), so a
    holder with room is never lost to the general choice."""
    for depth, mask in pairs:
        if mask.bit_count() > WIDE_HOLDERS:
            sample = sample_holders(index, mask, at, rng)
            if sample:
                yield depth, sample
            yield depth, run_of_holders(index, mask, at, rng)
        yield depth, holders(index, mask, at)


def _ladder(depth: int) -> list[int]:
    """depth, 7/8, 3/4, 1/2, 1/4, ... of it, down to 1, each once."""
    rungs = [depth, depth * 7 // 8, depth * 3 // 4]
    step = depth // 2
    while step:
        rungs.append(step)
        step //= 2
    return sorted({r for r in rungs if r >= 1}, reverse=True)


def choose_by_prefix(in_flight: Loads | Sequence[int], scores: Loads | Sequence[int],
                     capacity: int, held: Iterable[tuple[int, Iterable[int]]],
                     rng: random.Random, local: int = 0, slack_min: int = AFFINITY_SLACK_MIN,
                     slack_ratio: float = AFFINITY_SLACK_RATIO) -> int:
    """`held`: (depth, replica indices) deepest first. The replica with room at the
    deepest depth whose score is within the slack of the power-of-two choice's (ties:
    lower score, then fewer in flight), else that choice. Reads the pairs only down to
    the first that has such a replica, so its cost is theirs, not all replicas'."""
    base = choose_by_score(in_flight, scores, capacity, rng, local)
    if base == NO_REPLICA:
        return base
    least = scores[base]
    bound = least + max(slack_min, slack_ratio * least)
    n = len(in_flight)
    for _depth, indices in held:
        best, best_key = NO_REPLICA, (0, 0)
        for index in indices:
            if index >= n or in_flight[index] >= capacity:
                continue
            score = scores[index]
            if score >= capacity or score > bound:
                continue
            key = (score, in_flight[index])
            if best == NO_REPLICA or key < best_key:
                best, best_key = index, key
        if best != NO_REPLICA:
            return best
    return base
