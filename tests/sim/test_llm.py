"""LLM scenarios: the `llm:` section's errors, determinism, and EngineModel's exact TTFT."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from surge.loadtest.traces import TraceRequest, write_burstgpt
from surge.sim import simulate
from surge.sim.engine import Simulation
from surge.sim.engine_model import EngineModel, EngineTiming
from surge.sim.llm_replica import prompt_tokens
from surge.sim.llm_report import direction_changes, replica_timeline
from surge.sim.scenario import Scenario, ScenarioError

TIMING = {"step_s": 0.01, "decode_s_per_seq": 0.001, "prefill_s_per_token": 0.0001,
          "max_num_seqs": 4, "max_num_batched_tokens": 256, "num_blocks": 512,
          "block_size": 16, "max_model_len": 2048, "request_s": 0.003}


def scenario(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "llm-small", "seed": 5,
        "cluster": {"nodes": 1, "replicas_per_node": 4, "startup_s": 2},
        "traffic": {"timeout_s": 60,
                    "schedule": [{"rps": 1.0, "for_s": 10}, {"rps": 6.0, "for_s": 20}]},
        "llm": {"engine": dict(TIMING), "trace": {"shape": "burstgpt"},
                "objectives": {"ttft_ms": 1000, "tpot_ms": 50}},
        "deployment": {"name": "LLM", "max_ongoing_requests": 8,
                       "autoscaling_config": {"min_replicas": 1, "max_replicas": 4,
                                              "target_ongoing_requests": 4}}}
    for key, value in changes.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


@pytest.mark.parametrize(("changes", "message"), [
    ({"llm.routing": "random"}, "llm.routing must be one of engine_score, round_robin"),
    ({"llm.engine.step_ms": 3}, "unknown key 'step_ms'"),
    ({"llm.engine.max_num_seqs": 0}, "max_num_seqs must be an integer >= 1"),
    ({"llm.trace": {"shape": "sharegpt"}}, "llm.trace.shape must be one of burstgpt"),
    ({"llm.trace": {"shape": "burstgpt", "file": "t.csv"}}, "give either shape"),
    ({"llm.trace": {}}, "give either shape"),
    ({"llm.trace": "burstgpt"}, "llm.trace must be a mapping"),
    ({"llm.objectives": {"ttft": 100}}, "Did you mean 'ttft_ms'"),
    ({"llm.objectives": {"ttft_ms": -1}}, "ttft_ms must be a number > 0"),
    ({"llm.report_interval_s": 1}, "unknown key 'report_interval_s'"),
    ({"llm.trace": {"shape": "burstgpt", "burstiness": 0}}, "burstiness must be a number > 0"),
    ({"llm.trace": {"file": "missing.csv"}}, "cannot read"),
    ({"multiplex": {"models": 4}}, "llm with multiplex is not modelled"),
])
def test_a_bad_llm_section_is_a_clear_config_error(changes: dict[str, Any], message: str,
                                                   tmp_path: Path) -> None:
    data = scenario(**changes)
    with pytest.raises(ScenarioError, match=r"llm-small\.yaml") as caught:
        Scenario.from_mapping(data, str(tmp_path / "llm-small.yaml"), tmp_path)
    assert message in str(caught.value)


def test_a_trace_file_gives_the_arrivals_and_must_fit_the_engine(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    write_burstgpt([TraceRequest(0.0, 100, 10), TraceRequest(2.5, 3000, 10)], trace)
    data = scenario(**{"llm.trace": {"file": "t.csv"}, "traffic.schedule": None})
    with pytest.raises(ScenarioError, match=r"request 1 \(3000 prompt \+ 10 output tokens\) "
                                            "does not fit the engine's max_model_len 2048"):
        Scenario.from_mapping(data, "s.yaml", tmp_path)
    write_burstgpt([TraceRequest(0.0, 100, 10), TraceRequest(2.5, 300, 10)], trace)
    loaded = Scenario.from_mapping(data, "s.yaml", tmp_path)
    assert loaded.llm is not None and [r.at_s for r in loaded.llm.requests] == [0.0, 2.5]
    assert loaded.traffic.schedule.duration_s == 3.0  # 1 s steps, as surge pulse makes them
    with pytest.raises(ScenarioError, match=r"llm\.trace\.file gives the arrivals"):
        Scenario.from_mapping(scenario(**{"llm.trace": {"file": "t.csv"}}), "s.yaml", tmp_path)


def test_a_shaped_trace_follows_the_schedule_and_fits_the_engine() -> None:
    loaded = Scenario.from_mapping(scenario())
    assert loaded.llm is not None
    times = [r.at_s for r in loaded.llm.requests]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 30
    before = sum(t < 10 for t in times)
    after = len(times) - before
    assert after > 4 * before  # 6 req/s for 20 s after 1 req/s for 10 s, bursty
    assert all(r.input_length + r.output_length <= 2048 for r in loaded.llm.requests)
    assert loaded.per_replica_rps > 0 and loaded.service.time_s.mean > 0


def _summary(data: dict[str, Any]) -> dict[str, Any]:
    run = simulate(Scenario.from_mapping(copy.deepcopy(data)))
    summary = dict(run.summary)
    return summary


def test_a_small_llm_scenario_runs_deterministically() -> None:
    first, again = _summary(scenario()), _summary(scenario())
    assert first == again
    llm = first["llm_sim"]
    assert llm["finished"] == first["ok"] > 0
    assert llm["ttft_ms"]["p50"] is not None and llm["tpot_ms"]["p99"] is not None
    assert llm["first_scale_up_s"] is not None  # 6x the rate: it scaled
    other = _summary(scenario(seed=6))
    assert other["llm_sim"]["ttft_ms"] != llm["ttft_ms"]


def test_one_request_sees_exactly_the_engine_models_ttft_and_last_token(
        tmp_path: Path) -> None:
    request = TraceRequest(0.0, 700, 5)  # 700 > 256: a prefill in three chunks
    write_burstgpt([request], tmp_path / "one.csv")
    data = scenario(**{"llm.trace": {"file": "one.csv"}, "traffic.schedule": None,
                       "deployment.autoscaling_config": None,
                       "deployment.num_replicas": 1})
    sim = Simulation(Scenario.from_mapping(data, "one.yaml", tmp_path)).run()
    assert sim.llm is not None
    [(arrived, ttft, tpot, _)] = sim.llm.finished

    model = EngineModel(EngineTiming(**TIMING))
    model.add("0", prompt_tokens(request, 0), request.output_length)
    now, first, last = TIMING["request_s"], None, None
    while not model.idle:
        out = model.step()
        now += out.duration_s
        if out.first and first is None:
            first = now
        if out.finished:
            last = now
    assert first is not None and last is not None
    assert arrived == 0.0
    assert ttft == first  # exact: the same steps, the same durations
    assert tpot == (last - first) / (request.output_length - 1)


def test_direction_changes_and_the_replica_timeline() -> None:
    from surge.loadtest.stats import ReplicaSample
    from surge.sim.engine import DecisionLog
    log = [DecisionLog(1, 1, 2, ""), DecisionLog(2, 2, 4, ""), DecisionLog(3, 4, 3, ""),
           DecisionLog(4, 3, 5, ""), DecisionLog(5, 5, 5, "")]
    assert direction_changes(log) == 2
    samples = [ReplicaSample(t + 0.05, 1 if t < 30 else 3, 0) for t in range(0, 60)]
    assert replica_timeline(samples, 60.0) == [1.0, 3.0]


def test_the_engines_reports_feed_the_autoscaling_step() -> None:
    sim = Simulation(Scenario.from_mapping(scenario()))
    assert sim.llm is not None and sim.engine_load == sim.llm.engine_load
    sim.run(until_s=14.0)  # 6 req/s for 4 s on what started as one replica
    load = sim.engine_load(sim.end_s)
    assert load is not None
    assert 1 <= load.replicas == sum(r.engine_report is not None for r in sim.llm.replicas)
    assert load.running > 0
    # the prefill rate the replicas' meters measured (as a real replica reports it), below
    # the nominal 1 / prefill_s_per_token by the steps' fixed cost and the decode steps
    # interleaved (0.35 of it here)
    measured = [r.meter.prefill_tokens_per_s for r in sim.llm.replicas
                if r.meter.prefill_tokens_per_s]
    assert measured and load.prefill_tokens_per_s == pytest.approx(
        sum(measured) / len(measured))
    assert 0 < load.prefill_tokens_per_s * TIMING["prefill_s_per_token"] < 1
    assert (load.decode_step_s, load.decode_s_per_seq) == (TIMING["step_s"],
                                                           TIMING["decode_s_per_seq"])
    assert load.prompt_tokens > 0
    assert sim.decisions and sim.decisions[0].target > sim.decisions[0].previous


def test_the_router_queues_and_refuses_as_policy_dispatch_decides(tmp_path: Path) -> None:
    """Bounded by time (max_queued_requests unset): the wait a request would have is the
    queue over in flight / service time, never less than one service time's worth."""
    write_burstgpt([TraceRequest(0.0, 50, 20)] * 10, tmp_path / "ten.csv")
    data = scenario(**{"llm.trace": {"file": "ten.csv"}, "traffic.schedule": None,
                       "deployment.autoscaling_config": None,
                       "deployment.num_replicas": 1, "deployment.max_ongoing_requests": 2,
                       "deployment.max_queue_wait_s": 0.1})
    sim = Simulation(Scenario.from_mapping(data, "ten.yaml", tmp_path)).run()
    # 2 in flight, room for 2 waiting (one service time at 2 / service per second), 6 refused
    assert sim.flow.totals == {"arrived": 10, "completed": 4, "rejected": 6, "timed_out": 0,
                               "shed": 0}


