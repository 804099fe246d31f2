"""Time, in one place. Policies never read the clock: they take `now` as a parameter."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The real clock: monotonic seconds for intervals, wall seconds for display."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "SystemClock()"
