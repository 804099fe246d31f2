"""What a replica's engine holds, in the routers' chunk names: the engine's KV events
(codecs/kv_events.py, handed over as plain data by its `replay`) read against the
prompts the replica served.

Routers name a prompt's prefixes by chunks of its canonical bytes (policy/prefix_index.py);
an engine names what it caches by blocks of token ids chained by hash (vLLM's
BlockStored / BlockRemoved / AllBlocksCleared). The replica sees both, so the
translation happens here, where the tokens already are (the router never tokenises):

* the engine's blocks are kept as (parent hash, token ids, LoRA id) -> hash, as its
  BlockStored events say (bounded by its own cache: BlockRemoved takes them out);
* for each prompt served (its chunk names, its canonical stream's length in bytes, its
  token ids), the chain is walked from the root through the blocks the engine holds;
* chunk k covers the stream's first E = chunk_end(k) of L bytes, taken to end at
  token ceil(E / L x T) of the prompt's T tokens (a chat template
  adds a few tokens around each message; the proportion is a close guess), so on the
  block holding that token: the chunk is held while that block is.

`take()` gives what changed since the last call, as the routers' index takes it: chains
now held (`record`), the chunk names whose ending block the engine removed (`forget`;
vLLM frees a request's blocks tail first and evicts the least recently used first, so a
prefix loses its tail before its head), and whether the whole cache was cleared
(`drop`). A prompt whose blocks are not in the events yet (vLLM publishes them apart
from the answer) is tried again at the next take, up to PENDING_TAKES times; at most
MAX_PENDING prompts wait, the oldest given up first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from surge.policy.prefix_index import chunk_end

__all__ = ["MAX_PENDING", "PENDING_TAKES", "ChunkCoverage", "PrefixChange"]

# Prompts waiting for their blocks' events: a few hundred ms of a busy engine's requests.
MAX_PENDING = 4096
# Takes (routing-stats periods, 0.25 s for LLMServer) a prompt waits for its events.
PENDING_TAKES = 4

_BlockKey = tuple[int | None, tuple[int, ...], int | None]


@dataclass(frozen=True)
class PrefixChange:
    stored: list[list[int]] = field(default_factory=list)  # chains held, head first
    removed: list[int] = field(default_factory=list)  # chunk names no longer held
    cleared: bool = False  # everything before this change is gone

    def __bool__(self) -> bool:
        return bool(self.stored or self.removed or self.cleared)


@dataclass
class _Prompt:
    names: list[int]
    stream_bytes: int
    token_ids: tuple[int, ...]
    lora_id: int | None
    takes: int = 0


class ChunkCoverage:
    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.blocks: dict[_BlockKey, int] = {}  # (parent, tokens, lora) -> block hash
        self.keys: dict[int, _BlockKey] = {}  # and back
        self.ending: dict[int, set[int]] = {}  # block hash -> chunk names ending on it
        self.block_size = 0  # the engine's, from its events
        self.pending: deque[_Prompt] = deque(maxlen=max_pending)
        self._stored: dict[int, list[int]] = {}  # chains held, by their last name
        self._removed: list[int] = []
        self._cleared = False

    def __repr__(self) -> str:
        return (f"<ChunkCoverage blocks={len(self.blocks)} chunked={len(self.ending)} "
                f"pending={len(self.pending)}>")

    def stored(self, block_hashes: Sequence[int], parent: int | None,
               token_ids: Sequence[int], block_size: int, lora_id: int | None) -> None:
        """The engine cached full blocks (a BlockStored event), chained from `parent`."""
        self.block_size = block_size
        for i, block in enumerate(block_hashes):
            key = (parent, tuple(token_ids[i * block_size:(i + 1) * block_size]), lora_id)
            self.blocks[key] = block
            self.keys[block] = key
            parent = block

    def removed(self, block_hashes: Sequence[int]) -> None:
        """The engine evicted blocks (BlockRemoved)."""
        for block in block_hashes:
            key = self.keys.pop(block, None)
            if key is not None and self.blocks.get(key) == block:
                del self.blocks[key]
            self._removed += self.ending.pop(block, ())

    def cleared(self) -> None:
        """The engine's whole cache was reset (AllBlocksCleared)."""
        self.blocks.clear()
        self.keys.clear()
        self.ending.clear()
        self._stored.clear()
        self._removed.clear()
        self._cleared = True

    def served(self, names: Sequence[int], stream_bytes: int, token_ids: Sequence[int],
               lora_id: int | None = None) -> None:
        """A prompt the engine has computed: its chunk names (prefix_index.chunk_names of
        a stream of `stream_bytes`) and its token ids."""
        if names and token_ids and stream_bytes > 0:
            self.pending.append(_Prompt(list(names), stream_bytes, tuple(token_ids), lora_id))

    def take(self) -> PrefixChange:
        """What changed since the last take (the pending prompts read first)."""
        waiting: list[_Prompt] = []
        while self.pending:
            prompt = self.pending.popleft()
            if not self._resolve(prompt):
                prompt.takes += 1
                if prompt.takes < PENDING_TAKES:
                    waiting.append(prompt)
        self.pending.extend(waiting)
        change = PrefixChange(list(self._stored.values()), self._removed, self._cleared)
        self._stored, self._removed, self._cleared = {}, [], False
        return change

    def _resolve(self, prompt: _Prompt) -> bool:
        """Record the prompt's held chunks; False while its first block is unknown."""
        hashes = self._chain(prompt.token_ids, prompt.lora_id)
        if not hashes:
            return False
        tokens, held = len(prompt.token_ids), []
        for k, name in enumerate(prompt.names):
            end = math.ceil(chunk_end(k) * tokens / prompt.stream_bytes)
            block = (max(end, 1) - 1) // self.block_size  # the block of its last token
            if block >= len(hashes):
                break
            self.ending.setdefault(hashes[block], set()).add(name)
            held.append(name)
        if held:
            self._stored[held[-1]] = held
        return True

    def _chain(self, token_ids: tuple[int, ...], lora_id: int | None) -> list[int]:
        """The hashes of the prompt's full blocks the engine holds, from the root."""
        hashes: list[int] = []
        parent: int | None = None
        block_size = self.block_size
        if block_size <= 0:
            return hashes
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            block = self.blocks.get((parent, token_ids[start:start + block_size], lora_id))
            if block is None:
                break
            hashes.append(block)
            parent = block
        return hashes
