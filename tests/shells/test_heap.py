"""controller.heap.HeapKeeper on a fake collector and a FakeClock: full collections are
timed by the collector's callbacks, and each step freezes or thaws as policy.heap says."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from surge.config import AppSpec, DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller.controller import Controller
from surge.controller.heap import HeapKeeper
from surge.policy.heap import HeapStep
from surge.testing import FakeBackend, FakeClock, FakePeer
from tests.eventually import eventually_async


class FakeCollector:
    """The `gc` module's callbacks, freeze and unfreeze, by hand."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.callbacks: list[Callable[[Literal["start", "stop"], dict[str, int]], object]] = []
        self.frozen = 0  # objects frozen
        self.heap = 0  # objects not frozen
        self.calls: list[str] = []

    def collect(self, generation: int, seconds: float) -> None:
        for callback in list(self.callbacks):
            callback("start", {"generation": generation})
        self.clock.advance(seconds)
        for callback in list(self.callbacks):
            callback("stop", {"generation": generation, "collected": 0})

    def freeze(self) -> None:
        self.calls.append("freeze")
        self.frozen, self.heap = self.frozen + self.heap, 0

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.frozen, self.heap = 0, self.heap + self.frozen

    def get_freeze_count(self) -> int:
        return self.frozen


def test_a_slow_full_collection_freezes_the_heap_and_a_shrinking_one_thaws_it() -> None:
    clock = FakeClock(monotonic=100.0)
    collector = FakeCollector(clock)
    keeper = HeapKeeper(collector, clock)
    collector.heap = 300_000
    collector.collect(0, 0.05)  # young generations, however long, are not full ones
    collector.collect(1, 0.05)
    assert keeper.step(10_000) is HeapStep.KEEP and collector.calls == []
    collector.collect(2, 0.004)
    collector.collect(2, 0.15)  # the slowest since the last step counts
    collector.collect(2, 0.002)
    assert keeper.slowest_s is not None and round(keeper.slowest_s, 6) == 0.15
    assert keeper.step(10_000) is HeapStep.FREEZE
    assert (collector.calls, collector.frozen, keeper.frozen_for) == (["freeze"], 300_000,
                                                                      10_000)
    assert repr(keeper) == "<HeapKeeper frozen=300000 for=10000 slowest=None>"
    assert keeper.step(11_000) is HeapStep.KEEP  # no collection since: nothing new
    collector.heap = 20_000
    collector.collect(2, 0.02)
    assert keeper.step(9_000) is HeapStep.FREEZE
    assert (collector.frozen, keeper.frozen_for) == (320_000, 10_000)  # the most, kept
    assert keeper.step(5_000) is HeapStep.KEEP
    assert keeper.step(4_000) is HeapStep.THAW
    assert (collector.calls[-1], collector.frozen, keeper.frozen_for) == ("unfreeze", 0, None)
    keeper.close()
    assert collector.callbacks == []
    keeper.close()  # twice: nothing left to remove


def test_the_control_loop_steps_its_heap_keeper_with_its_members_after_a_tick() -> None:
    async def main() -> None:
        clock = FakeClock(monotonic=100.0)
        collector = FakeCollector(clock)
        keeper = HeapKeeper(collector, clock)
        controller = Controller("127.0.0.1:1", HTTPOptions(location="NoServer"),
                                FakeBackend(), clock=clock, heap=keeper)
        spec = DeploymentSpec(config=DeploymentConfig(name="Model", num_replicas=2),
                              target_blob=b"v1", init_blob=b"()")
        await controller.api.rpc_deploy(FakePeer("driver"), app=AppSpec(
            name="app", route_prefix="/", ingress="Model", deployments=(spec,)))
        collector.heap = 1_000
        collector.collect(2, 0.05)
        loop = asyncio.create_task(controller.run())
        try:
            await eventually_async(lambda: collector.calls == ["freeze"], 10,
                                   what="the heap frozen after the first tick")
        finally:
            controller.state.stopping = True
            await loop
        assert keeper.frozen_for == 2  # its two replicas, no router yet

    asyncio.run(main())
