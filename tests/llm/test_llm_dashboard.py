"""The LLM section of the dashboard, in real surge processes: an OpenAI app on the fake
engine, streamed chat requests, then the dashboard's JSON feed and the page as headless
Chromium renders it (tools: tests/e2e/dashboard_tools.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from surge import serve
from surge.serve.llm import build_openai_app
from tests.e2e.dashboard_tools import dump_dom, find_chromium, in_ci, instance
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

FAKE = {"model_loading_config": {"model_id": "fake"}, "llm_engine": "surge.testing:FakeLLMEngine",
        "engine_kwargs": {"max_model_len": 256, "token_delay_s": 0.01}}
KEY = "chat#LLMServer:fake"  # the application and its LLMServer deployment, named for the model
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 12, "stream": True}


@dataclass
class Served:
    url: str
    dashboard: str


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with instance() as (url, dashboard):
        serve.run(build_openai_app({"llm_configs": [FAKE]}), name="chat", route_prefix="/")
        yield Served(url, dashboard)


def stream_chat(client: httpx.Client) -> list[dict[str, Any]]:
    """One streamed chat completion; its chunks."""
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


class Chats:
    """Streamed chats, `concurrency` at a time on threads, until stopped."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url, self.done = url, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True)
                         for _ in range(concurrency)]

    def __enter__(self) -> Chats:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                stream_chat(client)
                self.done += 1


def llm_points(dashboard: str, since: float | None = None) -> list[dict[str, Any]]:
    params = {} if since is None else {"since": str(since)}
    data = httpx.get(f"{dashboard}/api/timeline", params=params, timeout=10).json()
    return [p["llm"][KEY] for p in data["samples"] if KEY in p.get("llm", {})]


def test_the_feed_shows_ttft_and_tokens_per_second_after_streamed_chats(
        served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for _ in range(5):
            assert len(stream_chat(client)) >= 12
    since = time.time() - 5

    def live() -> bool:
        return any(p["ttft_p50_ms"] and p["output_tokens_s"] > 0
                   for p in llm_points(served.dashboard, since))

    eventually(live, 15, interval_s=0.2, what=f"a timeline point of {KEY} with TTFT, tokens/s")
    point = next(p for p in llm_points(served.dashboard, since)
                 if p["ttft_p50_ms"] and p["output_tokens_s"] > 0)
    assert point["ttft_p99_ms"] >= point["ttft_p50_ms"] > 0
    assert point["itl_p50_ms"] > 0 and point["input_tokens_s"] > 0
    assert point["overhead_p50_ms"] > 0
    assert point["running"] is not None and point["kv_cache_pct"] is not None
    # only the deployments that record the LLM server's metrics are in the feed
    data = httpx.get(f"{served.dashboard}/api/timeline", timeout=10).json()
    assert set().union(*(p["llm"] for p in data["samples"])) == {KEY}


def test_the_llm_section_renders_in_headless_chromium(served: Served) -> None:
    if find_chromium() is None and not in_ci():
        pytest.skip("no chromium here; scripts/ensure-chromium.sh installs it")
    with Chats(served.url, concurrency=2) as chats:  # the latest seconds are live
        eventually(lambda: chats.done >= 10, 20, interval_s=0.2, what="ten streamed chats")
        since = time.time()
        eventually(lambda: sum(p["output_tokens_s"] > 0
                               for p in llm_points(served.dashboard, since)) >= 2,
                   10, interval_s=0.2, what="two timeline points with these chats in them")
        dom = dump_dom(f"{served.dashboard}/?window=60")
    section = dom.split('<section id="llm"', 1)[1].split("</section>", 1)[0]
    assert not section.startswith(" hidden")
    panel = section.split(f'<div class="deployment llm" data-llm="{KEY}">', 1)[1]
    for title in ("Time to first token", "Inter-token latency", "Tokens", "Engine",
                  "KV cache", "Replica overhead"):
        assert f"<h3>{title} " in panel
    assert 'class="series series-output"' in panel and 'class="series series-p99"' in panel
    rate = panel.split('class="output-rate">', 1)[1].split(" ", 1)[0].replace(",", "")
    assert float(rate) > 0, "the output tokens/s shown is not live"
    ttft = panel.split('class="ttft-p50">', 1)[1].split(" ", 1)[0]
    assert float(ttft) > 0
