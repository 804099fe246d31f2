"""`@serve.batch`'s decisions on plain numbers (policy/batching.py): tables."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from surge.policy.batching import fill, next_deadline, oldest_ready


def sizes(*each: int) -> Callable[[int], int]:
    """size_of(n) for calls of these sizes: the first n summed."""
    return lambda n: sum(each[:n])


@pytest.mark.parametrize(("count", "limit", "expected"), [
    (0, 4, (0, False)),
    (3, 4, (3, False)),
    (4, 4, (4, True)),
    (9, 4, (4, True)),  # more wait than a batch takes
])
def test_fill_by_count(count: int, limit: int, expected: tuple[int, bool]) -> None:
    assert fill(count, limit, None) == expected


@pytest.mark.parametrize(("call_sizes", "limit", "expected"), [
    ((), 10, (0, False)),
    ((3, 3), 10, (2, False)),  # room left: not full
    ((3, 3, 4), 10, (3, True)),  # exactly the limit: full
    ((3, 3, 5, 1), 10, (2, True)),  # the third would go past: it starts the next batch
    ((12, 1), 10, (1, True)),  # a first call alone over the limit still goes
])
def test_fill_by_size(call_sizes: tuple[int, ...], limit: int,
                      expected: tuple[int, bool]) -> None:
    assert fill(len(call_sizes), limit, sizes(*call_sizes)) == expected


def test_fill_goes_on_from_the_last_measure() -> None:
    asked: list[int] = []

    def size_of(n: int) -> int:
        asked.append(n)
        return 2 * n

    assert fill(2, 10, size_of) == (2, False)
    assert fill(4, 10, size_of, head=2) == (4, False)  # two more arrived
    assert asked == [1, 2, 3, 4]  # the first two are not measured again
    assert fill(9, 10, size_of, head=4, full=True) == (4, True)  # full stays full
    assert asked == [1, 2, 3, 4]


@pytest.mark.parametrize(("groups", "now", "expected"), [
    ([], 5.0, None),
    ([(4.99, False)], 5.0, None),  # waiting for company until 5.09
    ([(4.9, False)], 5.0, 0),  # its wait is over
    ([(4.99, False), (4.98, True)], 5.0, 1),  # full: ready before its deadline
    ([(4.5, False), (4.2, False), (4.95, True)], 5.0, 1),  # the oldest ready
    ([(4.2, False), (4.2, True)], 5.0, 0),  # a tie: the first listed
])
def test_oldest_ready(groups: list[tuple[float, bool]], now: float,
                      expected: int | None) -> None:
    assert oldest_ready(groups, 0.1, now) == expected


@pytest.mark.parametrize(("firsts", "free", "expected"), [
    ([], True, None),
    ([4.95, 4.92], True, pytest.approx(5.02)),  # the earliest deadline
    ([4.5, 4.95], True, pytest.approx(4.6)),  # one past: at once, while a slot is free
    ([4.5, 4.95], False, pytest.approx(5.05)),  # every slot busy: past ones wait for it
    ([4.5], False, None),
])
def test_next_deadline(firsts: list[float], free: bool, expected: float | None) -> None:
    assert next_deadline(firsts, 0.1, 5.0, free) == expected
