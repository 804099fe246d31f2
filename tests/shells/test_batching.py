"""@serve.batch on a real event loop: sizes, timeouts, and batches formed when a slot frees."""

from __future__ import annotations

import asyncio

import pytest

from surge.errors import ConfigError
from surge.replica.batching import batch
from tests.eventually import eventually_async


class Model:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.sizes: list[int] = []

    @batch(max_batch_size=4, batch_wait_timeout_s=0.001)
    async def infer(self, items: list[int]) -> list[int]:
        self.sizes.append(len(items))
        await asyncio.sleep(self.seconds)
        return [item * 10 for item in items]


def test_items_gathered_during_a_slow_batch_leave_together_when_it_ends() -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        model = Model(0.05)
        first = asyncio.ensure_future(model.infer(0))
        await eventually_async(lambda: model.sizes == [1], 5,
                               what="the first batch (one item) running")
        rest = [asyncio.ensure_future(model.infer(i)) for i in range(1, 11)]
        results = await asyncio.gather(first, *rest)
        return model.sizes, list(results)

    sizes, results = asyncio.run(scenario())
    assert results == [i * 10 for i in range(11)]
    # Ray would send a 1-item batch per timeout; surge fills the batches it can.
    assert sizes == [1, 4, 4, 2]


def test_a_lone_item_leaves_after_the_wait_timeout() -> None:
    async def scenario() -> list[int]:
        model = Model(0.0)
        assert await model.infer(7) == 70
        return model.sizes

    assert asyncio.run(scenario()) == [1]


def test_a_wrong_result_length_fails_every_caller() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=0.01)
    async def broken(items: list[int]) -> list[int]:
        return [1]

    async def scenario() -> list[BaseException | int]:
        return await asyncio.gather(broken(1), broken(2), return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, TypeError) for o in outcomes)
    assert "must return a list of 2 results" in str(outcomes[0])


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ConfigError, match="max_batch_size"):
        batch(max_batch_size=0)
    with pytest.raises(ConfigError, match="async"):
        batch(lambda items: items)
