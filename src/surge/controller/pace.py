"""The control loop's own pace: how long each tick takes and how late it starts.

Every tick records its wall duration, the CPU it used (the controller thread's CPU
time, so a tick that lost its core to another process is told apart from one that
worked long) and its lag: how much later than asked the loop woke up for it, which
grows when pushes and RPCs keep the event loop busy between ticks. The last
`MAX_TICKS` ticks are kept; `since(t)` returns those that started after `t` (monotonic),
with the autoscaling decisions made since, for `loop_stats` (controller/api.py): what
`bench/control_scale.py` reads, and what an operator asks when the controller is slow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_TICKS", "LoopPace", "TickSample"]

MAX_TICKS = 36_000  # an hour of 0.1 s ticks; 4 floats each


@dataclass(frozen=True, slots=True)
class TickSample:
    at: float  # when it started (monotonic)
    wall_s: float
    cpu_s: float
    lag_s: float  # started this long after it was due


class LoopPace:
    def __init__(self) -> None:
        self.ticks: deque[TickSample] = deque(maxlen=MAX_TICKS)

    def __repr__(self) -> str:
        last = self.ticks[-1] if self.ticks else None
        return (f"<LoopPace ticks={len(self.ticks)} last="
                f"{f'{last.wall_s * 1e3:.2f}ms' if last else '-'}>")

    def record(self, sample: TickSample) -> None:
        self.ticks.append(sample)

    def since(self, t: float) -> list[TickSample]:
        found = []
        for sample in reversed(self.ticks):
            if sample.at <= t:
                break
            found.append(sample)
        found.reverse()
        return found

    def summary(self, t: float) -> dict[str, Any]:
        """The ticks since `t` as columns (cheap to pickle)."""
        ticks = self.since(t)
        return {"at": [s.at for s in ticks], "wall_s": [s.wall_s for s in ticks],
                "cpu_s": [s.cpu_s for s in ticks], "lag_s": [s.lag_s for s in ticks]}
