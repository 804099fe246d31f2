"""Quantiles from histogram bucket deltas (observability/quantiles.py): table tests."""

from __future__ import annotations

import pytest

from surge.observability.quantiles import add_counts, bucket_delta, bucket_quantile

BOUNDS = (0.01, 0.02, 0.05, 0.1)  # four buckets and +Inf


@pytest.mark.parametrize(("counts", "q", "expected"), [
    ([0, 0, 0, 0, 0], 0.5, None),  # nothing counted
    ([], 0.5, None),
    ([10, 0, 0, 0, 0], 0.5, 0.005),  # the first bucket's lower bound is 0
    ([10, 0, 0, 0, 0], 1.0, 0.01),
    ([0, 4, 0, 0, 0], 0.5, 0.015),  # linear inside (0.01, 0.02]
    ([0, 4, 0, 0, 0], 0.25, 0.0125),
    ([5, 5, 0, 0, 0], 0.5, 0.01),  # the rank ends exactly at a bound
    ([5, 5, 0, 0, 0], 0.6, 0.012),
    ([0, 0, 0, 1, 99], 0.5, 0.1),  # in +Inf: the highest finite bound
    ([0, 0, 0, 100, 0], 0.99, 0.0995),
    ([98, 0, 0, 0, 2], 0.99, 0.1),
    ([98, 1, 0, 1, 0], 0.99, 0.02),  # p99 of 100 is the 99th: the top of (0.01, 0.02]
    ([0, 0, 2, 0, 0], 0.0, 0.02),  # q=0: the lower bound of the first counted bucket
])
def test_bucket_quantile(counts: list[int], q: float, expected: float | None) -> None:
    value = bucket_quantile(BOUNDS, counts, q)
    if expected is None:
        assert value is None
    else:
        assert value == pytest.approx(expected)


def test_bucket_quantile_without_finite_bounds() -> None:
    assert bucket_quantile((), [3], 0.5) is None


@pytest.mark.parametrize(("previous", "current", "expected"), [
    (None, [1, 2, 0], [1, 2, 0]),  # a new series: all of it is new
    ([1, 2, 0], [1, 2, 0], [0, 0, 0]),  # nothing happened
    ([1, 2, 0], [3, 2, 5], [2, 0, 5]),
    ([4, 2, 0], [1, 3, 0], [1, 3, 0]),  # went backwards: started over, count from zero
    ([1, 2], [1, 2, 0], [1, 2, 0]),  # other boundaries: as new
])
def test_bucket_delta(previous: list[int] | None, current: list[int],
                      expected: list[int]) -> None:
    assert bucket_delta(previous, current) == expected


def test_quantile_of_a_delta_sees_only_the_interval() -> None:
    before = [100, 0, 0, 0, 0]  # a hundred fast ones earlier
    after = [100, 0, 0, 10, 0]  # then ten in (0.05, 0.1]
    assert bucket_quantile(BOUNDS, after, 0.5) == pytest.approx(0.0055)
    assert bucket_quantile(BOUNDS, bucket_delta(before, after), 0.5) == pytest.approx(0.075)


@pytest.mark.parametrize(("into", "counts", "expected"), [
    ([], [1, 2], [1, 2]),
    ([1, 2], [3, 4], [4, 6]),
])
def test_add_counts(into: list[int], counts: list[int], expected: list[int]) -> None:
    assert add_counts(into, counts) == expected
