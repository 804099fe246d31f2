"""Autoscaling end to end: real replicas scale up under load and down without errors."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from surge import serve
from surge.api.instance import current
from surge.errors import BackPressureError
from surge.model import DeploymentStatusOverview
from tests.eventually import eventually, eventually_async

pytestmark = pytest.mark.e2e


def fixed_three(ctx: Any) -> tuple[int, dict[str, Any]]:
    """A Ray-style custom policy: always three replicas."""
    return 3, {"calls": ctx.policy_state.get("calls", 0) + 1}


@serve.deployment(max_ongoing_requests=2)
class Work:
    async def __call__(self, seconds: float = 0.05) -> str:
        await asyncio.sleep(seconds)
        return "ok"


def _deployment(app: str, name: str = "Work") -> DeploymentStatusOverview:
    return serve.status().applications[app].deployments[name]


def _replica_states(app: str) -> dict[str, str]:
    """{replica id: state} of the app's replicas, from the controller's table."""
    instance = current()
    assert instance is not None
    return {r["replica_id"]: r["state"] for r in instance.call("replicas", timeout=10)
            if r["app"] == app}


async def _drive(handle: Any, concurrency: int, seconds: float,
                 sleep_s: float = 0.05) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    stop = time.monotonic() + seconds  # the load's duration (the behaviour, not a wait)

    async def worker() -> None:
        while time.monotonic() < stop:
            try:
                await handle.remote(sleep_s)
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except BackPressureError:  # refused at once: back off a little, as a client
                outcomes["BackPressureError"] = outcomes.get("BackPressureError", 0) + 1
                await asyncio.sleep(0.05)
            except Exception as exc:
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return outcomes


def test_proactive_scales_up_within_a_second(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = Work.options(autoscaling_config={
        "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1}).bind()
    handle = serve.run(app, name="up", route_prefix=None)
    assert _deployment("up").replica_states == {"RUNNING": 1}
    outcomes = asyncio.run(_drive(handle, concurrency=12, seconds=2.5))
    # what would wait past max_queue_wait_s until the replicas come is refused at once
    assert set(outcomes) <= {"ok", "BackPressureError"} and outcomes["ok"] > 0, outcomes
    status = _deployment("up")
    assert status.target_replicas == 4
    assert status.replica_states.get("RUNNING") == 4
    serve.delete("up")


def test_scale_down_under_load_fails_no_request(surge_instance) -> None:  # type: ignore[no-untyped-def]
    # bounded by count only: a request refused while the load rises is not the point
    app = Work.options(max_queue_wait_s=None, autoscaling_config={
        "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1,
        "downscale_delay_s": 0.5}).bind()
    handle = serve.run(app, name="down", route_prefix=None)

    async def scenario() -> tuple[dict[str, int], dict[str, int]]:
        high = await _drive(handle, concurrency=12, seconds=2.0)
        low = await _drive(handle, concurrency=1, seconds=4.0)
        return high, low

    high, low = asyncio.run(scenario())
    assert set(high) == {"ok"} and set(low) == {"ok"}, (high, low)
    eventually(lambda: _deployment("down").replica_states == {"RUNNING": 1}, 10,
               what="scaled down to one RUNNING replica")
    serve.delete("down")


def test_min_replicas_zero_waits_for_a_cold_start(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = Work.options(autoscaling_config={"min_replicas": 0, "max_replicas": 2}).bind()
    handle = serve.run(app, name="zero", route_prefix=None)
    assert _deployment("zero").replica_states == {}
    assert handle.remote(0.0).result(timeout_s=20) == "ok"  # waited for the cold start
    assert _deployment("zero").replica_states.get("RUNNING") == 1
    serve.delete("zero")


def test_standby_replicas_take_traffic_at_once(surge_instance) -> None:  # type: ignore[no-untyped-def]
    # bounded by count only: on a loaded machine a queued request can outwait the 0.1 s
    # wait bound while the third replica starts, and such a refusal is not the point
    app = Work.options(max_queue_wait_s=None, autoscaling_config={
        "min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1,
        "standby_replicas": 1}).bind()
    handle = serve.run(app, name="standby", route_prefix=None)
    eventually(lambda: _deployment("standby").replica_states == {"RUNNING": 1, "STANDBY": 1},
               10, what="one RUNNING and one STANDBY replica")
    [standby] = [r for r, state in _replica_states("standby").items() if state == "STANDBY"]

    async def load_and_watch() -> None:
        task = asyncio.ensure_future(_drive(handle, concurrency=8, seconds=2.0))
        # At once: the standby replica itself is activated while the load lasts (no new
        # replica has to start first).
        await eventually_async(lambda: _replica_states("standby").get(standby) == "RUNNING",
                               2.0, interval_s=0.02, what=f"standby {standby} RUNNING")
        outcomes = await task
        assert set(outcomes) == {"ok"}, outcomes

    asyncio.run(load_and_watch())
    # The pool is refilled in the background.
    eventually(lambda: _deployment("standby").replica_states.get("STANDBY", 0) >= 1, 10,
               what="a new STANDBY replica")
    serve.delete("standby")


def test_custom_policy_by_import_path(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = Work.options(autoscaling_config={
        "min_replicas": 1, "max_replicas": 5, "upscale_delay_s": 0,
        "policy": {"policy_function": "tests.e2e.test_autoscaling:fixed_three"}}).bind()
    serve.run(app, name="custom", route_prefix=None)
    eventually(lambda: _deployment("custom").replica_states == {"RUNNING": 3}, 15,
               what="the custom policy's three RUNNING replicas")
    serve.delete("custom")


def test_ray_default_keeps_rays_delay(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = Work.options(max_queue_wait_s=None, autoscaling_config={
        "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 1,
        "policy": {"policy_function": "ray_default"}}).bind()
    handle = serve.run(app, name="raydefault", route_prefix=None)
    outcomes = asyncio.run(_drive(handle, concurrency=8, seconds=2.0))
    assert set(outcomes) == {"ok"}, outcomes
    # Ray waits upscale_delay_s=30 s and sees the load only after metrics_interval_s=10 s.
    assert _deployment("raydefault").target_replicas == 1
    serve.delete("raydefault")


def test_a_bad_policy_fails_the_deploy_with_a_clear_error(surge_instance) -> None:  # type: ignore[no-untyped-def]
    from surge.serve.exceptions import ConfigError

    app = Work.options(autoscaling_config={
        "policy": {"policy_function": "no_such_module:policy"}}).bind()
    with pytest.raises(ConfigError, match="cannot load autoscaling policy 'no_such_module"):
        serve.run(app, name="badpolicy", route_prefix=None)
    app = Work.options(autoscaling_config={
        "policy": {"policy_function": "proactive", "policy_kwargs": {"speed": 2}}}).bind()
    with pytest.raises(ConfigError, match="unknown proactive policy_kwargs \\['speed'\\]"):
        serve.run(app, name="badpolicy", route_prefix=None)
    assert "badpolicy" not in serve.status().applications
