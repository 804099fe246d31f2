"""`weights.load(name, source)`: the tensors of a source, mapped from the node's store.

In a replica whose node has a store, `load` asks the store for the entry (it makes it
on the first request on the node), maps the entry's file read-only and returns a
`Weights`: a mapping of tensor names to zero-copy, read-only numpy arrays (`.torch()`
gives torch tensors over the same pages). The reference the replica holds on the entry
lives as long as anything made from it: when the last `Weights`, array or tensor of a
mapping is gone, a finalizer gives the reference back, and the store may evict the
entry once it needs the room. Elsewhere (a driver, a test, a store disabled), `load`
reads the source into this process alone, through the same code, with the same result.
"""

from __future__ import annotations

import asyncio
import math
import mmap
import os
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from surge.clock import SYSTEM
from surge.errors import WeightSourceError, WeightStoreUnavailableError
from surge.weights import protocol as p
from surge.weights.client import current_store
from surge.weights.formats import DTYPES, Tensor, plan
from surge.weights.materialise import COPY_WORKERS, Sink, copy_and_hash

if TYPE_CHECKING:
    import torch as torch_types  # the method Weights.torch shadows the name in the class

__all__ = ["Weights", "WeightsInfo", "load", "load_async", "stats"]

MAX_NAME = 200


@dataclass(frozen=True)
class WeightsInfo:
    """Where a `Weights` came from and what it cost."""

    name: str
    key: str  # SHA-256 of the source's content: the entry
    source: str
    nbytes: int  # the entry's size: header and tensors
    shared: bool  # mapped from the node's store (False: this process's own copy)
    hit: bool  # the store had it: nothing was read from the source
    path: str | None  # the entry's file (a safetensors file), when shared
    load_s: float  # this call, end to end
    materialise_s: float  # the store's copy of the source (0 for a hit on an old entry)


class _Segment(mmap.mmap):
    """A read-only mapping of an entry. Arrays and tensors keep it alive; it can be
    weakly referenced, so its end gives the store reference back."""


class Weights(Mapping[str, np.ndarray]):
    """Tensor name -> read-only numpy array, zero-copy over the entry's pages."""

    def __init__(self, segment: _Segment, info: WeightsInfo, start: int,
                 tensors: Iterable[Tensor], metadata: dict[str, str]) -> None:
        self._segment = segment
        self._bytes = np.frombuffer(segment, dtype=np.uint8)  # sliced, then viewed per tensor
        self.info = info
        self._start = start
        self.metadata = metadata
        self._tensors: dict[str, Tensor] = {t.name: t for t in tensors}
        self._arrays: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        where = "shared" if self.info.shared else "private"
        return (f"<Weights {self.info.name!r} {len(self._tensors)} tensors "
                f"{self.info.nbytes / 2**20:,.1f} MiB {where} entry={self.info.key[:12]}>")

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __getitem__(self, name: str) -> np.ndarray:
        array = self._arrays.get(name)
        if array is None:
            array = self._arrays[name] = self._array(self._tensors[name])
        return array

    def _array(self, tensor: Tensor) -> np.ndarray:
        numpy_dtype = DTYPES[tensor.dtype][1]
        if numpy_dtype is None:
            raise TypeError(f"tensor {tensor.name!r} is {tensor.dtype}, which numpy has no "
                            "type for: use .torch()")
        if tensor.begin == tensor.end:
            empty = np.empty(tensor.shape, dtype=numpy_dtype)
            empty.flags.writeable = False
            return empty
        start = self._start + tensor.begin
        view = self._bytes[start:start + tensor.nbytes].view(numpy_dtype)
        return view.reshape(tensor.shape)

    def dtype(self, name: str) -> str:
        """The tensor's safetensors dtype (F16, BF16, ...)."""
        return self._tensors[name].dtype

    def torch(self) -> dict[str, torch_types.Tensor]:
        """Every tensor as a torch tensor over the same read-only pages (torch.frombuffer;
        writing to one is a fault in this process, never a change to the entry)."""
        return {name: self.tensor(name) for name in self._tensors}

    def tensor(self, name: str) -> torch_types.Tensor:
        import torch

        tensor = self._tensors[name]
        dtype = _torch_dtype(torch, tensor.dtype)
        count = math.prod(tensor.shape)
        if count == 0:
            return torch.empty(tensor.shape, dtype=dtype)
        with warnings.catch_warnings():
            # "The given buffer is not writable": that is the point; see the docstring
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(self._segment, dtype=dtype, count=count,
                                    offset=self._start + tensor.begin)
        return flat.reshape(tensor.shape)


def _torch_dtype(torch: Any, dtype: str) -> Any:
    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
             "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
             "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
    found = getattr(torch, names[dtype], None)
    if found is None:
        raise TypeError(f"this torch ({torch.__version__}) has no type for {dtype}")
    return found


def _map(path: str) -> _Segment:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _Segment(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def load(name: str, source: str | os.PathLike[str]) -> Weights:
    """The tensors of `source` (a safetensors file, a directory of safetensors shards,
    or a numpy .npz), as `name`: from the node's weight store in a surge replica, else
    read into this process. Raises WeightSourceError (missing or malformed source),
    WeightBudgetError, WeightStoreFullError, WeightStoreUnavailableError."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"name must be a string of 1 to {MAX_NAME} characters, got {name!r}")
    started = SYSTEM.monotonic()
    path = os.path.abspath(os.fspath(source))
    store = current_store()
    if store is None:
        return _load_private(name, path, started)
    answer = store.load(name, path)
    entry = answer.entry
    try:
        segment = _map(entry.path)
    except OSError as exc:
        store.release(entry.key)
        raise WeightStoreUnavailableError(f"cannot map the entry {entry.path}: "
                                          f"{exc.strerror or exc}") from None
    weakref.finalize(segment, store.release, entry.key)
    if len(segment) < entry.nbytes:
        raise WeightStoreUnavailableError(f"the entry {entry.path} is shorter than the store "
                                          "says: not an entry of this store")
    return Weights(segment, _info(name, entry, answer.hit, started), entry.data_start,
                   entry.tensors, entry.metadata)


def _info(name: str, entry: p.EntryInfo, hit: bool, started: float) -> WeightsInfo:
    return WeightsInfo(name, entry.key, entry.source, entry.nbytes, True, hit, entry.path,
                       SYSTEM.monotonic() - started, 0.0 if hit else entry.materialise_s)


def _load_private(name: str, path: str, started: float) -> Weights:
    layout = plan(path)
    fd = os.memfd_create(f"surge-weights-{name}"[:200], os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, layout.nbytes)
        try:
            key = copy_and_hash(layout, Sink(fd, layout.nbytes), COPY_WORKERS)
        except OSError as exc:
            raise WeightSourceError(f"{path}: {exc.strerror or exc}") from None
        segment = _Segment(fd, layout.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    seconds = SYSTEM.monotonic() - started
    return Weights(segment, WeightsInfo(name, key, path, layout.nbytes, False, False, None,
                                        seconds, seconds), len(layout.header), layout.tensors,
                   layout.metadata)


async def load_async(name: str, source: str | os.PathLike[str]) -> Weights:
    """`load` from async code (a multiplexed model loader): the blocking part runs on a
    thread, so the replica's event loop keeps serving meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, load, name, source)


def stats() -> p.StoreStats | None:
    """What this node's store holds (None outside a replica with a store)."""
    store = current_store()
    return store.stats() if store is not None else None
