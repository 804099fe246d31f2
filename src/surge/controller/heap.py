"""The controller process's heap: full collections watched, long-lived objects frozen.

`HeapKeeper` times every full collection of CPython's cyclic collector (a
`gc.callbacks` hook) and, after each tick, asks policy/heap.py whether to freeze what
the heap holds now or to thaw it; see there why (at 10,000 replicas a full collection
walked the whole heap for 100-300 ms inside a tick). Only the controller's process
entry point (controller/main.py) gives the controller one: a controller made inside
another process (tests) leaves that process's collector alone. The collector is a
parameter (`Collector`, the `gc` module by default) so tests drive it by hand.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Literal, Protocol

from surge.clock import SYSTEM, Clock
from surge.policy.heap import HeapStep, heap_step

__all__ = ["Collector", "HeapKeeper"]

log = logging.getLogger("surge.controller")

FULL = 2  # the oldest generation: a full collection


class Collector(Protocol):
    """What HeapKeeper uses of the `gc` module."""

    callbacks: list[Callable[[Literal["start", "stop"], dict[str, int]], object]]

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...

    def get_freeze_count(self) -> int: ...


class HeapKeeper:
    def __init__(self, collector: Collector = gc, clock: Clock = SYSTEM) -> None:
        self.collector = collector
        self.clock = clock
        self.frozen_for: int | None = None  # the most members served while frozen
        self.slowest_s: float | None = None  # the longest full collection since the step
        self._started = 0.0
        collector.callbacks.append(self._on_collection)

    def __repr__(self) -> str:
        return (f"<HeapKeeper frozen={self.collector.get_freeze_count()} "
                f"for={self.frozen_for} slowest={self.slowest_s}>")

    def close(self) -> None:
        if self._on_collection in self.collector.callbacks:
            self.collector.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: Literal["start", "stop"], info: dict[str, int]) -> None:
        if info.get("generation") != FULL:
            return
        if phase == "start":
            self._started = self.clock.monotonic()
        else:
            took = self.clock.monotonic() - self._started
            self.slowest_s = took if self.slowest_s is None else max(self.slowest_s, took)

    def step(self, members: int) -> HeapStep:
        """After a tick, with the members (replicas, routers) the controller serves now."""
        decision = heap_step(self.slowest_s, members, self.frozen_for)
        slowest, self.slowest_s = self.slowest_s, None
        if decision is HeapStep.FREEZE:
            self.collector.freeze()
            self.frozen_for = max(self.frozen_for or 0, members)
            log.debug("a full collection took %.0f ms: heap frozen at %d members",
                      (slowest or 0.0) * 1e3, members)
        elif decision is HeapStep.THAW:
            self.collector.unfreeze()
            log.debug("members down to %d of %s: heap thawed", members, self.frozen_for)
            self.frozen_for = None
        return decision
