"""Sizing an LLM deployment for p99 TTFT / TPOT objectives (policy/llm_objectives.py),
alone and through the proactive policy and the shared autoscaling step, on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from surge.config import AutoscalingConfig, Objectives, parse_objectives
from surge.errors import ConfigError
from surge.policy.autoscale_step import StepInputs, autoscale_step
from surge.policy.autoscaling import (
    DecisionKind,
    LoadSample,
    PolicyState,
    ProactiveSettings,
    ScalingInputs,
    proactive,
)
from surge.policy.engine_load import EngineLoad, EngineReport, engine_demand, fresh_load
from surge.policy.llm_objectives import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    RHO_MAX,
    RHO_MIN,
    Bound,
    max_decode_batch,
    objective_demand,
    prefill_utilization,
)

BOTH = Objectives(ttft_s=0.5, tpot_s=0.05)


def load(**kw: float) -> EngineLoad:
    base: dict[str, float] = {"replicas": 2, "waiting": 0, "running": 0,
                              "kv_cache_usage": 0.0}
    base.update(kw)
    return EngineLoad(int(base.pop("replicas")), **base)


@pytest.mark.parametrize(("ttft_s", "prefill_s", "rho"), [
    (0.5, 0.0, RHO_MAX),        # nothing to prefill: the ceiling
    (0.1, 0.1, RHO_MIN),        # a prompt alone takes the whole target: the floor
    (0.1, 0.2, RHO_MIN),        # ... or more
    (0.15, 0.1, RHO_MIN),       # k = 0.5: 2k/(1+2k) = 0.5
    (0.2, 0.1, 2 / 3),          # k = 1
    (0.3, 0.1, 0.8),            # k = 2
    (1.0, 0.1, RHO_MAX),        # k = 9: 18/19 capped at 0.9
])
def test_prefill_utilization_is_the_m_d_1_load_that_meets_the_target(
        ttft_s: float, prefill_s: float, rho: float) -> None:
    assert prefill_utilization(ttft_s, prefill_s) == pytest.approx(rho)


@pytest.mark.parametrize(("tpot_s", "step_s", "per_seq_s", "fallback", "batch"), [
    (0.05, 0.01, 0.0002, 256, 200.0),   # measured: (0.05 - 0.01) / 0.0002
    (0.05, 0.0, 0.0, 256, 256.0),       # not measured: the fallback
    (0.05, 0.0, 0.0, 0, 1.0),           # ... never below one sequence
    (0.005, 0.01, 0.0002, 256, 256.0),  # one sequence's step misses it: no batch meets
    (0.0104, 0.01, 0.0005, 8, 8.0),     # ... it, so the engine's own batch sizes
    (0.011, 0.01, 0.0005, 8, 2.0),      # two sequences a step meet it
    (0.1, 0.02, 0.002, 8, 8.0),         # fast steps fit 40, but the engine batches 8
    (0.1, 0.02, 0.002, 0, 40.0),        # ... unless its batch is not known
])
def test_the_decode_batch_that_meets_tpot(tpot_s: float, step_s: float, per_seq_s: float,
                                          fallback: float, batch: float) -> None:
    assert max_decode_batch(tpot_s, step_s, per_seq_s, fallback) == pytest.approx(batch)


def test_prefill_heavy_load_with_kv_near_30_percent_is_prefill_bound() -> None:
    # llm-d-autoscaling#662: long prompts, KV use ~30%, nothing waiting in the engine
    # (chunked prefill admits them all), the backlog growing. The KV and queue signals
    # see under one replica's worth; the backlog sees six.
    engines = load(replicas=2, running=40, waiting=0, kv_cache_usage=0.3,
                   prefill_backlog_tokens=60_000, prefill_tokens_per_s=20_000,
                   prompt_tokens=2_000, decode_step_s=0.01, decode_s_per_seq=0.0002)
    assert engine_demand(engines) == pytest.approx(0.75)
    demand = objective_demand(engines, BOTH, projected_rate=10,
                              fallback_batch=256)
    assert demand.bound is Bound.PREFILL
    assert demand.replicas == pytest.approx(60_000 / (20_000 * 0.5))
    assert demand.signals["kv_replicas"] == pytest.approx(0.75)
    assert "prefill-bound" in demand.reason


def test_the_prefill_flow_sizes_for_the_projected_rate() -> None:
    # 2,000-token prompts at 20,000 tokens/s: 0.1 s each, k = 4, rho = 8/9 -> 0.889;
    # 50 req/s projected x 2,000 tokens / (20,000 x 0.889) = 5.6 replicas
    engines = load(prefill_tokens_per_s=20_000, prompt_tokens=2_000)
    demand = objective_demand(engines, Objectives(ttft_s=0.5), projected_rate=50,
                              fallback_batch=256)
    assert demand.bound is Bound.PREFILL
    assert demand.signals["prefill_rho"] == pytest.approx(8 / 9)
    assert demand.replicas == pytest.approx(50 * 2_000 / (20_000 * 8 / 9))


def test_requests_queued_in_routers_count_in_the_backlog() -> None:
    engines = load(prefill_tokens_per_s=10_000, prompt_tokens=1_000)
    demand = objective_demand(engines, Objectives(ttft_s=1.0), projected_rate=0,
                              router_queued=30, fallback_batch=256)
    assert demand.replicas == pytest.approx(30 * 1_000 / 10_000)


def test_an_unreachable_tpot_sizes_at_the_engines_batch_and_says_so() -> None:
    # a 30 ms step + 1 ms a sequence: a 29 ms TPOT is missed by any batch, so 32
    # sequences need 1 replica at a batch of 32, not 32 replicas of one sequence each
    engines = load(replicas=1, running=32, decode_step_s=0.03, decode_s_per_seq=0.001)
    demand = objective_demand(engines, Objectives(tpot_s=0.029), projected_rate=0,
                              fallback_batch=32)
    assert demand.bound is Bound.DECODE and demand.replicas == pytest.approx(1.0)
    assert demand.signals["decode_tpot_reachable"] == 0.0
    assert "unreachable: one sequence's step takes 31.0 ms" in demand.reason
    met = objective_demand(engines, Objectives(tpot_s=0.062), projected_rate=0,
                           fallback_batch=32)
    assert met.replicas == pytest.approx(1.0) and "unreachable" not in met.reason
    assert met.signals["decode_tpot_reachable"] == 1.0


def test_an_unmeasured_prefill_rate_falls_back_to_the_default() -> None:
    engines = load(prefill_backlog_tokens=DEFAULT_PREFILL_TOKENS_PER_S)
    demand = objective_demand(engines, Objectives(ttft_s=0.25), projected_rate=0,
                              fallback_batch=256)
    assert demand.signals["prefill_tokens_per_s"] == DEFAULT_PREFILL_TOKENS_PER_S
    assert demand.replicas == pytest.approx(4.0)


def test_a_full_decode_batch_is_decode_bound_and_grows_by_what_is_ahead() -> None:
    engines = load(replicas=2, running=500, waiting=100, kv_cache_usage=0.5,
                   decode_step_s=0.01, decode_s_per_seq=0.0002)
    demand = objective_demand(engines, BOTH, projected_rate=150,
                              fallback_batch=256)
    assert demand.bound is Bound.DECODE
    # 600 sequences / 200 a replica: a faster rate alone does not multiply them
    assert demand.replicas == pytest.approx(3.0)
    assert "decode-bound" in demand.reason
    # 300 more a start-up lead from now (policy.autoscaling.llm_in_flight_ahead)
    ahead = objective_demand(engines, BOTH, projected_rate=150,
                             fallback_batch=256, margin=300.0)
    assert ahead.replicas == pytest.approx(4.5)
    assert ahead.signals["decode_sequences"] == pytest.approx(900.0)


def test_requests_queued_in_routers_decode_too() -> None:
    # 2 engines of 8 sequences, both full, and 16 more queued in the routers: 4 replicas
    demand = objective_demand(load(replicas=2, running=16, decode_step_s=0.02,
                                   decode_s_per_seq=0.002), Objectives(tpot_s=0.1),
                              projected_rate=1, router_queued=16, fallback_batch=8)
    assert (demand.bound, demand.replicas) == (Bound.DECODE, pytest.approx(4.0))


def test_an_unmeasured_decode_cost_sizes_by_target_ongoing_requests() -> None:
    demand = objective_demand(load(running=300), Objectives(tpot_s=0.05), projected_rate=0,
                              fallback_batch=100)
    assert (demand.bound, demand.replicas) == (Bound.DECODE, pytest.approx(3.0))


def test_a_full_kv_cache_is_kv_bound() -> None:
    demand = objective_demand(load(replicas=4, running=8, kv_cache_usage=0.96), BOTH,
                              projected_rate=1, fallback_batch=256)
    assert (demand.bound, demand.replicas) == (Bound.KV, pytest.approx(4.8))
    assert "KV-bound" in demand.reason


def test_no_load_is_bound_by_nothing() -> None:
    demand = objective_demand(load(), BOTH, projected_rate=0, fallback_batch=256)
    assert (demand.bound, demand.replicas, demand.reason) == (Bound.NONE, 0.0,
                                                              "no load on the engines")


def test_fresh_load_sums_the_backlog_and_averages_what_was_measured() -> None:
    reports = [
        EngineReport("a", 1, 10, 0.2, 0.25, at=10.0, prefill_backlog_tokens=500,
                     prefill_tokens_per_s=8_000, prompt_tokens=400, decode_step_s=0.01,
                     decode_s_per_seq=0.0002),
        EngineReport("b", 0, 5, 0.4, 0.25, at=10.0, prefill_backlog_tokens=1_500,
                     prefill_tokens_per_s=12_000, prompt_tokens=600),
        EngineReport("c", 0, 0, 0.0, 0.25, at=10.0),  # just started: nothing measured
    ]
    engines = fresh_load(reports, 10.1)
    assert engines == EngineLoad(3, 1, 15, pytest.approx(0.2), prefill_backlog_tokens=2_000,
                                 prefill_tokens_per_s=10_000, prompt_tokens=500,
                                 decode_step_s=0.01, decode_s_per_seq=0.0002)


# -- through the proactive policy, on a fake clock ---------------------------------------

def steady(now: float, rps: float, seconds: float = 2.0) -> list[LoadSample]:
    ticks = round(seconds / 0.1)
    return [LoadSample(t=round(now - seconds + 0.1 * (i + 1), 6), arrivals=rps / 10,
                       completions=rps / 10, rejections=0, queued=0, ongoing=rps * 0.5)
            for i in range(ticks)]


LLM = AutoscalingConfig(min_replicas=1, max_replicas=16, target_ongoing_requests=256,
                        upscale_delay_s=30.0, objectives={"ttft_ms": 500, "tpot_ms": 50})
PREFILL_HEAVY = load(replicas=2, running=40, waiting=0, kv_cache_usage=0.3,
                     prefill_backlog_tokens=60_000, prefill_tokens_per_s=20_000,
                     prompt_tokens=2_000, decode_step_s=0.01, decode_s_per_seq=0.0002)


@pytest.mark.parametrize(("config", "engines", "kind", "target"), [
    # objectives + engine reports: sized for TTFT, at once (6 > 2 x 1.2)
    (LLM, PREFILL_HEAVY, DecisionKind.UP_PREFILL, 6),
    # the same load without objectives: the levels (20 req/s x 0.5 s / 256, and the
    # engines' queue and KV signals) see no need: the scale-up is missed
    (AutoscalingConfig(min_replicas=1, max_replicas=16, target_ongoing_requests=256,
                       upscale_delay_s=30.0), PREFILL_HEAVY, DecisionKind.HOLD, 2),
    # objectives, no engine report yet: the levels decide
    (LLM, None, DecisionKind.HOLD, 2),
    # decode-bound: 900 sequences at 200 a replica
    (LLM, load(replicas=2, running=900, kv_cache_usage=0.5, decode_step_s=0.01,
               decode_s_per_seq=0.0002), DecisionKind.UP_DECODE, 5),
    # KV-bound
    (LLM, load(replicas=2, running=20, kv_cache_usage=1.0), DecisionKind.UP_KV, 3),
])
def test_proactive_sizes_for_the_objectives(config: AutoscalingConfig,
                                            engines: EngineLoad | None, kind: DecisionKind,
                                            target: int) -> None:
    now = 100.0
    inputs = ScalingInputs(now=now, running=2, target=2, samples=steady(now, 20.0),
                           engine_demand=engine_demand(engines), engine=engines)
    decision = proactive(inputs, config, PolicyState())
    assert (decision.kind, decision.target) == (kind, target)


def test_the_decode_demand_holds_the_in_flight_margin_and_its_headroom() -> None:
    # the proactive step passes llm_in_flight_ahead + llm_spread_sd x llm_in_flight_spread
    # on to the objectives' decode demand, as it sizes the levels
    now = 100.0
    engines = load(replicas=2, running=900, waiting=12, kv_cache_usage=0.5,
                   decode_step_s=0.01, decode_s_per_seq=0.0002)
    samples = [replace(s, queued=5.0) for s in steady(now, 20.0)]
    inputs = ScalingInputs(now=now, running=2, target=2, samples=samples,
                           engine_demand=engine_demand(engines), engine=engines)
    signals = proactive(inputs, LLM, PolicyState()).signals
    assert signals["in_flight_headroom"] > 0
    assert signals["decode_sequences"] == pytest.approx(
        900 + 12 + 5.0 + signals["in_flight_ahead"] + signals["in_flight_headroom"])


def test_a_small_objective_excess_goes_at_once_or_waits_a_configured_band() -> None:
    # 2.2 replicas' demand on a target of 2: an LLM deployment's surge band is 0 by
    # default (ProactiveSettings.llm_surge_threshold), so it goes at once; with a band of
    # 20% it waits upscale_delay_s as every proactive scale-up inside the band does
    config = AutoscalingConfig(min_replicas=1, max_replicas=16, target_ongoing_requests=256,
                               upscale_delay_s=1.0, objectives={"ttft_ms": 1000})
    engines = load(prefill_backlog_tokens=22_000, prefill_tokens_per_s=10_000,
                   prompt_tokens=1_000)
    at_once = proactive(ScalingInputs(now=100.0, running=2, target=2,
                                      samples=steady(100.0, 0.0), engine=engines),
                        config, PolicyState())
    assert (at_once.target, at_once.kind) == (3, DecisionKind.UP_PREFILL)
    banded = ProactiveSettings(llm_surge_threshold=0.2)
    state, kinds = PolicyState(), []
    for i in range(12):
        now = 100.0 + i / 10
        decision = proactive(ScalingInputs(now=now, running=2, target=2,
                                           samples=steady(now, 0.0), engine=engines),
                             config, state, banded)
        state = decision.state
        kinds.append((round(now, 1), decision.kind))
    assert kinds[0] == (100.0, DecisionKind.HOLD)
    assert kinds[9] == (100.9, DecisionKind.HOLD)
    assert kinds[10] == (101.0, DecisionKind.UP_PREFILL)


def test_an_arrival_step_is_sized_on_the_first_step_after_it() -> None:
    """A 10x step of arrivals at t=100: the step closing the first 0.1 s after it decides
    for the objectives (the engines' backlog has not even grown yet)."""
    engines = load(replicas=2, running=20, kv_cache_usage=0.1, prefill_tokens_per_s=20_000,
                   prompt_tokens=1_000, decode_step_s=0.01, decode_s_per_seq=0.0002)
    samples = steady(100.0, 10.0)
    state = PolicyState()
    decided = None
    for i in range(1, 6):
        now = round(100.0 + i / 10, 6)
        samples.append(LoadSample(t=now, arrivals=10.0, completions=1.0, rejections=0,
                                  queued=0, ongoing=10.0))
        step = autoscale_step(proactive, LLM, state, StepInputs(
            now=now, second_of_day=now, running=2, target=2, samples=samples,
            engine=engines))
        state = step.decision.state
        if step.decision.kind is not DecisionKind.HOLD:
            decided = (now, step.decision.kind, step.target)
            break
    # 40 req/s over the 0.3 s window, its slope projected over the 1 s lead: 89.1 req/s
    # x 1,000 tokens / (20,000 tokens/s x rho 0.9) = 4.95 replicas
    assert decided == (100.1, DecisionKind.UP_PREFILL, 5)


# -- the config -----------------------------------------------------------------------------

def test_objectives_parse_to_seconds() -> None:
    assert parse_objectives({"ttft_ms": 500, "tpot_ms": 40}) == Objectives(0.5, 0.04, True)
    assert parse_objectives({"tpot_ms": 40}) == Objectives(None, 0.04, False)  # no TTFT
    assert parse_objectives({"ttft_ms": 200, "shed": False}) == Objectives(0.2, None, False)
    assert LLM.latency_objectives == Objectives(0.5, 0.05, True)
    assert AutoscalingConfig().latency_objectives is None


@pytest.mark.parametrize(("objectives", "message"), [
    ({}, "states no objective"),
    ({"ttft_ms": 0}, "ttft_ms must be a number > 0"),
    ({"tpot_ms": -1}, "tpot_ms must be a number > 0"),
    ({"ttft_ms": "fast"}, "ttft_ms must be a number"),
    ({"ttft_ms": 500, "p99": True}, "p99"),
    ({"ttft_ms": 500, "shed": "yes"}, "shed must be true or false"),
    ([500, 50], "must be a mapping"),
])
def test_bad_objectives_are_config_errors(objectives: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AutoscalingConfig(objectives=objectives)  # type: ignore[arg-type]