def test_a_jump_in_arrivals_is_decided_on_between_ticks(tmp_path: Path) -> None:
    """The router never queues while the engines have room: a jump in its arrivals
    (policy/arrival_jump.py) is its urgent report instead. 1,000-token prompts at 1 req/s
    evenly on 2 replicas (min_replicas: on the prefill rate the replicas measure, ~7,100
    tokens/s, a lone arrival read over 0.3 s already asks for more than one), then three
    4 ms apart at 20.0 s (the TTFT objective's flow at that rate wants 3.5 replicas): the
    decision comes 5 ms after the second (the urgent report's delay); with urgent
    decisions off, at a tick once the routers' reports show it."""
    times = [float(t) for t in range(20)] + [20.0, 20.004, 20.008]
    write_burstgpt([TraceRequest(t, 1000, 4) for t in times], tmp_path / "jump.csv")

    def first_up(urgent: bool, decision_s: float | None = None) -> tuple[float, int, str]:
        control: dict[str, Any] = {"urgent_decisions": urgent, "clock_offset_s": 0}
        if decision_s is not None:  # a measured decision time (control.decision_s)
            control["decision_s"] = decision_s
        data = scenario(**{"llm.trace": {"file": "jump.csv"}, "traffic.schedule": None,
                           "control": control,
                           "deployment.autoscaling_config.objectives": {"ttft_ms": 1000},
                           "deployment.autoscaling_config.min_replicas": 2})
        sim = Simulation(Scenario.from_mapping(data, "jump.yaml", tmp_path)).run()
        d = next(d for d in sim.decisions if d.target > d.previous)
        return round(d.t, 6), sim.counters.urgent_decisions, d.kind, d.target

    assert first_up(True) == (20.009, 1, "up_prefill", 4)
    assert first_up(False) == (20.2, 0, "up_prefill", 4)  # the tick after the report lag
    assert first_up(True, decision_s=0.05)[:2] == (20.054, 1)  # as the scenario measured it


