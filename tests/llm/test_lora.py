"""LoRA adapters as multiplexed models of one engine (llm/lora.py) and the node's download
cache (llm/lora_cloud.py), in process: LRU unload from the engine at the cap, an unload
that waits for the adapter's running request, downloads once per node with atomic
renames, retries, bounds, and errors that name the URL and the missing package. s3://
and gs:// against real local servers: tests/llm/test_lora_cloud.py; across replicas:
tests/llm/test_lora_routing.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from surge.errors import ConfigError
from surge.llm.asgi import OpenAIApp
from surge.llm.config import LLMConfig
from surge.llm.engine import AdapterError
from surge.llm.lora import Adapters, adapter_location
from surge.llm.lora_cloud import NodeCache
from surge.llm.service import OpenAIService
from surge.testing import FakeLLMEngine, FakeObjectStore
from tests.eventually import eventually_async
from tests.llm.test_openai_layer import body, call

WAIT_S = 10.0

FAKE = "surge.testing:FakeLLMEngine"


def config(path: str, cap: int = 2, **engine_kwargs: Any) -> LLMConfig:
    return LLMConfig(model_loading_config={"model_id": "fake"}, llm_engine=FAKE,
                     engine_kwargs=engine_kwargs,
                     lora_config={"dynamic_lora_loading_path": path,
                                  "max_num_adapters_per_replica": cap})


def adapter_dirs(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text("{}")
    return root


async def service(cfg: LLMConfig) -> OpenAIService:
    engine = FakeLLMEngine(cfg)
    return OpenAIService(cfg, engine, await engine.start())


def test_the_least_recently_used_adapter_leaves_the_engine_at_the_cap(tmp_path: Path) -> None:
    adapter_dirs(tmp_path, "a", "b", "c")

    async def go() -> tuple[list[str], list[str], list[str], list[str]]:
        svc = await service(config(f"file://{tmp_path}", cap=2))
        app = OpenAIApp(svc)
        for model in ("fake:a", "fake:b", "fake:a", "fake:c"):  # b is the LRU one at c
            status, _, raw = await call(app, "POST", "/v1/chat/completions", body(model=model))
            assert status == 200, raw
        engine = svc.engine
        assert isinstance(engine, FakeLLMEngine)
        listed = json.loads((await call(app, "GET", "/v1/models"))[2])["data"]
        return engine.loads, engine.unloads, sorted(engine.adapters), [m["id"] for m in listed]

    loads, unloads, held, listed = asyncio.run(go())
    assert loads == ["a", "b", "c"] and unloads == ["b"] and held == ["a", "c"]
    assert listed == ["fake", "fake:a", "fake:c"]


def test_an_unload_waits_for_the_adapters_running_request(tmp_path: Path) -> None:
    adapter_dirs(tmp_path, "a", "b")

    async def go() -> tuple[list[str], list[str]]:
        svc = await service(config(str(tmp_path), cap=1, token_delay_s=0.01))
        engine = svc.engine
        assert isinstance(engine, FakeLLMEngine)
        long = await svc.prepare_chat(body(model="fake:a", max_tokens=20))
        streaming = asyncio.ensure_future(long.complete())
        await eventually_async(lambda: engine.active, WAIT_S, what="a's request generating")

        async def b() -> Any:
            return await (await svc.prepare_chat(body(model="fake:b", max_tokens=1))).complete()

        other = asyncio.ensure_future(b())
        assert svc.loras is not None
        loras = svc.loras
        await eventually_async(lambda: loras.leaving() == ["a"], WAIT_S,
                               what="b's load evicting a")
        during = list(engine.unloads)  # b waits for a's request to end
        text = (await streaming)["choices"][0]["message"]["content"]
        assert text.startswith("a0") and len(text.split()) == 20
        await other
        return during, engine.unloads

    during, after = asyncio.run(go())
    assert during == [] and after == ["a"]


def test_adapter_names_cannot_leave_the_loading_path() -> None:
    assert adapter_location("s3://b/loras", "shout") == "s3://b/loras/shout"
    assert adapter_location("file:///m", "org/shout") == "/m/org/shout"
    assert adapter_location(None, "x") == "x"
    for bad in ("../etc", "a/../../b", "/abs", "a//b", "."):
        with pytest.raises(AdapterError, match="not an adapter name"):
            adapter_location("/m", bad)


def objects(prefix: str) -> dict[tuple[str, str], bytes]:
    return {("bucket", f"{prefix}/adapter_config.json"): b'{"r": 8}',
            ("bucket", f"{prefix}/adapter_model.safetensors"): b"\0" * 64,
            ("bucket", f"{prefix}/nested/extra.txt"): b"x",
            ("bucket", f"{prefix}-v2/other.json"): b"not this one"}


def test_downloads_are_once_per_node_and_atomic(tmp_path: Path) -> None:
    store = FakeObjectStore(objects("loras/shout"))
    url = "gs://bucket/loras/shout"

    async def go() -> tuple[str, str, NodeCache, NodeCache]:
        first = NodeCache(str(tmp_path), stores=lambda _: store)
        second = NodeCache(str(tmp_path), stores=lambda _: store)  # another replica
        a, b = await asyncio.gather(first.fetch(url), second.fetch(url))
        return a, b, first, second

    a, b, first, second = asyncio.run(go())
    assert a == b and first.downloads + second.downloads == 1
    assert len(store.downloads) == 3  # three objects, once each; not the -v2 prefix
    files = sorted(str(p.relative_to(a)) for p in Path(a).rglob("*") if p.is_file())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "nested/extra.txt"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".partial")]


def test_a_flaky_download_is_retried_and_a_missing_adapter_is_404(tmp_path: Path) -> None:
    store = FakeObjectStore(objects("loras/shout"), fail_times=1)
    cache = NodeCache(str(tmp_path), tries=2, backoff_s=0.0, stores=lambda _: store)
    assert os.path.isdir(asyncio.run(cache.fetch("gs://bucket/loras/shout")))
    with pytest.raises(AdapterError, match="no adapter at gs://bucket/loras/none"):
        asyncio.run(cache.fetch("gs://bucket/loras/none"))
    failing = FakeObjectStore(objects("loras/x"), fail_times=5)
    cache = NodeCache(str(tmp_path), tries=2, backoff_s=0.0, stores=lambda _: failing)
    with pytest.raises(AdapterError, match=r"gs://bucket/loras/x failed after 2 tries"):
        asyncio.run(cache.fetch("gs://bucket/loras/x"))
    assert not [n for n in os.listdir(tmp_path)
                if n.startswith((".partial", "x-")) and not n.endswith(".lock")]


def test_the_node_cache_is_bounded(tmp_path: Path) -> None:
    store = FakeObjectStore({**objects("l/a"), **objects("l/b"), **objects("l/c")})
    cache = NodeCache(str(tmp_path), max_cached=2, stores=lambda _: store)

    async def go() -> list[str]:
        return [await cache.fetch(f"gs://bucket/l/{name}") for name in "abc"]

    a, b, c = asyncio.run(go())
    assert not os.path.exists(a) and os.path.isdir(b) and os.path.isdir(c)


MISSING = """
import sys
sys.modules["google.cloud.storage"] = None  # as if not installed: importing it fails
from surge.errors import ConfigError
from surge.llm.config import LLMConfig
from surge.llm.lora import Adapters
from surge.testing import FakeLLMEngine
cfg = LLMConfig(model_loading_config={"model_id": "fake"}, llm_engine="x:Y",
                lora_config={"dynamic_lora_loading_path": "gs://bucket/loras"})
