"""policy.engine_load: the engines' waiting sequences and KV-cache use as replicas wanted,
and the autoscaling step that hands them to the proactive policy."""

from __future__ import annotations

import pytest

from surge.config import AutoscalingConfig
from surge.policy.autoscale_step import StepInputs, autoscale_step
from surge.policy.autoscaling import LoadSample, PolicyState, proactive, ray_default
from surge.policy.engine_load import (
    EngineLoad,
    EngineReport,
    engine_capacity,
    engine_demand,
    fresh_load,
)


def report(replica: str, waiting: float, running: float, kv: float, at: float,
           period: float = 0.25) -> EngineReport:
    return EngineReport(replica, waiting, running, kv, period, at)


@pytest.mark.parametrize(("load", "demand", "why"), [
    (None, 0.0, "no report: no signal"),
    (EngineLoad(0, 5, 5, 0.5), 0.0, "no replica reporting"),
    (EngineLoad(2, 0, 10, 0.4), 1.0, "nothing waits: KV pressure 2 x 0.4 / 0.8"),
    (EngineLoad(2, 16, 16, 0.5), 4.0, "as many waiting as running: twice the replicas"),
    (EngineLoad(1, 8, 32, 0.2), 1.25, "a quarter more"),
    (EngineLoad(2, 3, 0, 0.0), 3.0, "waiting, nothing running (a stalled engine): one more"),
    (EngineLoad(2, 0, 4, 0.96), 2.4, "KV nearly full before any queue: 2 x 0.96 / 0.8"),
    (EngineLoad(2, 1, 16, 0.96), 2.4, "the larger of the two terms"),
])
def test_engine_demand(load: EngineLoad | None, demand: float, why: str) -> None:
    assert engine_demand(load) == pytest.approx(demand), why


@pytest.mark.parametrize(("load", "demand", "why"), [
    (EngineLoad(1, 1, 3, 0.1), 0.5, "a request that arrived mid-step beside a half-empty "
                                    "batch: (3 + 1) / 8, not 1 x 4 / 3"),
    (EngineLoad(2, 1, 8, 0.1), 1.125, "one full engine and a new, idle one: 9 / 8, "
                                      "not 2 x 9 / 8 (the idle one runs nothing)"),
    (EngineLoad(1, 8, 8, 0.3), 2.0, "a full batch and as many waiting: twice"),
    (EngineLoad(2, 10, 10, 0.97), 4.0, "KV full at 5 sequences a replica: 20 / 5"),
    (EngineLoad(1, 4, 16, 0.9), 2.5, "KV full, running past the batch: never more than "
                                     "the batch a replica, 20 / 8"),
    (EngineLoad(2, 3, 0, 0.0), 0.375, "a stalled engine: its waiting over the batch"),
    (EngineLoad(2, 0, 16, 0.4), 1.0, "nothing waits: KV pressure only"),
])
def test_engine_demand_over_the_batch(load: EngineLoad, demand: float, why: str) -> None:
    assert engine_demand(load, batch=8) == pytest.approx(demand), why


def test_engine_capacity() -> None:
    assert engine_capacity(EngineLoad(2, 1, 6, 0.2), batch=8) == 8.0
    assert engine_capacity(EngineLoad(2, 1, 6, 0.85), batch=8) == 3.0  # KV-bound
    assert engine_capacity(EngineLoad(2, 1, 6, 0.2), batch=0) == 3.0  # batch unknown
    assert engine_demand(EngineLoad(2, 1, 0, 0.9), batch=8) == 3.0  # KV full, none runs
    assert engine_demand(EngineLoad(2, 1, 0, 0.0), batch=0) == 3.0  # stalled: one more


def test_engine_demand_without_a_kv_target() -> None:
    assert engine_demand(EngineLoad(2, 0, 4, 0.9), kv_target=0.0) == 0.0


def test_fresh_load_sums_the_fresh_reports() -> None:
    reports = [report("a", 4, 16, 0.5, at=10.0), report("b", 0, 8, 0.3, at=9.6),
               report("c", 99, 99, 1.0, at=9.0)]  # 1 s old at 4 per second: stale
    assert fresh_load(reports, now=10.0) == EngineLoad(2, 4, 24, pytest.approx(0.4))
    assert fresh_load(reports[2:], now=10.0) is None
    assert fresh_load([], now=0.0) is None
    slow = report("d", 1, 2, 0.1, at=0.0, period=10.0)  # Ray's period: 20 s of grace
    assert fresh_load([slow], now=20.0) == EngineLoad(1, 1, 2, 0.1)


CONFIG = AutoscalingConfig(min_replicas=1, max_replicas=10, target_ongoing_requests=16)


def quiet(now: float, ongoing: float) -> list[LoadSample]:
    """A steady trickle the rate alone sizes at one replica: `ongoing` in flight."""
    return [LoadSample(t=round(now - i / 10, 1), arrivals=1, completions=1, rejections=0,
                       queued=0, ongoing=ongoing) for i in range(20, -1, -1)]


def step(engine: EngineLoad | None, target: int = 2) -> tuple[int, float]:
    inputs = StepInputs(now=10.0, second_of_day=0.0, running=target, target=target,
                        samples=quiet(10.0, 20.0), engine=engine)
    decision = autoscale_step(proactive, CONFIG, PolicyState(), inputs).decision
    return decision.target, decision.signals["engine_demand"]


def test_the_step_scales_up_on_waiting_sequences_the_routers_cannot_see() -> None:
    # The routers see 20 requests in flight (~1.25 replicas at 16 each): a hold at 2.
    assert step(None) == (2, 0.0)
    # The engines run only 10 of them (their KV cache is full) and 10 wait.
    assert step(EngineLoad(2, 10, 10, 0.97)) == (4, pytest.approx(4.0))


def test_kv_pressure_holds_off_a_scale_down() -> None:
    inputs = StepInputs(now=10.0, second_of_day=0.0, running=4, target=4,
                        samples=quiet(10.0, 4.0), engine=EngineLoad(4, 0, 4, 0.7))
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=10, target_ongoing_requests=16,
                            downscale_delay_s=0.0)
    held = autoscale_step(proactive, cfg, PolicyState(), inputs).decision
    assert held.target == 4  # 4 x 0.7 / 0.8 = 3.5 replicas of KV: above the 0.7 band
    bare = autoscale_step(proactive, cfg, PolicyState(),
                          StepInputs(**{**inputs.__dict__, "engine": None})).decision
    assert bare.target < 4


def test_rays_default_policy_ignores_the_engine_signal() -> None:
    inputs = StepInputs(now=10.0, second_of_day=0.0, running=2, target=2,
                        samples=quiet(10.0, 20.0), engine=EngineLoad(2, 50, 10, 1.0))
    bare = StepInputs(**{**inputs.__dict__, "engine": None})
    assert (autoscale_step(ray_default, CONFIG, PolicyState(), inputs).decision.target
            == autoscale_step(ray_default, CONFIG, PolicyState(), bare).decision.target)
