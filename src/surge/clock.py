"""Time, in one place. Policies never read the clock: they take `now` as a parameter.

Every shell that needs the time (controller, autoscaler, recovery, observer, proxy,
router, load tester) is given a `Clock`: monotonic seconds for intervals and deadlines,
wall seconds for what people read, and the local time of day for daily schedules.
`SYSTEM` is the real one; `surge.testing.FakeClock` is the one tests move by hand.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM", "Clock", "SystemClock"]

DAY_S = 24 * 3600


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def second_of_day(self) -> float:
        """Seconds since local midnight (autoscaling schedules are in local time)."""
        ...


class SystemClock:
    """The real clock: monotonic seconds for intervals, wall seconds for display."""

    # The C functions themselves: they are read on the request path.
    monotonic = staticmethod(time.monotonic)
    wall = staticmethod(time.time)

    def second_of_day(self) -> float:
        local = time.localtime()
        return float(local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM = SystemClock()
