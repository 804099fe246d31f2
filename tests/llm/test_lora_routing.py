"""LoRA adapters spread by the multiplexing policy, in real surge processes on the fake
engine: two replicas end up holding different adapters, and every later request for an
adapter goes to the replica that holds it, whether the proxy reads the adapter from the
body's `model` (one model: LLMServer is the ingress) or the multi-model ingress sets it
on its handle call. The fake engine's `reveal_pid` says which replica answered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from surge import serve
from surge.api.instance import current
from surge.serve.llm import build_openai_app
from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.e2e

ADAPTERS = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    # One proxy worker: one router's placement decisions, so the spread is exact.
    with running_instance(proxy_workers=1) as running:
        yield running


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adapters")
    for name in ADAPTERS:
        (root / name).mkdir()
        (root / name / "adapter_config.json").write_text("{}")
    return root


def lora_model(model_id: str, adapters: Path, replicas: int = 2) -> dict[str, Any]:
    return {"model_loading_config": {"model_id": model_id},
            "llm_engine": "surge.testing:FakeLLMEngine",
            "engine_kwargs": {"reveal_pid": True},
            "lora_config": {"dynamic_lora_loading_path": f"file://{adapters}",
                            "max_num_adapters_per_replica": 2},
            "deployment_config": {"num_replicas": replicas}}


def answered_by(client: Any, model: str) -> int:
    """The pid of the replica that answered a request for the adapter `model`."""
    content = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
    ).choices[0].message.content
    word, _, pid = content.partition("@")
    assert word == f"{model.partition(':')[2]}0", content  # the adapter was applied
    return int(pid)


def held_by_replica(app: str) -> list[list[str]]:
    instance = current()
    assert instance is not None
    return sorted(sorted(r["models"]) for r in instance.call("replicas", timeout=10)
                  if r["app"] == app)


def test_adapters_spread_and_requests_follow_them(instance: Running, adapters: Path,
                                                  request: pytest.FixtureRequest) -> None:
    serve.run(build_openai_app({"llm_configs": [lora_model("fake", adapters)]}),
              name="lora", route_prefix="/lora")
    request.addfinalizer(lambda: serve.delete("lora"))
    with openai.OpenAI(base_url=f"{instance.url}/lora/v1", api_key="x",
                       max_retries=0) as client:
        models = [f"fake:{name}" for name in ADAPTERS]
        placed = {model: answered_by(client, model) for model in models}
        # No header: the proxy read each body's `model`. Two adapters per replica (the
        # cap), each on one replica only: the policy placed the cold ones apart.
        assert sorted(Counter(placed.values()).values()) == [2, 2], placed
        for _ in range(3):
            assert {model: answered_by(client, model) for model in models} == placed
            # A model card goes where the adapter is (the proxy reads the path's id).
            assert all(client.models.retrieve(model).parent == "fake" for model in models)
        # Base-model requests carry no model id: any replica may serve them.
        base = client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert base.choices[0].message.content == "t0"
    by_pid: dict[int, list[str]] = {}
    for model, pid in placed.items():
        by_pid.setdefault(pid, []).append(model)
    expected = sorted(sorted(held) for held in by_pid.values())
    eventually(lambda: held_by_replica("lora") == expected, 10,
               what="each replica listed holding its own two adapters")


def test_the_multi_model_ingress_routes_adapters_too(instance: Running, adapters: Path,
                                                     request: pytest.FixtureRequest) -> None:
    serve.run(build_openai_app({"llm_configs": [
        lora_model("one", adapters), lora_model("two", adapters, replicas=1)]}),
        name="pair", route_prefix="/pair")
    request.addfinalizer(lambda: serve.delete("pair"))
    with openai.OpenAI(base_url=f"{instance.url}/pair/v1", api_key="x",
                       max_retries=0) as client:
        models = [f"one:{name}" for name in ADAPTERS]
        placed = {model: answered_by(client, model) for model in models}
        assert sorted(Counter(placed.values()).values()) == [2, 2], placed
        assert {model: answered_by(client, model) for model in models} == placed
        assert answered_by(client, "two:a") not in placed.values()
