"""The LLM deployments' timeline points (controller/llm_timeline.py): real LLMMetrics
recorded in (simulated) replicas, shipped as telemetry, read once a second."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from surge.backends.base import Placement
from surge.config import DeploymentConfig, DeploymentSpec, HTTPOptions
from surge.controller.autoscaler import Autoscaler, LoadTracker
from surge.controller.observer import Observer
from surge.controller.state import ControllerState, DeploymentRecord, ReplicaRecord
from surge.llm.engine import EngineStats
from surge.llm.metrics import LLMMetrics
from surge.model import DeploymentId
from surge.observability.recorder import Recorder
from surge.observability.user_metrics import REGISTRY
from surge.policy.lifecycle import ReplicaState
from surge.replica.context import ReplicaContext, ReplicaID, set_replica_context
from surge.serve.metrics import Counter
from surge.testing import FakeClock

CHAT, SHOP = DeploymentId("chat", "LLMServer"), DeploymentId("chat", "Shop")
REPLICAS = {"LLMServer-1": CHAT, "LLMServer-2": CHAT, "Shop-1": SHOP}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=0.0)


@pytest.fixture
def observer(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Observer]:
    """Two replicas of an LLM deployment and one of a deployment that is not one."""
    # A registry of its own: an earlier test that made LLMMetrics outside a replica
    # defined its names without the replica's tags, and a name keeps its first shape
    monkeypatch.setattr(REGISTRY, "families", {})
    state = ControllerState("127.0.0.1:1", HTTPOptions(), 1, head=Placement("local", "x"))
    for did in (CHAT, SHOP):
        spec = DeploymentSpec(config=DeploymentConfig(name=did.name), target_blob=b"",
                              init_blob=b"")
        state.deployments[did] = DeploymentRecord(did, spec, 1, spec.code_version, target=1)
    for replica_id, did in REPLICAS.items():
        state.add_replica(ReplicaRecord(replica_id, did, 1, 0.0, ReplicaState.RUNNING, pid=1))
    yield Observer(state, LoadTracker(0.1), Autoscaler(), clock)
    set_replica_context(None)


def record(observer: Observer, replica_id: str, **what: Any) -> None:
    """Record as the replica's LLMServer would, then ship its telemetry."""
    did = REPLICAS[replica_id]
    set_replica_context(ReplicaContext(ReplicaID(replica_id, did.name, did.app), None))
    metrics = LLMMetrics("tiny")
    for value in what.get("ttft", ()):
        metrics.ttft.observe(value)
    for value in what.get("itl", ()):
        metrics.itl.observe(value)
    for value in what.get("overhead", ()):
        metrics.overhead.observe(value)
    if "tokens" in what:
        metrics.request_done(*what["tokens"], elapsed_s=0.5)
    if "engine" in what:
        metrics.engine(what["engine"])
    report = Recorder("replica", replica_id, did.app, did.name).drain({}, user=REGISTRY.drain())
    observer.telemetry(report)


