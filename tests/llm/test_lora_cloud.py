"""LoRA adapters from s3:// and gs:// against real servers on 127.0.0.1, each a process
of its own: moto's S3 server (boto3 reaches it through AWS_ENDPOINT_URL, as it would
reach AWS) and gcp-storage-emulator (google-cloud-storage through STORAGE_EMULATOR_HOST).
Downloaded once per node into the cache, served by the OpenAI layer, a missing one a
404."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from surge.llm.asgi import OpenAIApp
from surge.llm.config import LLMConfig
from surge.llm.lora_cloud import NodeCache
from surge.llm.service import OpenAIService
from surge.testing import FakeLLMEngine
from tests.llm.test_openai_layer import body, call
from tests.ports import free_port

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")
storage = pytest.importorskip("google.cloud.storage")
pytest.importorskip("gcp_storage_emulator")
pytestmark = pytest.mark.e2e

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def serve_process(argv: list[str], log: Path) -> Iterator[str]:
    """`python ARGV` serving on a free port (`{port}` in argv), in a process group this
    test starts and stops; yields its URL once it answers."""
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, *(a.format(port=port) for a in argv)],
                                   stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{argv} did not start:\n{log.read_text()}") from None
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    yield from serve_process(["-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"], log)


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("gcs") / "gcs.log"
    yield from serve_process(["-m", "gcp_storage_emulator", "start", "-H", "127.0.0.1",
                              "--port", "{port}", "--in-memory", "-q"], log)


def adapter_files(name: str) -> dict[str, bytes]:
    return {"adapter_config.json": json.dumps({"r": 8, "name": name}).encode(),
            "adapter_model.safetensors": os.urandom(4096)}


@pytest.fixture
def bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """s3://loras/tiny/{shout,whisper}; the objects by key."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3")
    if "loras" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket="loras")
    written = {}
    for name in ("shout", "whisper"):
        for file, data in adapter_files(name).items():
            key = f"tiny/{name}/{file}"
            s3.put_object(Bucket="loras", Key=key, Body=data)
            written[key] = data
    return written


@pytest.fixture
def gcs_bucket(gcs_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """gs://loras/tiny/shout; the objects by key."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    client = storage.Client()
    bucket = client.bucket("loras")
    if not bucket.exists():
        bucket = client.create_bucket("loras")
    written = {}
    for file, data in adapter_files("shout").items():
        bucket.blob(f"tiny/shout/{file}").upload_from_string(data)
        written[f"tiny/shout/{file}"] = data
    return written


def check_downloaded_once(url: str, root: Path, objects: dict[str, bytes]) -> None:
    async def go() -> tuple[list[str], NodeCache, NodeCache]:
        first, second = NodeCache(str(root)), NodeCache(str(root))  # two replicas
        paths = await asyncio.gather(first.fetch(url), second.fetch(url), first.fetch(url))
        return list(paths), first, second

    paths, first, second = asyncio.run(go())
    assert len(set(paths)) == 1 and first.downloads + second.downloads == 1
    local = Path(paths[0])
    prefix = url.split("/", 3)[3] + "/"
    expected = {key[len(prefix):]: data for key, data in objects.items()
                if key.startswith(prefix)}
    assert {p.name: p.read_bytes() for p in local.iterdir()} == expected
    assert [n for n in os.listdir(root) if not n.endswith(".lock")] == [local.name]


def test_an_s3_adapter_downloads_once_per_node(bucket: dict[str, bytes],
                                               tmp_path: Path) -> None:
    check_downloaded_once("s3://loras/tiny/shout", tmp_path, bucket)


def test_a_gs_adapter_downloads_once_per_node(gcs_bucket: dict[str, bytes],
                                             tmp_path: Path) -> None:
    check_downloaded_once("gs://loras/tiny/shout", tmp_path, gcs_bucket)


def test_the_openai_layer_serves_an_s3_adapter(bucket: dict[str, bytes],
                                               tmp_path: Path) -> None:
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
