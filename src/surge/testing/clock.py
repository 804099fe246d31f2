"""A clock that moves only when the test moves it."""

from __future__ import annotations

from surge.clock import DAY_S

__all__ = ["FakeClock"]


class FakeClock:
    """Monotonic and wall time advance together; the local time of day follows the wall
    clock with a fixed offset (`set_time_of_day` moves it without moving time)."""

    def __init__(self, monotonic: float = 1000.0, wall: float = 1_800_000_000.0,
                 time_of_day: float = 12 * 3600.0) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._offset = time_of_day - wall

    def __repr__(self) -> str:
        return f"FakeClock(monotonic={self._monotonic:.3f}, day={self.second_of_day():.3f})"

    def monotonic(self) -> float:
        return self._monotonic

    def wall(self) -> float:
        return self._wall

    def second_of_day(self) -> float:
        return (self._wall + self._offset) % DAY_S

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._monotonic += seconds
        self._wall += seconds

    def set_time_of_day(self, hours: int, minutes: int = 0, seconds: float = 0.0) -> None:
        self._offset = hours * 3600 + minutes * 60 + seconds - self._wall
