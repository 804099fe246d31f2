"""vLLM's KV-cache events, in its own wire shape (`kv_events_config`, msgpack over ZMQ).

An engine that caches prefixes publishes what enters and leaves its KV cache, one
batch per scheduler step: `BlockStored` (full blocks now held, each named by a hash
chained from its parent's, with the block's token ids and the LoRA adapter's id),
`BlockRemoved` (evicted), `AllBlocksCleared` (a reset). As vLLM 0.32 encodes them, the
batch is an array (`ts`, events, data-parallel rank) and each event a map tagged by its
class name under `type`, so surge's mock engine and vLLM's publisher read alike. The
field names are vLLM's (vllm/distributed/kv_events.py; those surge does not use are
left out and ignored when read); `medium` is where the block lives ("GPU", "CPU", None:
unspecified). Block hashes are ints (vLLM's default,
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).

`KVEventBuffer` holds the batches an engine received for its reader (the replica's
service), bounded: past its bound the oldest go, and the reader is told its view of the
cache is unknown (an `AllBlocksCleared` first), as after a gap in vLLM's sequence.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEvent", "KVEventBatch",
           "KVEventBuffer", "KVEventSink", "decode_batch", "encode_batch", "replay"]


class _Event(msgspec.Struct, gc=False, tag=True):
    """A KV-cache event: a map whose `type` is the class name, as vLLM's (every field
    written, so vLLM's decoder, whose `medium` and `lora_name` have no default, reads
    ours; fields vLLM adds later are ignored when read)."""


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # vLLM: deprecated for lora_name, still written
    medium: str | None = None
    lora_name: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(_Event):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float  # the publisher's wall clock, seconds
    events: list[KVEvent]
    data_parallel_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


class KVEventSink(Protocol):
    """What reads events as plain data (policy/kv_chunks.py's ChunkCoverage)."""

    def stored(self, block_hashes: Sequence[int], parent: int | None,
               token_ids: Sequence[int], block_size: int, lora_id: int | None) -> None: ...
    def removed(self, block_hashes: Sequence[int]) -> None: ...
    def cleared(self) -> None: ...


def replay(events: Iterable[KVEvent], sink: KVEventSink) -> None:
    """Hand each event to `sink`, in order."""
    for event in events:
        if isinstance(event, BlockStored):
            sink.stored(event.block_hashes, event.parent_block_hash, event.token_ids,
                        event.block_size, event.lora_id)
        elif isinstance(event, BlockRemoved):
            sink.removed(event.block_hashes)
        else:
            sink.cleared()


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(data: bytes) -> KVEventBatch:
    """One published batch; raises msgspec.ValidationError/DecodeError on anything else."""
    return _DECODER.decode(data)


class KVEventBuffer:
    """An engine's KV event batches for its reader, oldest first, at most `maxlen`."""

    __slots__ = ("_batches", "_lost")

    def __init__(self, maxlen: int) -> None:
        self._batches: deque[KVEventBatch] = deque(maxlen=maxlen)
        self._lost = False  # batches fell off: the next take() begins with a reset

    def __len__(self) -> int:
        return len(self._batches)

    def __repr__(self) -> str:
        return f"<KVEventBuffer {len(self._batches)}/{self._batches.maxlen} lost={self._lost}>"

    def keep(self, batch: KVEventBatch) -> None:
        """Buffer a batch; past the bound the oldest is dropped."""
        if len(self._batches) == self._batches.maxlen:
            self._lost = True
        self._batches.append(batch)

    def take(self) -> list[KVEventBatch]:
        """The batches since the last call, oldest first; after a loss an
        `AllBlocksCleared` first: what the lost batches evicted is unknown, so the reader
        trusts nothing it held before."""
        batches = list(self._batches)
        self._batches.clear()
        if self._lost:
            self._lost = False
            batches.insert(0, KVEventBatch(time.time(), [AllBlocksCleared()]))
        return batches
