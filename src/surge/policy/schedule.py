"""Capacity floors on a daily schedule: raise min/standby replicas ahead of a known pulse.

A window is `{"start": "23:50", "end": "00:30", "min_replicas": 64, "standby_replicas":
16}` in the controller's local time; a window whose end is before its start crosses
midnight. Where windows overlap, the highest floor wins. `with_floors` is the config
the policy sees while a floor is in force (min_replicas raised, max_replicas with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from surge.config import AutoscalingConfig, ScheduleWindow

__all__ = ["Floors", "floors_at", "with_floors"]

_DAY_S = 24 * 3600


@dataclass(frozen=True)
class Floors:
    min_replicas: int
    standby_replicas: int


def floors_at(windows: Sequence[ScheduleWindow], second_of_day: float, min_replicas: int,
              standby_replicas: int) -> Floors:
    """The floors in force at `second_of_day` (local), given the configured baseline."""
    low, spare = min_replicas, standby_replicas
    for window in windows:
        if window.covers(second_of_day % _DAY_S):
            low = max(low, window.min_replicas or 0)
            spare = max(spare, window.standby_replicas or 0)
    return Floors(low, spare)


def with_floors(config: AutoscalingConfig, floors: Floors) -> AutoscalingConfig:
    """`config` with min_replicas raised to the floor (and max_replicas at least that)."""
    if floors.min_replicas <= config.min_replicas:
        return config
    return replace(config, min_replicas=floors.min_replicas,
                   max_replicas=max(config.max_replicas, floors.min_replicas))
