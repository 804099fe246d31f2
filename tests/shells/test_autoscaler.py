"""The autoscaler shell: load reports summed per tick, policies resolved, decisions kept.

User policies are real modules written under tmp_path and imported by path, the way a
deployment's `policy_function: "module:attr"` is.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from surge.config import AutoscalingConfig
from surge.controller.autoscaler import Autoscaler, DecisionRecord, LoadTracker
from surge.errors import ConfigError
from surge.model import DeploymentId, LoadReport
from surge.policy.autoscale_step import StepInputs
from surge.policy.autoscaling import (
    DecisionKind,
    LoadSample,
    PolicyState,
    ProactiveSettings,
    ScalingInputs,
    proactive,
    ray_default,
)
from surge.policy.resolve import HISTORY_S, resolve_policy

DEP = DeploymentId("app", "model")
OTHER = DeploymentId("app", "other")
TICK_S = 0.1


def load(deployment: DeploymentId = DEP, arrivals: int = 0, completions: int = 0,
         rejections: int = 0, queued: int = 0, in_flight: int = 0) -> LoadReport:
    return LoadReport(deployment, arrivals, completions, rejections, queued, in_flight)


def last(tracker: LoadTracker, deployment: DeploymentId = DEP) -> LoadSample:
    return tracker.series[deployment][-1]


# -- LoadTracker -----------------------------------------------------------------------------


def test_counters_and_gauges_are_summed_over_sources() -> None:
    tracker = LoadTracker(TICK_S)
    tracker.report(1, load(arrivals=3, completions=2, rejections=1, queued=2, in_flight=4), 0.9)
    tracker.report(2, load(arrivals=4, completions=1, queued=3, in_flight=1), 0.9)
    tracker.report(1, load(arrivals=1, queued=5, in_flight=6), 0.95)  # newer gauges of 1
    tracker.close_bucket(1.0, [DEP])
    assert last(tracker) == LoadSample(t=1.0, arrivals=8, completions=3, rejections=1,
                                       queued=5 + 3, ongoing=6 + 1, duration_s=TICK_S)


def test_counters_restart_each_bucket_while_gauges_hold() -> None:
    tracker = LoadTracker(TICK_S)
    tracker.report(1, load(arrivals=5, queued=2, in_flight=3), 0.95)
    tracker.close_bucket(1.0, [DEP])
    tracker.close_bucket(1.1, [DEP])  # no report: nothing arrived, nothing changed
    assert last(tracker) == LoadSample(1.1, 0, 0, 0, queued=2, ongoing=3,
                                       duration_s=pytest.approx(TICK_S))
    assert [s.t for s in tracker.series[DEP]] == [1.0, 1.1]


def test_reports_less_often_than_every_tick_are_spread_and_a_late_tick_lasts_longer() -> None:
    # 1,000 routers report every 0.5 s: a report covers the time since the same
    # router's previous one (policy/load_spread.py), not the bucket it came in.
    tracker = LoadTracker(0.125)
    tracker.report_interval_s = 0.5
    tracker.report(1, load(arrivals=3, queued=1), 0.5)  # its first: lands whole
    tracker.close_bucket(0.5, [DEP])
    tracker.report(1, load(arrivals=40, completions=20, rejections=4, queued=2), 1.0)
    for now in (1.0, 1.125, 1.25, 1.5):  # the tick at 1.5 came late: two ticks long
        tracker.close_bucket(now, [DEP])
    assert list(tracker.series[DEP]) == [
        LoadSample(0.5, 3, 0, 0, queued=1, ongoing=0, duration_s=0.125),
        LoadSample(1.0, 0, 0, 0, queued=2, ongoing=0, duration_s=0.5),
        LoadSample(1.125, 10, 5, 1, queued=2, ongoing=0, duration_s=0.125),
        LoadSample(1.25, 10, 5, 1, queued=2, ongoing=0, duration_s=0.125),
        LoadSample(1.5, 20, 10, 2, queued=2, ongoing=0, duration_s=0.25)]
    tracker.forget_source(1)  # gone: its next connection's first report lands whole
    tracker.report(1, load(arrivals=7), 1.55)
    tracker.close_bucket(1.625, [DEP])
    assert last(tracker).arrivals == 7


def test_reports_read_after_a_stall_land_in_the_buckets_they_were_measured_in() -> None:
    # A router every 0.5 s at 40 req/s by its own clock (100 s behind this one); the
    # loop stalls from 2.0 to 3.25 s and its first tick after closes the stall's bucket
    # before it reads the two reports measured meanwhile: they are added to it (and the
    # next bucket reads 40/s, not the held reports on top of the next ones).
    tracker = LoadTracker(0.125)
    tracker.report_interval_s = 0.5
    for at in (1.5, 2.0):
        tracker.report(1, timed(20, at - 100, 0.5), at)
        tracker.close_bucket(at, [DEP])
    tracker.close_bucket(3.25, [DEP])
    assert last(tracker).arrivals == 20  # [2.0, 2.5) only: read before the stall
    tracker.report(1, timed(20, 2.5 - 100, 0.5), 3.25)
    tracker.report(1, timed(20, 3.0 - 100, 0.5), 3.25)
    tracker.close_bucket(3.375, [DEP])
    assert [(s.t, s.arrivals / s.duration_s) for s in tracker.series[DEP]][-2:] == [
        (3.25, 40.0), (3.375, 40.0)]


def timed(arrivals: int, measured_at: float, covers_s: float) -> LoadReport:
    return LoadReport(DEP, arrivals, 0, 0, 0, 0, measured_at=measured_at, covers_s=covers_s)


def test_a_disconnected_source_is_forgotten() -> None:
    tracker = LoadTracker(TICK_S)
    tracker.report(1, load(queued=2, in_flight=3), 0.9)
    tracker.report(1, load(OTHER, in_flight=7), 0.9)
    tracker.report(2, load(queued=1, in_flight=1), 0.9)
    tracker.forget_source(1)
    tracker.forget_source(99)  # unknown: nothing happens
    tracker.close_bucket(1.0, [DEP, OTHER])
    assert (last(tracker).queued, last(tracker).ongoing) == (1, 1)
    assert (last(tracker, OTHER).queued, last(tracker, OTHER).ongoing) == (0, 0)


def test_deployments_are_tracked_separately() -> None:
    tracker = LoadTracker(TICK_S)
    tracker.report(1, load(DEP, arrivals=2), 0.9)
    tracker.report(1, load(OTHER, arrivals=9), 0.9)
    tracker.close_bucket(1.0, [DEP])  # OTHER's counters wait for its own bucket
    assert last(tracker).arrivals == 2
    assert OTHER not in tracker.series
    tracker.close_bucket(1.1, [DEP, OTHER])
    assert (last(tracker).arrivals, last(tracker, OTHER).arrivals) == (0, 9)


def test_history_is_bounded_and_drop_forgets_everything() -> None:
    tracker = LoadTracker(TICK_S)
    buckets = round(HISTORY_S / TICK_S)
    for i in range(buckets + 5):
        tracker.report(1, load(arrivals=i, queued=1), i / 10)
        tracker.close_bucket(i / 10, [DEP])
    assert len(tracker.series[DEP]) == buckets
    assert tracker.series[DEP][0].arrivals == 5
    tracker.report(1, load(arrivals=4, queued=2, in_flight=3), 98.9)
    tracker.drop(DEP)
    assert DEP not in tracker.series
    tracker.close_bucket(99.0, [DEP])
    assert last(tracker) == LoadSample(99.0, 0, 0, 0, 0, 0, duration_s=TICK_S)


# -- resolve_policy ----------------------------------------------------------------------------

USER_POLICIES = '''
CALLS = []
INSTANCES = []
NOT_CALLABLE = 3


def fixed_three(ctx):
    CALLS.append(ctx)
    return 3, {"seen": ctx.deployment_name + "@" + ctx.app_name}


def scaled(ctx, factor=1, floor=0):
    return max(floor, ctx.total_num_requests * factor), {}


def broken(ctx):
    raise RuntimeError("policy bug")


def broken_after_first(ctx):
    CALLS.append(ctx)
    if len(CALLS) > 1:
        raise RuntimeError("policy bug")
    return 5, {"first": True}


class Stepper:
    def __init__(self, step=1, limit=100):
        INSTANCES.append(self)
        self.step, self.limit, self.calls = step, limit, 0

    def __call__(self, ctx):
        self.calls += 1
        return min(self.limit, ctx.target_num_replicas + self.step), {"calls": self.calls}
'''
_names = itertools.count()


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fresh user-policy module on sys.path; yields the imported module."""
    name = f"surge_test_user_policies_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_POLICIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    yield module
    sys.modules.pop(name, None)