# -- shed, do not fail (policy/llm_shedding.py at the simulated replicas) ---------------------


def _overload(tmp_path: Path, objectives: dict[str, Any] | None, warm: bool = True
              ) -> dict[str, Any]:
    """One replica (10,000 prefill tokens/s, a fixed budget): three lone 1,000-token
    prompts to measure its prefill rate (if `warm`), then 30 at once at 5 s: ~3 s of
    prefill against a 500 ms TTFT target."""
    times = ([0.0, 1.0, 2.0] if warm else []) + [5.0] * 30
    write_burstgpt([TraceRequest(t, 1000, 4) for t in times], tmp_path / "burst.csv")
    scaling: dict[str, Any] = {"min_replicas": 1, "max_replicas": 1,
                               "target_ongoing_requests": 4}
    if objectives is not None:
        scaling["objectives"] = objectives
    return scenario(**{"llm.trace": {"file": "burst.csv"}, "traffic.schedule": None,
                       "deployment.max_ongoing_requests": 64,
                       "deployment.autoscaling_config": scaling})


def _run(data: dict[str, Any], tmp_path: Path) -> Any:
    return simulate(Scenario.from_mapping(data, "burst.yaml", tmp_path))


def test_a_deployment_with_objectives_sheds_an_overload_without_them_it_queues(
        tmp_path: Path) -> None:
    shedding = _run(_overload(tmp_path, {"ttft_ms": 500}), tmp_path)
    llm, totals = shedding.summary["llm_sim"], shedding.simulation.flow.totals
    # the replica measured ~7,100 prefill tokens/s (1,000 tokens in four 256-token
    # chunks of 10 ms + 25.6 ms): admitted while backlog + prompt is within 80% of
    # 500 ms (2,840 tokens), 2 of the 30; the other 28 answered 429 at once, never queued
    assert llm["shedding"] == {"ttft_ms": 500.0}
    assert llm["shed"] == totals["shed"] == 28 and llm["served"] == totals["completed"] == 5
    assert totals["arrived"] == 33 and totals["rejected"] == totals["timed_out"] == 0
    assert llm["shed_pct"] == round(100 * 28 / 33, 2)
    assert shedding.summary["errors"]["429"] == 28  # as surge pulse counts a shed request
    assert llm["slo_attainment"] == round(5 / 33, 5) == llm["slo_attainment_of_answered"]
    assert llm["ttft_ms"]["p99"] < 500  # what it served met the objective
    # 8 in flight a replica: the router queues what its wait bound lets it (the rest
    # 503 at once), and sends each waiting one as a 429 frees a slot
    narrow = _overload(tmp_path, {"ttft_ms": 500})
    narrow["deployment"]["max_ongoing_requests"] = 8
    assert _run(narrow, tmp_path).simulation.flow.totals == {
        "arrived": 33, "completed": 5, "rejected": 14, "timed_out": 0, "shed": 14}

    queueing = _run(_overload(tmp_path, None), tmp_path).summary["llm_sim"]
    assert queueing["shedding"] is None and queueing["shed"] == 0
    assert queueing["served"] == 33 and queueing["ttft_ms"]["p99"] > 2500
    off = _run(_overload(tmp_path, {"ttft_ms": 500, "shed": False}), tmp_path)
    assert off.summary["llm_sim"]["shed"] == 0 and off.summary["llm_sim"]["served"] == 33
    tpot_only = _run(_overload(tmp_path, {"tpot_ms": 50}), tmp_path)  # nothing to shed by
    assert tpot_only.summary["llm_sim"]["shed"] == 0


