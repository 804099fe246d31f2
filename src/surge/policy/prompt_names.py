"""Recent prompts and their chunk names, so a prompt that begins as a recent one did is
hashed only from where the two differ.

Naming a prompt (policy/prefix_index.py `chunk_names`) hashes all of its bytes, ~0.1 ms
for 220 KB, while requests in a row often share most of theirs: a conversation's next
turn is its last one with two messages more, an agent's loop resends its context, a
retry is the same body. `PromptNames` keeps the last `max_prompts` streams with their
names, one per first chunk (CHUNK_BYTES of bytes); a stream that begins with one of
those chunks takes that stream's names up to the last full chunk the two have byte for
byte (compared, never assumed: a comparison costs ~1% of a hash) and hashes the rest.
Names are the same as `chunk_names` gives, so routers and replicas agree whichever
names through this. Several conversations behind one system prompt share a first chunk
and take the turns before them as far as the system prompt only. Bounded: `max_prompts`
streams of at most MAX_PROMPT_BYTES each.
"""

from __future__ import annotations

from collections import OrderedDict

from surge.policy.prefix_index import CHUNK_BYTES, MAX_PROMPT_BYTES, chunk_end, chunk_names

__all__ = ["DEFAULT_MAX_PROMPTS", "PromptNames"]

# The streams kept: a few turns of as many conversations in flight at once, and at most
# 32 MiB of a router's memory with 1 MiB prompts (a few hundred KB with usual ones).
DEFAULT_MAX_PROMPTS = 32


class PromptNames:
    def __init__(self, max_prompts: int = DEFAULT_MAX_PROMPTS) -> None:
        self.max_prompts = max_prompts
        self.recent: OrderedDict[bytes, tuple[bytes, list[int]]] = OrderedDict()
        self.hashed = 0  # chunks named by hashing
        self.reused = 0  # chunks whose names came from a recent stream

    def __repr__(self) -> str:
        return (f"<PromptNames prompts={len(self.recent)}/{self.max_prompts} "
                f"hashed={self.hashed} reused={self.reused}>")

    def names(self, stream: bytes) -> list[int]:
        """`chunk_names(stream)`, the chunks it shares with a recent stream not hashed."""
        if len(stream) < CHUNK_BYTES:
            return []
        head = stream[:CHUNK_BYTES]
        last = self.recent.pop(head, None)
        known = [] if last is None else last[1][:_shared(stream, *last)]
        names = chunk_names(stream, known=known)
        self.reused += len(known)
        self.hashed += len(names) - len(known)
        if len(stream) > MAX_PROMPT_BYTES:  # keep only what was named
            stream = stream[:chunk_end(len(names) - 1)]
        self.recent[head] = (stream, names)
        if len(self.recent) > self.max_prompts:
            self.recent.popitem(last=False)
        return names


def _shared(stream: bytes, old: bytes, names: list[int]) -> int:
    """How many full chunks `stream` has byte for byte as `old` (named `names`) does,
    given that the first is the same: all of old's first (a later turn, the same body),
    else the most found by a binary search on chunk ends."""
    view = memoryview(old)
    low, high = 1, len(names)  # old's first `low` chunks are the stream's; `high` maybe
    if stream.startswith(view[:chunk_end(high - 1)]):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if stream.startswith(view[:chunk_end(middle - 1)]):
            low = middle
        else:
            high = middle
    return low