def spec(function: Any, **kwargs: Any) -> AutoscalingConfig:
    policy: dict[str, Any] = {"policy_function": function}
    if kwargs:
        policy["policy_kwargs"] = kwargs
    return AutoscalingConfig(min_replicas=1, max_replicas=10, upscale_delay_s=0.0,
                             downscale_delay_s=0.0, policy=policy)


def inputs(now: float = 30.0, running: int = 2, target: int = 2,
           ongoing: float = 8.0) -> ScalingInputs:
    """`ongoing` requests in flight for the last 40 s: Ray's mean reads exactly that."""
    end = round(now * 10)
    samples = [LoadSample(i / 10, 50, 50, 0, 0, ongoing) for i in range(end - 399, end + 1)]
    return ScalingInputs(now, running, target, samples)


def test_the_default_policy_is_proactive() -> None:
    policy = resolve_policy(AutoscalingConfig(max_replicas=10), DEP)
    cfg = AutoscalingConfig(max_replicas=10)
    assert policy(inputs(), cfg, PolicyState()) == proactive(inputs(), cfg, PolicyState())
    for empty in ({}, {"policy_function": None}, {"policy_function": ""}):
        cfg = AutoscalingConfig(max_replicas=10, policy=empty)
        assert resolve_policy(cfg, DEP)(inputs(), cfg, PolicyState()) == proactive(
            inputs(), cfg, PolicyState())


