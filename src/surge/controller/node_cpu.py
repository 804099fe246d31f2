"""The busy share of this node's CPU, all cores together, from /proc/stat (Linux).

The kernel counts, since boot, the time all CPUs spent in each mode (the aggregate
`cpu` line, in USER_HZ ticks). Each `ProcStatCpu()` call returns the share of the time
since the previous call that was not idle or waiting for I/O: 1.0 means every core was
busy. The first call, a machine without /proc/stat, or an unreadable line give None
(no reading: no saturation verdict). The controller calls it once a second
(`NODE_CPU_INTERVAL_S`): at 100 ticks a second per core, a second is fine enough.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["NODE_CPU_INTERVAL_S", "NodeCpu", "ProcStatCpu", "busy_share", "parse_cpu_line"]

NODE_CPU_INTERVAL_S = 1.0
# The busy share of the node's cores since the last call; None: not known.
NodeCpu = Callable[[], float | None]
# Fields of the aggregate line counted as time: user nice system idle iowait irq
# softirq steal (guest time is already inside user and nice).
_FIELDS = 8
_IDLE, _IOWAIT = 3, 4


def parse_cpu_line(text: str) -> tuple[int, int] | None:
    """(total, idle) ticks from /proc/stat's text, or None if its first line is not
    the aggregate `cpu` line."""
    first = text.split("\n", 1)[0].split()
    if len(first) < _FIELDS + 1 or first[0] != "cpu":
        return None
    try:
        ticks = [int(v) for v in first[1:_FIELDS + 1]]
    except ValueError:
        return None
    return sum(ticks), ticks[_IDLE] + ticks[_IOWAIT]


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The busy share between two readings (None when no time passed)."""
    total = after[0] - before[0]
    if total <= 0:
        return None
    idle = after[1] - before[1]
    return min(max((total - idle) / total, 0.0), 1.0)


class ProcStatCpu:
    """Reads /proc/stat (or `path`) at each call; the busy share since the last call."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._last: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"<ProcStatCpu {self.path} last={self._last}>"

    def __call__(self) -> float | None:
        try:
            with open(self.path) as file:
                reading = parse_cpu_line(file.read(4096))
        except OSError:
            reading = None
        before, self._last = self._last, reading
        if before is None or reading is None:
            return None
        return busy_share(before, reading)
