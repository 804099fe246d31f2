"""LoRA adapters from s3:// against a real S3 server on 127.0.0.1 (moto's, a process of
its own; boto3 reaches it through AWS_ENDPOINT_URL as it would reach AWS): downloaded
once per node into the cache, served by the OpenAI layer, a missing one a 404."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from surge.llm.asgi import OpenAIApp
from surge.llm.config import LLMConfig
from surge.llm.lora_cloud import NodeCache
from surge.llm.service import OpenAIService
from surge.testing import FakeLLMEngine
from tests.e2e.conftest import free_port
from tests.llm.test_openai_layer import body, call

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")
pytestmark = pytest.mark.e2e

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server, in a process group this test started and stops."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                    "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                import urllib.request

                urllib.request.urlopen(f"{url}/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"moto did not start:\n{log.read_text()}") from None
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


@pytest.fixture
def bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="loras")
    for name in ("shout", "whisper"):
        s3.put_object(Bucket="loras", Key=f"tiny/{name}/adapter_config.json",
                      Body=json.dumps({"r": 8, "name": name}).encode())
        s3.put_object(Bucket="loras", Key=f"tiny/{name}/adapter_model.safetensors",
                      Body=os.urandom(4096))
    return s3


def test_an_s3_adapter_downloads_once_per_node(bucket: Any, tmp_path: Path) -> None:
    url = "s3://loras/tiny/shout"

    async def go() -> tuple[list[str], NodeCache, NodeCache]:
        first, second = NodeCache(str(tmp_path)), NodeCache(str(tmp_path))
        paths = await asyncio.gather(first.fetch(url), second.fetch(url), first.fetch(url))
        return list(paths), first, second

    paths, first, second = asyncio.run(go())
    assert len(set(paths)) == 1 and first.downloads + second.downloads == 1
    local = Path(paths[0])
    assert json.loads((local / "adapter_config.json").read_text())["name"] == "shout"
    remote = bucket.get_object(Bucket="loras", Key="tiny/shout/adapter_model.safetensors")
    assert (local / "adapter_model.safetensors").read_bytes() == remote["Body"].read()
    assert sorted(p.name for p in local.iterdir()) == ["adapter_config.json",
                                                       "adapter_model.safetensors"]


def test_the_openai_layer_serves_an_s3_adapter(bucket: Any, tmp_path: Path) -> None:
    cfg = LLMConfig(model_loading_config={"model_id": "tiny"},
                    llm_engine="surge.testing:FakeLLMEngine",
                    lora_config={"dynamic_lora_loading_path": "s3://loras/tiny",
                                 "max_download_tries": 1})

    async def go() -> list[tuple[int, Any]]:
        engine = FakeLLMEngine(cfg)
        svc = OpenAIService(cfg, engine, await engine.start())
        assert svc.loras is not None
        svc.loras.node_cache = NodeCache(str(tmp_path), tries=1)
        app = OpenAIApp(svc)
        answers = []
        for model in ("tiny:whisper", "tiny:nope"):
            status, _, raw = await call(app, "POST", "/v1/chat/completions",
                                        body(model=model, max_tokens=2))
            answers.append((status, json.loads(raw)))
        assert engine.adapters["whisper"].startswith(str(tmp_path))
        return answers

    (ok, okay), (missing, error) = asyncio.run(go())
    assert ok == 200 and okay["choices"][0]["message"]["content"] == "whisper0 whisper1"
    assert missing == 404 and error["error"]["code"] == "model_not_found"
    assert "s3://loras/tiny/nope" in error["error"]["message"]