def test_proactive_by_name_with_policy_kwargs() -> None:
    cfg = spec("proactive", max_step_factor=1.5)
    decision = resolve_policy(cfg, DEP)(inputs(ongoing=100.0), cfg, PolicyState())
    # 100 in flight / 2 per replica = 50 wanted; capped at ceil(2 x 1.5) = 3.
    assert decision.target == 3
    assert decision == proactive(inputs(ongoing=100.0), cfg, PolicyState(),
                                 ProactiveSettings(max_step_factor=1.5))


def test_unknown_proactive_kwargs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown proactive policy_kwargs \['max_steps'\]"):
        resolve_policy(spec("proactive", max_steps=2), DEP)


def test_ray_default_by_name() -> None:
    assert resolve_policy(spec("ray_default"), DEP) is ray_default


def test_user_function_by_import_path(user_module: Any) -> None:
    cfg = spec(f"{user_module.__name__}:fixed_three")
    decision = resolve_policy(cfg, DEP)(inputs(), cfg, PolicyState())
    assert (decision.target, decision.reason) == (3, "up: custom policy wants 3")
    assert decision.state.user == {"seen": "model@app"}
    assert user_module.CALLS[0].total_num_requests == 8.0


def test_user_function_gets_policy_kwargs(user_module: Any) -> None:
    cfg = spec(f"{user_module.__name__}:scaled", factor=0.5, floor=1)
    policy = resolve_policy(cfg, DEP)
    assert policy(inputs(ongoing=8.0), cfg, PolicyState()).target == 4  # 8 x 0.5
    assert policy(inputs(ongoing=0.0), cfg, PolicyState()).target == 1


def test_user_class_is_instantiated_once_with_policy_kwargs(user_module: Any) -> None:
    cfg = spec(f"{user_module.__name__}:Stepper", step=3, limit=7)
    policy = resolve_policy(cfg, DEP)
    assert len(user_module.INSTANCES) == 1
    assert policy(inputs(target=2), cfg, PolicyState()).target == 5
    second = policy(inputs(target=5, running=5), cfg, PolicyState())
    assert (second.target, second.state.user) == (7, {"calls": 2})
    assert len(user_module.INSTANCES) == 1


def test_callables_and_classes_are_accepted_directly(user_module: Any) -> None:
    cfg = spec(user_module.fixed_three)
    assert resolve_policy(cfg, DEP)(inputs(), cfg, PolicyState()).target == 3
    cfg = spec(user_module.Stepper, step=2)
    assert resolve_policy(cfg, DEP)(inputs(target=2), cfg, PolicyState()).target == 4
    assert user_module.INSTANCES[-1].step == 2


