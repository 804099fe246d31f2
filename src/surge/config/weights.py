"""Where a node's weight store keeps its entries, and how many bytes it may hold."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from surge.config.schema import from_mapping, require

__all__ = ["DEFAULT_WEIGHT_STORE_DIRECTORY", "WeightStoreOptions"]

# tmpfs on every Linux: pages there are shared by every process that maps them.
DEFAULT_WEIGHT_STORE_DIRECTORY = "/dev/shm"
# No budget given: half the directory's filesystem (a tmpfs defaults to half the RAM, so a
# quarter of the RAM), room for a few models while replicas keep theirs.
DEFAULT_BUDGET_FRACTION = 0.5


@dataclass(frozen=True, kw_only=True)
class WeightStoreOptions:
    """The node-local weight store (surge.weights): `serve.start(weight_store=...)`.

    `directory`: where entries live as files: a tmpfs (/dev/shm) or a hugetlbfs mount.
    `budget_bytes`: the most its entries may hold together (None: half the directory's
    filesystem); unreferenced entries are evicted least recently used first.
    `enabled=False`: no store; `weights.load` then reads into each process privately.
    """

    enabled: bool = True
    directory: str = DEFAULT_WEIGHT_STORE_DIRECTORY
    budget_bytes: int | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), f"enabled must be true or false, got "
                f"{self.enabled!r}.")
        require(isinstance(self.directory, str) and os.path.isabs(self.directory),
                f"directory must be an absolute path, got {self.directory!r}.")
        require(self.budget_bytes is None or (isinstance(self.budget_bytes, int)
                                              and not isinstance(self.budget_bytes, bool)
                                              and self.budget_bytes > 0),
                f"budget_bytes must be a positive integer or None, got "
                f"{self.budget_bytes!r}.")

    @classmethod
    def from_any(cls, value: WeightStoreOptions | Mapping[str, Any] | bool | None
                 ) -> WeightStoreOptions:
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(enabled=False)
        if isinstance(value, WeightStoreOptions):
            return value
        return from_mapping(cls, value, "weight_store")

    def budget_for(self, filesystem_bytes: int) -> int:
        """The budget on a filesystem of this size (the configured one, if any)."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        return max(1, int(filesystem_bytes * DEFAULT_BUDGET_FRACTION))
