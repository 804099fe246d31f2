"""`@serve.multiplexed` on a replica, as multi-model apps use it (routing affinity aside).

One load per model however many requests wait for it, different models loading at
once, LRU eviction with `__del__`, a failed load retried, the model id from the HTTP
header and from handle options, and `@serve.batch` never mixing models.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from surge import serve
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


class Model:
    def __init__(self, model_id: str, unloaded: list[str]) -> None:
        self.model_id = model_id
        self.unloaded = unloaded

    def __del__(self) -> None:
        self.unloaded.append(self.model_id)


@serve.deployment(max_ongoing_requests=64)
class Models:
    def __init__(self) -> None:
        self.loads: list[str] = []
        self.unloaded: list[str] = []
        self.loading_now = 0
        self.most_at_once = 0

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        self.loads.append(model_id)
        self.loading_now += 1
        self.most_at_once = max(self.most_at_once, self.loading_now)
        try:
            await asyncio.sleep(0.3)  # a model load
            if model_id.startswith("bad") and self.loads.count(model_id) == 1:
                raise RuntimeError(f"no weights for {model_id}")
            return Model(model_id, self.unloaded)
        finally:
            self.loading_now -= 1

    async def __call__(self, request: Any = None) -> str:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.model_id

    def current_model_id(self) -> str:  # a plain def: its worker answers (sync_calls.py)
        return serve.get_multiplexed_model_id()

    def stats(self) -> dict[str, Any]:
        return {"loads": list(self.loads), "unloaded": list(self.unloaded),
                "most_at_once": self.most_at_once}

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
    async def batched(self, items: list[int]) -> list[str]:
        model_id = serve.get_multiplexed_model_id()
        return [f"{model_id}:{len(items)}" for _ in items]


def test_models_load_once_concurrently_and_leave_by_lru(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Models.bind(), name="models", route_prefix="/models")

    async def burst(ids: list[str]) -> list[Any]:
        calls = [handle.options(multiplexed_model_id=m).remote() for m in ids]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    # Ten requests for "a" and ten for "b" at once: one load each, both at the same time.
    assert asyncio.run(burst(["a", "b"] * 10)) == ["a", "b"] * 10
    stats = handle.stats.remote().result(timeout_s=10)
    assert sorted(stats["loads"]) == ["a", "b"]
    assert stats["most_at_once"] == 2

    # A third model makes room: the least recently used ("a", as "b" was used after it).
    assert handle.options(multiplexed_model_id="b").remote().result(timeout_s=10) == "b"
    assert handle.options(multiplexed_model_id="c").remote().result(timeout_s=10) == "c"
    stats = handle.stats.remote().result(timeout_s=10)
    assert stats["unloaded"] == ["a"]

    # The model id comes from the HTTP header too.
    response = httpx.get(f"{surge_instance.url}/models",
                         headers={"serve_multiplexed_model_id": "c"}, timeout=10)
    assert response.text == "c"

    # A failed load fails its waiters with the loader's error; the next request retries.
    results = asyncio.run(burst(["bad-1"] * 3))
    assert all(isinstance(r, RuntimeError) and "no weights for bad-1" in str(r)
               for r in results), results
    assert handle.options(multiplexed_model_id="bad-1").remote().result(
        timeout_s=10) == "bad-1"
    assert handle.stats.remote().result(timeout_s=10)["loads"].count("bad-1") == 2

    # Sequential calls from this thread take the blocking fast path: the id still arrives.
    which = handle.options(method_name="current_model_id")
    assert [which.options(multiplexed_model_id=m).remote().result(timeout_s=10)
            for m in ["x", "y", "", "x"]] == ["x", "y", "", "x"]
    serve.delete("models")


def test_more_models_at_once_than_fit_all_load_in_turn(surge_instance) -> None:  # type: ignore[no-untyped-def]
    """Five models at once on a replica that holds two: none waits forever."""
    handle = serve.run(Models.bind(), name="crowd", route_prefix=None)

    async def burst() -> list[Any]:
        calls = [handle.options(multiplexed_model_id=f"c{i}").remote() for i in range(5)]
        return list(await asyncio.wait_for(asyncio.gather(*calls), 20))

    assert asyncio.run(burst()) == [f"c{i}" for i in range(5)]
    stats = handle.stats.remote().result(timeout_s=10)
    assert sorted(stats["loads"]) == [f"c{i}" for i in range(5)]
    assert stats["most_at_once"] == 2  # never more than the replica holds
    serve.delete("crowd")


def test_a_batch_never_mixes_models(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Models.bind(), name="batches", route_prefix=None)

    async def mixed() -> list[str]:
        calls = [handle.options(method_name="batched", multiplexed_model_id=m).remote(i)
                 for i, m in enumerate(["x", "y"] * 6)]
        return list(await asyncio.gather(*calls))

    answers = eventually(lambda: asyncio.run(mixed()), 30, what="batched answers")
    for answer, model_id in zip(answers, ["x", "y"] * 6, strict=True):
        assert answer.startswith(f"{model_id}:")
    serve.delete("batches")


def test_multiplexed_refuses_what_ray_refuses() -> None:
    with pytest.raises(TypeError, match="async functions"):
        @serve.multiplexed
        def sync_loader(model_id: str) -> None: ...
    with pytest.raises(ValueError, match="must be positive"):
        serve.multiplexed(max_num_models_per_replica=0)
    with pytest.raises(TypeError, match="must be an integer"):
        serve.multiplexed(max_num_models_per_replica=2.5)  # type: ignore[arg-type]
    assert serve.get_multiplexed_model_id() == ""  # outside a request


@serve.deployment
class Child:
    def __call__(self) -> str:
        return serve.get_multiplexed_model_id()


@serve.deployment
class Parent:
    def __init__(self, child: Any) -> None:
        self.child = child

    async def __call__(self) -> list[str]:
        inherited = await self.child.remote()  # nested calls inherit no model id
        chosen = await self.child.options(multiplexed_model_id="kid").remote()
        return [serve.get_multiplexed_model_id(), inherited, chosen]


def test_nested_handle_calls_inherit_no_model_id(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Parent.bind(Child.bind()), name="nested", route_prefix=None)
    assert handle.options(multiplexed_model_id="top").remote().result(timeout_s=30) == [
        "top", "", "kid"]
    serve.delete("nested")


@serve.deployment
class Recorder:
    def __init__(self) -> None:
        self.unloaded: set[str] = set()

    def add(self, model_id: str) -> None:
        self.unloaded.add(model_id)

    def record(self) -> set[str]:
        return self.unloaded


class ReportingModel:
    def __init__(self, model_id: str, recorder: Any) -> None:
        self.model_id, self.recorder = model_id, recorder

    def __del__(self) -> None:
        self.recorder.add.remote(self.model_id)  # fired and forgotten, as users do


@serve.deployment
class HoldsOneModel:
    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    @serve.multiplexed(max_num_models_per_replica=1)
    async def get_model(self, model_id: str) -> ReportingModel:
        return ReportingModel(model_id, self.recorder)

    async def __call__(self, request: Any) -> str:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.model_id


def test_a_redeploy_unloads_the_old_replicas_models_before_serve_run_returns(  # type: ignore[no-untyped-def]
        surge_instance) -> None:
    # As Ray: serve.run replaces the replicas; by the time it returns the old one has
    # stopped, its models' __del__ ran, and the call that __del__ fired reached its replica.
    recorder = serve.run(Recorder.bind(), name="recorder", route_prefix=None)
    serve.run(HoldsOneModel.bind(recorder), name="holds", route_prefix="/holds")
    response = httpx.get(f"{surge_instance.url}/holds",
                         headers={"serve_multiplexed_model_id": "1"}, timeout=30)
    assert response.text == "1"
    assert recorder.record.remote().result(timeout_s=10) == set()
    serve.run(HoldsOneModel.bind(recorder), name="holds", route_prefix="/holds")
    assert recorder.record.remote().result(timeout_s=10) == {"1"}
    serve.delete("holds")
    serve.delete("recorder")