@pytest.mark.parametrize(("function", "message"), [
    ("proactiv", "autoscaling policy 'proactiv' is neither a built-in ('proactive', "
                 "'ray_default') nor a 'module:attribute' path"),
    ("surge_no_such_module_xyz:policy", "cannot load autoscaling policy "
                                        "'surge_no_such_module_xyz:policy': No module named"),
    ("{module}:missing", "cannot load autoscaling policy '{module}:missing': module"),
    ("{module}:NOT_CALLABLE", "autoscaling policy '{module}:NOT_CALLABLE' is not callable"),
    (42, "autoscaling policy 42 is not callable"),
])
def test_bad_policies_raise_config_error_naming_them(user_module: Any, function: Any,
                                                     message: str) -> None:
    if isinstance(function, str):
        function = function.format(module=user_module.__name__)
    with pytest.raises(ConfigError) as raised:
        resolve_policy(spec(function), DEP)
    assert str(raised.value).startswith(message.format(module=user_module.__name__))


# -- Autoscaler.step -----------------------------------------------------------------------


def decide(autoscaler: Autoscaler, deployment: DeploymentId, cfg: AutoscalingConfig,
           scaling: ScalingInputs) -> int:
    """One step at noon (no schedule in these configs); the new target."""
    step = autoscaler.step(deployment, cfg, StepInputs(
        scaling.now, 12 * 3600.0, scaling.running, scaling.target, scaling.samples,
        scaling.startup_lead_s))
    return step.target


def test_decide_records_a_change_and_nothing_else(user_module: Any) -> None:
    autoscaler = Autoscaler()
    cfg = spec(f"{user_module.__name__}:fixed_three")
    assert decide(autoscaler, DEP, cfg, inputs(now=30.0)) == 3
    assert list(autoscaler.decisions) == [DecisionRecord(
        at=30.0, deployment=DEP, previous=2, target=3, kind=DecisionKind.UP,
        reason="up: custom policy wants 3", signals={})]
    assert autoscaler.last[DEP].target == 3
    assert decide(autoscaler, DEP, cfg, inputs(now=30.1, running=3, target=3)) == 3
    assert len(autoscaler.decisions) == 1
    assert autoscaler.last[DEP].reason == "hold: custom policy wants 3"


def test_decide_keeps_the_policy_state_between_ticks() -> None:
    autoscaler = Autoscaler()
    cfg = AutoscalingConfig(max_replicas=10, upscale_delay_s=30.0,
                            policy={"policy_function": "ray_default"})
    # 8 requests / 2 per replica: 4 wanted; Ray waits 30 s from the first up decision.
    assert decide(autoscaler, DEP, cfg, inputs(now=30.0)) == 2
    assert autoscaler.states[DEP].up_since == 30.0
    assert decide(autoscaler, DEP, cfg, inputs(now=59.9)) == 2
    assert decide(autoscaler, DEP, cfg, inputs(now=60.0)) == 4
    record = autoscaler.decisions[-1]
    assert (record.at, record.previous, record.target) == (60.0, 2, 4)
    assert record.signals == {"total_requests": 8.0, "desired": 4.0}
    assert autoscaler.states[DEP] == PolicyState()
    autoscaler.forget(DEP)
    assert (autoscaler.states, autoscaler.policies, autoscaler.last) == ({}, {}, {})


def test_a_raising_user_policy_keeps_the_old_target_and_state(
        user_module: Any, caplog: pytest.LogCaptureFixture) -> None:
    autoscaler = Autoscaler()
    cfg = spec(f"{user_module.__name__}:broken_after_first")
    assert decide(autoscaler, DEP, cfg, inputs(now=30.0)) == 5
    state, decision = autoscaler.states[DEP], autoscaler.last[DEP]
    with caplog.at_level(logging.ERROR, logger="surge.autoscaler"):
        assert decide(autoscaler, DEP, cfg, inputs(now=30.1, running=5, target=5)) == 5
    assert "autoscaling policy of app#model: policy failed: RuntimeError('policy bug'); " \
           "keeping 5 replicas" in caplog.text
    assert autoscaler.states[DEP] is state
    assert autoscaler.last[DEP] is decision
    assert len(autoscaler.decisions) == 1


