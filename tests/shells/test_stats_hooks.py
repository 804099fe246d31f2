"""replica.stats_hooks (Ray's load hooks called in the replica, bounded, never fatal) and
the optional methods a user class may define (`UserCode.defines`)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from surge.policy.engine_load import EngineReport
from surge.replica.stats_hooks import StatsHooks, engine_report, prefix_frame, routing_frame
from surge.replica.user_code import UserCode
from surge.transport.messages import PrefixHeld, RoutingStats
from tests.eventually import eventually_async


class Engine:
    def __init__(self) -> None:
        self.calls = 0
        self.mode = "ok"

    async def record_routing_stats(self) -> Any:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("engine gone")
        if self.mode == "hang":
            await asyncio.sleep(10)
        if self.mode == "junk":
            return [1, 2]
        return {"waiting": 3, "running": 5, "kv_cache_usage": 0.25, "aborted": 1}

    def record_autoscaling_stats(self) -> dict[str, float]:  # a plain def runs too
        return {"engine_waiting": 3.0, "engine_running": 5.0, "kv_cache_usage": 0.25}


class Caching:
    def record_routing_stats(self) -> dict[str, Any]:
        return {"waiting": 1, "kv_prefix": {"stored": [[7, 8]], "removed": [], "cleared": False}}


class Plain:
    def __call__(self) -> str:
        return "no hooks"


@pytest.mark.parametrize(("stats", "frame"), [
    ({"waiting": 3, "running": 5, "kv_cache_usage": 0.5}, RoutingStats(0, 8, 0.5, 0.25)),
    ({"num_requests_waiting": 2, "num_requests_running": 1}, RoutingStats(0, 3, -1.0, 0.25)),
    ({"running": 4.4}, RoutingStats(0, 4, -1.0, 0.25)),
    ({"queue_len": 7}, RoutingStats(0, 7, -1.0, 0.25)),
    ({"custom": "stat", "waiting": True}, RoutingStats(0, -1, -1.0, 0.25)),  # no number
])
def test_routing_frame(stats: dict[str, Any], frame: RoutingStats) -> None:
    assert routing_frame(stats, 0.25) == frame


def test_unusable_stats_raise() -> None:
    with pytest.raises(TypeError, match="expected a dict"):
        routing_frame([1], 1.0)
    assert prefix_frame({"waiting": 1}) is None
    assert prefix_frame({"kv_prefix": {"stored": [], "removed": [], "cleared": False}}) is None
    assert prefix_frame({"kv_prefix": {"stored": [[1, 2]], "removed": [3]}}) == \
        PrefixHeld(0, [[1, 2]], [3], False)
    assert prefix_frame({"kv_prefix": {"cleared": True}}) == PrefixHeld(0, cleared=True)
    with pytest.raises(TypeError, match="expected a dict"):
        engine_report(None, "r", 1.0)
    assert engine_report({"waiting": 2}, "r", 1.0) == EngineReport("r", 2.0, 0.0, 0.0, 1.0)


async def hooks_for(target: type, **kwargs: Any) -> tuple[StatsHooks, list[Any], list[Any]]:
    user = UserCode(target, (), {}, 4)
    await user.construct()
    frames: list[RoutingStats] = []
    reports: list[EngineReport] = []
    hooks = StatsHooks(user, "r-1", kwargs.get("period_s", 0.01),
                       kwargs.get("timeout_s", 0.05), frames.append, reports.append,
                       random.Random(0))
    return hooks, frames, reports


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def test_both_hooks_report_every_period() -> None:
    run(_both_hooks)


async def _both_hooks() -> None:
    hooks, frames, reports = await hooks_for(Engine)
    assert hooks.hooks == ["record_routing_stats", "record_autoscaling_stats"]
    hooks.start()
    await eventually_async(lambda: len(frames) >= 3 and len(reports) >= 3, 10,
                           what="three periods of both hooks")
    hooks.stop()
    assert len(frames) >= 3 and frames[-1] == RoutingStats(0, 8, 0.25, 0.01)
    assert len(reports) >= 3 and reports[-1] == EngineReport("r-1", 3.0, 5.0, 0.25, 0.01)
    assert "every 0.01s" in repr(hooks)


def test_an_engine_cache_change_follows_its_routing_stats() -> None:
    async def main() -> None:
        hooks, frames, _ = await hooks_for(Caching)
        assert await hooks.call("record_routing_stats")
        assert frames == [RoutingStats(0, 1, -1.0, 0.01), PrefixHeld(0, [[7, 8]])]

    run(main)


def test_a_class_without_hooks_starts_nothing() -> None:
    run(_no_hooks)


async def _no_hooks() -> None:
    hooks, _, _ = await hooks_for(Plain)
    hooks.start()
    assert hooks.hooks == [] and hooks._task is None
    hooks.stop()


def test_failures_are_logged_once_and_never_stop_the_loop(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "surge.replica")
    frames: list[Any] = []

    async def main() -> None:
        hooks, got, _ = await hooks_for(Engine)
        engine = hooks.user.servable
        for mode in ("raise", "junk", "hang", "raise"):
            engine.mode = mode
            assert await hooks.call("record_routing_stats") is False
        engine.mode = "ok"
        assert await hooks.call("record_routing_stats") is True
        frames.extend(got)

    run(main)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "engine gone" in warnings[0].getMessage()
    assert any("timed out after 0.05s" in r.getMessage() for r in caplog.records)
    assert frames == [RoutingStats(0, 8, 0.25, 0.01)]


class _WithCheck:
    def check_health(self) -> None: ...


class _NotCallable:
    check_health = 3


def test_which_user_code_defines_its_own_health_check() -> None:
    async def main() -> None:
        answers = []
        for target in (_WithCheck, _NotCallable, Plain, lambda request: request):
            user = UserCode(target, (), {}, 1)
            await user.construct()
            answers.append(user.defines("check_health"))
            assert await user.call_optional("check_health") is answers[-1]
        assert answers == [True, False, False, False]

    asyncio.run(main())
