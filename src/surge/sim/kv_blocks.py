"""An engine's KV cache as vLLM's block manager keeps it: fixed blocks, a prefix cache.

A sequence's tokens fill blocks of `block_size`; a full block is named by a hash
chained from its parent block's hash, its token ids and the LoRA adapter (an adapter's
blocks are its own), so equal prefixes have equal hash chains. The pool holds
`num_blocks`: blocks in use by running sequences (counted by `refs` per hash, plus
`partial` blocks not yet full), and cached blocks no sequence uses, kept for reuse
until room is needed, then evicted least recently freed first. A sequence's blocks are
freed tail first, so its prefix outlives its tail, as in vLLM's free queue.

Every change to what is cached is recorded as vLLM's KV events (codecs/kv_events.py)
for `take_events`. Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

from surge.codecs.kv_events import BlockRemoved, BlockStored, KVEvent

__all__ = ["BlockPool", "block_hash", "prefix_hashes"]


def block_hash(parent: int | None, token_ids: Sequence[int], lora_id: int | None) -> int:
    """A full block's 63-bit name: stable across processes (unlike `hash`)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update((parent if parent is not None else -1).to_bytes(8, "big", signed=True))
    digest.update((lora_id if lora_id is not None else -1).to_bytes(8, "big", signed=True))
    digest.update(struct.pack(f">{len(token_ids)}I", *token_ids))  # 4 bytes each, big end
    return int.from_bytes(digest.digest(), "big") >> 1


def prefix_hashes(token_ids: Sequence[int], block_size: int, lora_id: int | None,
                  ) -> list[int]:
    """The hash chain of the full blocks of `token_ids` (`block_hash` of each on its
    parent, the token ids packed once: a 44,000-token prompt is 2,750 blocks)."""
    hashes: list[int] = []
    count = len(token_ids) // block_size
    if not count:
        return hashes
    packed = struct.pack(f">{count * block_size}I", *token_ids[:count * block_size])
    lora = (lora_id if lora_id is not None else -1).to_bytes(8, "big", signed=True)
    parent = (-1).to_bytes(8, "big", signed=True)
    size = 4 * block_size
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    for start in range(0, len(packed), size):
        name = from_bytes(blake2b(parent + lora + packed[start:start + size],
                                  digest_size=8).digest(), "big") >> 1
        hashes.append(name)
        parent = name.to_bytes(8, "big")  # (63 bits: as block_hash's signed bytes)
    return hashes


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refs: dict[int, int] = {}  # hash -> sequences using the cached block
        self.partial = 0  # blocks in use that are not (yet) cached: not full
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # evicted from the front
        self.evictions = 0
        self._events: list[KVEvent] = []

    def __repr__(self) -> str:
        return (f"<BlockPool used={self.used}/{self.num_blocks} "
                f"free_cached={len(self.free_cached)} evictions={self.evictions}>")

    @property
    def used(self) -> int:
        """Blocks running sequences hold (what vLLM reports as KV-cache usage)."""
        return len(self.refs) + self.partial

    def usage(self) -> float:
        return self.used / self.num_blocks

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a hash chain the pool holds (used or free)."""
        count = 0
        for h in hashes:
            if h not in self.refs and h not in self.free_cached:
                break
            count += 1
        return count

    def can_hold(self, new_blocks: int, reused: Sequence[int] = ()) -> bool:
        """Whether `new_blocks` more (after taking `reused` cached ones) fit, evicting
        cached blocks nobody uses if needed."""
        taken = sum(1 for h in reused if h in self.free_cached)
        return self.used + taken + new_blocks <= self.num_blocks

    def reuse(self, hashes: Sequence[int]) -> None:
        """A sequence takes cached blocks (as returned by `cached_prefix`)."""
        for h in hashes:
            if h in self.free_cached:
                del self.free_cached[h]
                self.refs[h] = 1
            else:
                self.refs[h] += 1

    def allocate(self, count: int) -> None:
        """`count` new (partial) blocks; evicts free cached blocks for room. The caller
        checked `can_hold`: anything else is a bug, raised as ValueError."""
        if not self.can_hold(count):
            raise ValueError(f"{count} blocks do not fit: {self!r}")
        room = self.num_blocks - self.used - len(self.free_cached)
        if count > room:
            self._evict(count - room)
        self.partial += count

    def fill(self, parent: int | None, token_ids: Sequence[int], lora_id: int | None) -> int:
        """One of the caller's partial blocks is now full of `token_ids`: it becomes a
        cached block (or, if that block is cached already, the caller shares it)."""
        h = block_hash(parent, token_ids, lora_id)
        self.partial -= 1
        if h in self.refs:
            self.refs[h] += 1
        elif h in self.free_cached:
            del self.free_cached[h]
            self.refs[h] = 1
        else:
            self.refs[h] = 1
            self._events.append(BlockStored([h], parent, list(token_ids), self.block_size,
                                            lora_id))
        return h

    def free(self, hashes: Sequence[int], partial: int) -> None:
        """A sequence ends or is preempted: its blocks are freed, its tail first."""
        self.partial -= partial
        for h in reversed(hashes):
            left = self.refs[h] - 1
            if left:
                self.refs[h] = left
            else:
                del self.refs[h]
                self.free_cached[h] = None

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def _evict(self, count: int) -> None:
        gone = [self.free_cached.popitem(last=False)[0] for _ in range(count)]
        self.evictions += count
        self._events.append(BlockRemoved(gone))