def test_a_policy_that_always_raises_never_moves_the_target(user_module: Any) -> None:
    autoscaler = Autoscaler()
    cfg = spec(f"{user_module.__name__}:broken")
    assert [decide(autoscaler, DEP, cfg, inputs(now=30.0 + i / 10, target=t))
            for i, t in enumerate((1, 2, 7))] == [1, 2, 7]
    assert list(autoscaler.decisions) == []
    assert DEP not in autoscaler.states


def test_policies_are_resolved_once_per_policy_spec(user_module: Any) -> None:
    autoscaler = Autoscaler()
    cfg = spec(f"{user_module.__name__}:Stepper")
    for i in range(3):
        decide(autoscaler, DEP, cfg, inputs(now=30.0 + i / 10))
    assert len(user_module.INSTANCES) == 1
    assert user_module.INSTANCES[0].calls == 3
    # A config that differs elsewhere (a schedule floor raising min_replicas) keeps it...
    raised = dataclasses.replace(cfg, min_replicas=3)
    assert decide(autoscaler, DEP, raised, inputs(now=31.0, running=1, target=1)) == 3
    assert (len(user_module.INSTANCES), user_module.INSTANCES[0].calls) == (1, 4)
    # ... a new policy spec (a redeploy) resolves it again; each deployment has its own.
    decide(autoscaler, DEP, spec(f"{user_module.__name__}:Stepper", step=2), inputs(now=31.1))
    decide(autoscaler, OTHER, cfg, inputs(now=31.1))
    assert [i.step for i in user_module.INSTANCES] == [1, 2, 1]


def test_peek_reads_the_open_bucket_without_closing_it() -> None:
    from surge.controller.autoscaler import LoadTracker
    from surge.model import DeploymentId, LoadReport

    tracker = LoadTracker(0.1)
    dep = DeploymentId("app", "d")
    tracker.close_bucket(1.0, [dep])
    tracker.report(1, LoadReport(dep, arrivals=8, completions=2, rejections=1, queued=5,
                                 in_flight=3), 1.001)
    assert tracker.peek(dep, 1.002) is None  # too young to say anything
    sample = tracker.peek(dep, 1.04)
    assert sample is not None
    assert (sample.arrivals, sample.completions, sample.rejections) == (8, 2, 1)
    assert (sample.queued, sample.ongoing) == (5, 3)
    assert abs(sample.duration_s - 0.04) < 1e-9
    tracker.close_bucket(1.1, [dep])
    assert tracker.series[dep][-1].arrivals == 8  # the peek consumed nothing


def test_a_policy_that_cannot_be_built_is_a_failed_decision(user_module: Any) -> None:
    autoscaler = Autoscaler()
    cfg = spec(f"{user_module.__name__}:NOT_CALLABLE")  # a deploy refuses it; a step too
    step = autoscaler.step(DEP, cfg, StepInputs(30.0, 0.0, 2, 2, inputs().samples))
    assert step.failed and step.target == 2
    assert "is not callable" in step.decision.reason


def test_engine_tracker_keeps_the_latest_report_per_replica_and_forgets_the_silent() -> None:
    from surge.controller.engine_load import FORGET_S, EngineTracker
    from surge.policy.engine_load import EngineLoad, EngineReport

    tracker, did = EngineTracker(), DeploymentId("app", "llm")
    assert tracker.load(did, 0.0) is None
    tracker.report(did, EngineReport("r1", 9, 1, 0.5, 0.25), now=10.0)
    tracker.report(did, EngineReport("r1", 2, 4, 0.5, 0.25), now=10.2)  # replaces
    tracker.report(did, EngineReport("r2", 0, 4, 0.3, 0.25), now=10.2)
    assert tracker.load(did, 10.3) == EngineLoad(2, 2, 8, pytest.approx(0.4))
    assert tracker.load(did, 11.0) is None  # stale, still remembered
    assert tracker.load(did, 10.2 + FORGET_S + 1) is None
    assert repr(tracker) == "<EngineTracker deployments=1>"
    assert tracker._reports[did] == {}  # forgotten
    tracker.drop(did)
    assert repr(tracker) == "<EngineTracker deployments=0>"
