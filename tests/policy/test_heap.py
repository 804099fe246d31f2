"""policy.heap: when the controller freezes its heap out of the cyclic collector, and
when it thaws it."""

from __future__ import annotations

import pytest

from surge.policy.heap import SLOW_FULL_COLLECTION_S, THAW_BELOW, HeapStep, heap_step


@pytest.mark.parametrize(("full_s", "members", "frozen_for", "step", "why"), [
    (None, 10_000, None, HeapStep.KEEP, "no full collection since the last step"),
    (0.002, 10_000, None, HeapStep.KEEP, "a short one: nothing to gain"),
    (SLOW_FULL_COLLECTION_S, 500, None, HeapStep.FREEZE, "a slow one: freeze its survivors"),
    (0.2, 10_000, 5_000, HeapStep.FREEZE, "slow again with more members: freeze what came"),
    (None, 5_000, 10_000, HeapStep.KEEP, "half of the frozen members left: not below yet"),
    (None, 4_999, 10_000, HeapStep.THAW, "below half: thaw, the departed's cycles go"),
    (0.2, 4_999, 10_000, HeapStep.THAW, "thaw first: the next full collection frees them"),
    (0.002, 0, 10, HeapStep.THAW, "every member gone"),
])
def test_heap_step(full_s: float | None, members: int, frozen_for: int | None,
                   step: HeapStep, why: str) -> None:
    assert heap_step(full_s, members, frozen_for) is step, why


def test_the_thresholds_are_what_the_table_assumes() -> None:
    assert (SLOW_FULL_COLLECTION_S, THAW_BELOW) == (0.01, 0.5)
