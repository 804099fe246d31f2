"""Daily capacity floors: parsing and which floor is in force when."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.config import AutoscalingConfig, ScheduleWindow, parse_schedule
from surge.errors import ConfigError
from surge.policy.schedule import Floors, floors_at, with_floors

FESTIVAL = parse_schedule([{"start": "23:50", "end": "00:30", "min_replicas": 8,
                            "standby_replicas": 4}])


def at(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 3600 + int(minutes) * 60


@pytest.mark.parametrize(("when", "expected"), [
    ("23:49", Floors(1, 0)),
    ("23:50", Floors(8, 4)),
    ("00:00", Floors(8, 4)),
    ("00:29", Floors(8, 4)),
    ("00:30", Floors(1, 0)),
    ("12:00", Floors(1, 0)),
])
def test_window_across_midnight(when: str, expected: Floors) -> None:
    assert floors_at(FESTIVAL, at(when), 1, 0) == expected


def test_overlapping_windows_take_the_highest_floor_and_never_lower_the_baseline() -> None:
    windows = parse_schedule([
        {"start": "10:00", "end": "12:00", "min_replicas": 5},
        {"start": "11:00", "end": "13:00", "min_replicas": 3, "standby_replicas": 2},
    ])
    assert floors_at(windows, at("11:30"), 1, 0) == Floors(5, 2)
    assert floors_at(windows, at("12:30"), 1, 0) == Floors(3, 2)
    assert floors_at(windows, at("12:30"), 4, 3) == Floors(4, 3)
    assert floors_at(windows, at("09:00"), 2, 1) == Floors(2, 1)


def test_parsed_window_fields() -> None:
    [window] = parse_schedule([{"start": "01:02", "end": "03:04", "standby_replicas": 7}])
    assert window == ScheduleWindow(start_s=3720, end_s=11040, min_replicas=None,
                                    standby_replicas=7)


@pytest.mark.parametrize(("windows", "message"), [
    ([{"start": "25:00", "end": "01:00", "min_replicas": 1}], "schedule\\[0\\].start"),
    ([{"start": "10:00", "end": "10:60", "min_replicas": 1}], "schedule\\[0\\].end"),
    ([{"start": "10", "end": "11:00", "min_replicas": 1}], "time of day like '23:50'"),
    ([{"start": "10:00", "end": "10:00", "min_replicas": 1}], "is empty"),
    ([{"start": "10:00", "end": "11:00"}], "sets no floor"),
    ([{"start": "10:00", "end": "11:00", "min_replicas": -1}], "integer >= 0"),
    ([{"start": "10:00", "end": "11:00", "min_replicas": True}], "integer >= 0"),
    ([{"start": "10:00", "end": "11:00", "floor": 3}],
     "schedule\\[0\\]: unknown key 'floor'. Known keys: start, end, min_replicas"),
    (["10:00-11:00"], "must be a mapping"),
])
def test_bad_windows_are_rejected_with_the_field(windows: list[object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_schedule(windows)  # type: ignore[arg-type]


def test_autoscaling_config_validates_its_schedule() -> None:
    with pytest.raises(ConfigError, match="sets no floor"):
        AutoscalingConfig(schedule=[{"start": "10:00", "end": "11:00"}])  # type: ignore[arg-type]
    config = AutoscalingConfig(schedule=[{"start": "10:00", "end": "11:00", "min_replicas": 2}])  # type: ignore[arg-type]
    assert config.schedule_windows[0].min_replicas == 2


@given(st.integers(0, 24 * 3600 - 1), st.integers(0, 10), st.integers(0, 10))
def test_floors_never_go_below_the_baseline(second: int, low: int, spare: int) -> None:
    floors = floors_at(FESTIVAL, second, low, spare)
    assert floors.min_replicas >= low and floors.standby_replicas >= spare


def test_with_floors_raises_min_and_max_only_when_the_floor_is_higher() -> None:
    config = AutoscalingConfig(min_replicas=2, max_replicas=6, standby_replicas=1)
    assert with_floors(config, Floors(2, 5)) is config
    assert with_floors(config, Floors(1, 0)) is config
    raised = with_floors(config, Floors(4, 0))
    assert (raised.min_replicas, raised.max_replicas, raised.standby_replicas) == (4, 6, 1)
    above = with_floors(config, Floors(9, 0))
    assert (above.min_replicas, above.max_replicas) == (9, 9)
