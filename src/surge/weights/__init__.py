"""surge.weights: a node-local shared-memory weight store, so the Nth replica starts in
milliseconds.

    from surge import weights

    class Model:
        def __init__(self):
            self.w = weights.load("llama-8b", "/models/llama-8b")   # a dir of shards,
            self.proj = self.w["model.layers.0.mlp.up_proj.weight"]  # a .safetensors, .npz

The first `load` of a source on a node copies it once into the store's directory (a
tmpfs, /dev/shm by default, or a hugetlbfs mount) as a read-only entry named by its
content hash; every later `load` of it on that node, by any replica, maps that entry
read-only and returns zero-copy arrays in well under a millisecond. The store is a
process per node (`surge:weights`, started by the backend; replicas find its socket in
their spec), counts references per connection (a SIGKILLed replica gives its own back),
evicts unreferenced entries least recently used first under `budget_bytes`, and
unlinks its files when it exits, through its guardian when it is killed, and at the
next start when everything was. See docs/weights.md.
"""

from typing import TYPE_CHECKING, Any

from surge.config.weights import WeightStoreOptions
from surge.errors import (
    WeightBudgetError,
    WeightSourceError,
    WeightStoreError,
    WeightStoreFullError,
    WeightStoreUnavailableError,
)
from surge.weights.protocol import EntryStats, StoreStats

if TYPE_CHECKING:
    from surge.weights.api import Weights, WeightsInfo, load, load_async, stats

_API = ("Weights", "WeightsInfo", "load", "load_async", "stats")


def __getattr__(name: str) -> Any:
    # The API (and numpy) on first use: the store's own process never imports them.
    if name in _API:
        from surge.weights import api

        return getattr(api, name)
    raise AttributeError(f"module 'surge.weights' has no attribute {name!r}")


__all__ = [
    "EntryStats",
    "StoreStats",
    "WeightBudgetError",
    "WeightSourceError",
    "WeightStoreError",
    "WeightStoreFullError",
    "WeightStoreOptions",
    "WeightStoreUnavailableError",
    "Weights",
    "WeightsInfo",
    "load",
    "load_async",
    "stats",
]