def test_points_from_bucket_deltas_over_two_intervals(observer: Observer,
                                                      clock: FakeClock) -> None:
    record(observer, "LLMServer-1", ttft=[0.015] * 4, itl=[0.03] * 10,
           overhead=[0.0003] * 2, tokens=(8, 40),
           engine=EngineStats(waiting=1, running=2, kv_cache_usage=0.25, max_running=4))
    record(observer, "LLMServer-2",
           engine=EngineStats(waiting=0, running=1, kv_cache_usage=0.75, max_running=4))
    first = observer.sample()["llm"]
    assert list(first) == ["chat#LLMServer"]  # Shop records no LLM metrics
    assert first["chat#LLMServer"] == pytest.approx({
        "ttft_p50_ms": 15.0, "ttft_p99_ms": 19.9,  # four in (10, 20] ms
        "itl_p50_ms": 37.5, "itl_p99_ms": 49.75,  # ten in (25, 50] ms
        "overhead_p50_ms": 0.375, "overhead_p99_ms": 0.4975,
        "output_tokens_s": 40.0, "input_tokens_s": 8.0,  # the first interval: 1 s
        "running": 3.0, "waiting": 1.0, "kv_cache_pct": 50.0}, abs=1e-3)

    clock.advance(1.0)  # two more, slower first tokens; the earlier ones still count
    record(observer, "LLMServer-1", ttft=[0.05] * 2, tokens=(2, 10))
    second = observer.sample()["llm"]["chat#LLMServer"]
    assert second["ttft_p50_ms"] == pytest.approx(17.5)
    assert second["ttft_p99_ms"] == pytest.approx(59.4)
    assert second["output_tokens_s"] == 25.0 and second["input_tokens_s"] == 5.0  # 50/2 s

    clock.advance(1.0)  # nothing new: only the second interval is in the window
    third = observer.sample()["llm"]["chat#LLMServer"]
    assert third["ttft_p50_ms"] == pytest.approx(50.0) and third["itl_p50_ms"] is None
    assert third["output_tokens_s"] == 5.0
    assert third["running"] == 3.0  # gauges stand until set again

    clock.advance(1.0)
    quiet = observer.sample()["llm"]["chat#LLMServer"]
    assert quiet["ttft_p50_ms"] is None and quiet["output_tokens_s"] == 0.0


def test_a_deployment_with_other_user_metrics_is_not_an_llm_one(observer: Observer) -> None:
    set_replica_context(ReplicaContext(ReplicaID("Shop-1", "Shop", "chat"), None))
    Counter("vllm_generation_tokens_other", "Not the LLM server's.").inc(3)
    report = Recorder("replica", "Shop-1", "chat", "Shop").drain({}, user=REGISTRY.drain())
    observer.telemetry(report)
    assert observer.sample()["llm"] == {}
    assert "llm" in observer.timeline_since(None)["samples"][-1]


def test_a_stopped_replicas_gauges_and_a_gone_deployment_leave(observer: Observer,
                                                               clock: FakeClock) -> None:
    for replica_id, running in (("LLMServer-1", 2), ("LLMServer-2", 1)):
        record(observer, replica_id, tokens=(1, 5), engine=EngineStats(
            waiting=0, running=running, kv_cache_usage=0.5, max_running=4))
    assert observer.sample()["llm"]["chat#LLMServer"]["running"] == 3.0
    observer.state.remove_replica("LLMServer-2")
    clock.advance(1.0)
    observer.sample()  # the observer notices the stop after this point
    clock.advance(1.0)
    point = observer.sample()["llm"]["chat#LLMServer"]
    assert point["running"] == 2.0 and point["output_tokens_s"] == 0.0
    observer.state.remove_replica("LLMServer-1")
    clock.advance(61.0)  # past the last scrape both replicas' series are kept for
    observer.sample()
    assert observer.sample()["llm"] == {}
    assert repr(observer.llm) == "<LLMTimeline deployments=[]>"


def test_the_engines_prefix_cache_totals_become_vllms_counters(observer: Observer) -> None:
    """vLLM's vllm:prefix_cache_queries / _hits: each sample adds what the engine's
    totals grew by since the last; totals that stand still add nothing."""
    set_replica_context(ReplicaContext(ReplicaID("LLMServer-1", "LLMServer", "chat"), None))
    REGISTRY.drain()
    metrics = LLMMetrics("tiny")
    added: dict[str, float] = {}
    for queries, hits in ((100, 40), (100, 40), (250, 140)):
        metrics.engine(EngineStats(prefix_cache_queries=queries, prefix_cache_hits=hits))
        for info, values in REGISTRY.drain().items():
            if info.name in ("vllm_prefix_cache_queries", "vllm_prefix_cache_hits"):
                assert info.kind == "counter"
                added[info.name] = added.get(info.name, 0.0) + sum(values.values())
    assert added == {"vllm_prefix_cache_queries": 250.0, "vllm_prefix_cache_hits": 140.0}