def test_a_shed_is_tried_once_on_another_replica_as_the_router_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four fixed replicas at 8 req/s against a 500 ms TTFT: a request one replica sheds
    goes once to another (policy/dispatch.retry_shed, as router.py's _retry_shed), so
    its caller hears 429 only when two replicas shed it."""
    from surge.sim import llm_flow

    shed_by: dict[int, list[Any]] = {}  # request -> the replicas that shed it
    original = llm_flow.LLMFlow._shed

    def spy(self: Any, request: Any, replica: Any, now: float) -> None:
        shed_by.setdefault(request.index, []).append(replica)
        original(self, request, replica, now)

    monkeypatch.setattr(llm_flow.LLMFlow, "_shed", spy)
    timing = {"step_s": 0.01, "decode_s_per_seq": 0.0005, "prefill_s_per_token": 0.0001,
              "max_num_seqs": 16, "max_num_batched_tokens": 512, "num_blocks": 4096,
              "block_size": 16, "max_model_len": 4096, "request_s": 0.003}
    data = scenario(seed=7, **{"llm.engine": timing, "cluster.replicas_per_node": 4,
                               "traffic.schedule": [{"rps": 8.0, "for_s": 60}],
                               "deployment.max_ongoing_requests": 32,
                               "deployment.autoscaling_config": {
                                   "min_replicas": 4, "max_replicas": 4,
                                   "target_ongoing_requests": 16,
                                   "objectives": {"ttft_ms": 500}}})
    run = simulate(Scenario.from_mapping(data, "x.yaml", tmp_path))
    twice = [replicas for replicas in shed_by.values() if len(replicas) == 2]
    assert all(len(replicas) <= 2 for replicas in shed_by.values())
    assert twice and all(a is not b for a, b in twice)  # two replicas shed each of these
    llm = run.summary["llm_sim"]
    assert llm["shed"] == len(twice) < len(shed_by)  # the rest were served elsewhere
    assert llm["served"] + llm["shed"] == run.simulation.flow.totals["arrived"]


def test_a_replica_that_has_not_measured_its_prefill_rate_sheds_nothing(
        tmp_path: Path) -> None:
    """The 30 reach a fresh replica at once, before any report measured its prefill (the
    real rule: never before the replica measured): all admitted."""
    cold = _run(_overload(tmp_path, {"ttft_ms": 500}, warm=False), tmp_path)
    assert cold.summary["llm_sim"]["shed"] == 0 and cold.summary["llm_sim"]["served"] == 30


def test_the_simulated_replicas_admit_by_policy_llm_shedding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator calls the real replica's function (not a copy), with the replica's
    backlog, the prompt, its measured prefill rate and the TTFT target, and sheds
    exactly when it says so."""
    from surge.policy import llm_shedding
    from surge.sim import llm_flow

    assert llm_flow.shed_retry_after is llm_shedding.shed_retry_after
    calls: list[tuple[float, float, float, float, float | None]] = []

    def spy(backlog: float, prompt: float, rate: float, ttft_s: float) -> float | None:
        answer = llm_shedding.shed_retry_after(backlog, prompt, rate, ttft_s)
        calls.append((backlog, prompt, rate, ttft_s, answer))
        return answer

    monkeypatch.setattr(llm_flow, "shed_retry_after", spy)
    run = _run(_overload(tmp_path, {"ttft_ms": 500}), tmp_path)
    assert len(calls) == 33  # every request that reached an engine, once
    assert {(prompt, ttft) for _, prompt, _, ttft, _ in calls} == {(1000, 0.5)}
    assert calls[0][0] == 0 and calls[0][2] == 0  # the first: no backlog, not measured
    rates = {rate for _, _, rate, _, _ in calls[3:]}  # measured, below the nominal 10,000
    assert len(rates) == 1 and 7000 < rates.pop() < 7200  # (the steps' fixed cost)
    shed = [answer for *_, answer in calls if answer is not None]
    assert len(shed) == run.summary["llm_sim"]["shed"] == run.simulation.flow.totals["shed"] == 28

    monkeypatch.setattr(llm_flow, "shed_retry_after", lambda *_: None)  # admit all
    assert _run(_overload(tmp_path, {"ttft_ms": 500}), tmp_path).summary[
        "llm_sim"]["shed"] == 0


def test_the_flows_percentiles_are_interpolated_as_surge_pulse_reports_vllms_keys() -> None:
    """A simulated TTFT p50/p99 is computed as the real run's report computes it (numpy's
    linear interpolation, `vllm bench serve`'s), so bench/llm_sim_vs_real.py compares
    like with like: TTFTs of 10 and 20 ms have a median of 15 ms, not 10."""
    from types import SimpleNamespace

    from surge.sim.llm_flow import LLMFlow

    rows = [(0.0, 0.010, -1.0, True), (0.0, 0.020, -1.0, True), (9.0, 0.5, -1.0, True)]
    flow = SimpleNamespace(finished=rows)
    got = LLMFlow.percentiles(flow, 1, until=5.0)  # type: ignore[arg-type]
    assert got["p50"] == pytest.approx(15.0, rel=1e-3)
    assert got["p99"] == pytest.approx(19.9, rel=1e-3)