try:
    Adapters("fake", cfg.lora, FakeLLMEngine(cfg))
except ConfigError as exc:
    print(exc)
"""


@pytest.mark.e2e  # starts a process (tests/tiers.py)
def test_a_missing_client_fails_the_deploy_naming_the_url_and_package() -> None:
    # In a process of its own, where the package cannot be imported (it is installed
    # here for tests/llm/test_lora_cloud.py).
    out = subprocess.run([sys.executable, "-c", MISSING], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             p for p in sys.path if p)})
    assert out.returncode == 0, out.stderr
    assert ("LoRA adapters from gs://bucket/loras need the optional dependency "
            "'google-cloud-storage', which is not installed: pip install "
            "google-cloud-storage") in out.stdout, out.stdout


def test_azure_schemes_fail_the_deploy_saying_so() -> None:
    cfg = config("abfss://container@account.dfs.core.windows.net/loras")
    assert cfg.lora is not None
    with pytest.raises(ConfigError, match="Azure schemes are not supported"):
        Adapters("fake", cfg.lora, FakeLLMEngine(cfg))


def test_an_adapter_asked_for_while_it_leaves_loads_again_after(tmp_path: Path) -> None:
    adapter_dirs(tmp_path, "a", "b")

    async def go() -> tuple[list[str], list[str], list[str]]:
        svc = await service(config(str(tmp_path), cap=1, token_delay_s=0.01))
        engine = svc.engine
        assert isinstance(engine, FakeLLMEngine)

        async def ask(model: str, tokens: int) -> str:
            run = await svc.prepare_chat(body(model=model, max_tokens=tokens))
            return str((await run.complete())["choices"][0]["message"]["content"])

        first = asyncio.ensure_future(ask("fake:a", 10))
        await eventually_async(lambda: engine.active, WAIT_S, what="a's request generating")
        b = asyncio.ensure_future(ask("fake:b", 1))  # evicts a, waiting for its request
        assert svc.loras is not None
        loras = svc.loras
        await eventually_async(lambda: loras.leaving() == ["a"], WAIT_S, what="a leaving")
        again = asyncio.ensure_future(ask("fake:a", 1))  # a while it leaves
        texts = await asyncio.gather(first, b, again)
        # every request was served by its adapter: none found it gone from the engine
        assert [t.split()[0] for t in texts] == ["a0", "b0", "a0"]
        return engine.loads, sorted(engine.adapters), svc.adapters

    loads, in_engine, in_cache = asyncio.run(go())
    assert loads.count("a") == 2 and in_engine == in_cache and len(in_cache) == 1
