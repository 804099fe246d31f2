"""LLM-aware routing in real surge processes, on the fake engine with a real queue.

Two LLMServer replicas whose fake engines run one sequence at a time (`batch`: the rest
wait, as a real scheduler's) and tag their words with their pid. Each replica reports
its engine's queue every 0.25 s (RoutingStats frames); the proxy's router must send a
request to the replica whose *engine* is idle even when the load on the other came
through another router (the driver's handle) and the proxy's own in-flight counts are
even. Requests with one session id go to one replica, and spill to the other once it
holds more than the affinity slack.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from surge import serve
from surge.errors import RequestCancelledError
from surge.model import DeploymentId
from surge.router.runtime import current_runtime
from surge.serve.llm import build_openai_app
from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

FAKE = "surge.testing:FakeLLMEngine"
PID = re.compile(r"p(\d+)t\d")


def two_engines(name: str, route_prefix: str) -> Any:
    """An app of two LLMServer replicas, each engine one sequence at a time; its handle."""
    config = {"model_loading_config": {"model_id": "m"}, "llm_engine": FAKE,
              "engine_kwargs": {"max_model_len": 4096, "max_num_seqs": 1, "batch": True,
                                "tag_pid": True, "token_delay_s": 0.01},
              "deployment_config": {"num_replicas": 2, "max_ongoing_requests": 32}}
    serve.run(build_openai_app({"llm_configs": [config]}), name=name,
              route_prefix=route_prefix)
    return serve.get_deployment_handle("LLMServer:m", name)


@pytest.fixture(scope="module")
def instance() -> Iterator[tuple[Running, Any]]:
    with running_instance() as running:
        yield running, two_engines("route", "/")


def engine_queues(app: str, deployment: str) -> dict[str, tuple[int, float]]:
    """What the driver's router last heard from each replica's engine: {replica: (queue,
    when)}. The one place this file reads the router's internals."""
    router = current_runtime().routers[DeploymentId(app, deployment)]
    return {name: (link.stats.queue, link.stats_at) for name, link in router.pool.links.items()
            if link.stats is not None}


def heard_busy_twice(app: str, deployment: str) -> None:
    """Wait until the driver's router has heard two reports in a row of one busy engine.
    A replica sends each report to all its routers at once, so every router (the
    proxy's too) has known of that queue for a report period by then."""
    busy_since: dict[str, float] = {}  # replica -> when its engine was first heard busy

    def twice() -> bool:
        for name, (queue, at) in engine_queues(app, deployment).items():
            if queue < 1:
                busy_since.pop(name, None)  # a blip (a short request), not the busy one
            elif at > busy_since.setdefault(name, at):
                return True
        return False

    eventually(twice, 20, what="two reports in a row of a busy engine's queue")


def chat(url: str, max_tokens: int = 2, session: str = "") -> tuple[int, float]:
    """POST a chat completion; (the pid of the engine that answered, seconds taken)."""
    headers = {"x-session-id": session} if session else {}
    started = time.monotonic()
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=60, headers=headers, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens})
    assert answer.status_code == 200, answer.text
    found = PID.search(answer.json()["choices"][0]["message"]["content"])
    assert found is not None
    return int(found.group(1)), time.monotonic() - started


def pids(url: str) -> set[int]:
    """Both replicas' pids (asked until two answered)."""
    seen: set[int] = set()
    eventually(lambda: seen.add(chat(url)[0]) or len(seen) == 2, 20,
               what="both replicas to answer")
    return seen


def test_requests_go_to_the_replica_with_the_shorter_engine_queue(
        instance: tuple[Running, Any]) -> None:
    running, handle = instance
    both = pids(running.url)
    handle.record_routing_stats.remote().result(timeout_s=10)  # the handle's links open
    eventually(lambda: len(engine_queues("route", "LLMServer:m")) == 2, 20,
               what="the handle's router to hear both engines' queues")
    # Three long generations through the driver's handle, one session: they stick to
    # one replica (within the slack of 2), whose engine runs one and queues two; the
    # proxy's router sent none of them.
    pinned = handle.options(stream=True, session_id="pin")
    body = {"model": "m", "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 300, "stream": True}
    streams = [pinned.chat.remote(body) for _ in range(3)]
    first: list[int] = []
    done = threading.Event()

    def drain(stream: Any) -> None:
        try:
            for part in stream:
                found = PID.search(str(part))
                if found is not None and len(first) < 3:
                    first.append(int(found.group(1)))
                if done.is_set():
                    break
        except RequestCancelledError:  # the test is done with it
            pass

    threads = [threading.Thread(target=drain, args=(s,), daemon=True) for s in streams]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: len(first) >= 1, 20, what="the pinned generations to start")
        busy = first[0]
        (idle,) = both - {busy}
        heard_busy_twice("route", "LLMServer:m")  # every router knows the busy engine's queue
        # Short requests through the proxy: each goes to the idle engine, not behind the
        # busy one's queue (power of two choices on even in-flight counts would send
        # half of them there, to wait seconds).
        answers = [chat(running.url) for _ in range(8)]
        assert [pid for pid, _ in answers] == [idle] * 8
        assert max(seconds for _, seconds in answers) < 2.0
    finally:
        done.set()
        for stream in streams:
            stream.cancel()
        for thread in threads:
            thread.join(10)


def test_a_session_sticks_to_one_replica_and_spills_when_it_is_loaded(
        instance: tuple[Running, Any]) -> None:
    running, _ = instance
    # An app of its own: no other test's generations queue in its engines or their
    # reports (this test used to wait 0.6 s for the previous test's to be reported gone).
    two_engines("session", "/session")
    url = f"{running.url}/session"
    try:
        pids(url)
        homes = {chat(url, session="chat-7")[0] for _ in range(6)}
        assert len(homes) == 1  # sequential requests of one session: one replica
        (home,) = homes
        # Ten at once with that session: the first few stay, the rest spill to the other
        # replica once the home one holds more than the slack (2) beyond it.
        with ThreadPoolExecutor(10) as pool:
            spread = Counter(pool.map(lambda _: chat(url, 20, "chat-7")[0], range(10)))
        assert len(spread) == 2, spread
        assert spread[home] == max(spread.values()), spread
    finally:
        serve.delete("session")


def test_when_every_engine_is_full_the_proxy_refuses_at_once_and_serves_again_after(
        instance: tuple[Running, Any]) -> None:
    running, _ = instance
    # One replica whose engine runs one sequence and admits one (max_ongoing_requests),
    # and no request may wait in the routers' queues (max_queued_requests 0).
    config = {"model_loading_config": {"model_id": "f"}, "llm_engine": FAKE,
              "engine_kwargs": {"max_model_len": 4096, "max_num_seqs": 1, "batch": True,
                                "token_delay_s": 0.01},
              "deployment_config": {"num_replicas": 1, "max_ongoing_requests": 1,
                                    "max_queued_requests": 0}}
    serve.run(build_openai_app({"llm_configs": [config]}), name="full", route_prefix="/full")
    handle = serve.get_deployment_handle("LLMServer:f", "full")
    url = f"{running.url}/full/v1/chat/completions"
    short = {"model": "f", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    # The proxy's link to the replica is open (and hears its engine's reports).
    eventually(lambda: httpx.post(url, json=short, timeout=30).status_code == 200, 20,
               what="the proxy to serve the new app")
    body = {"model": "f", "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 1500, "stream": True}
    streams = [handle.options(stream=True).chat.remote(body)]
    started = [threading.Event()]

    def drain(stream: Any, started: threading.Event) -> None:
        try:
            for _ in stream:
                started.set()
        except RequestCancelledError:
            pass

    threads = [threading.Thread(target=drain, args=(s, e), daemon=True)
               for s, e in zip(streams, started, strict=True)]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: started[0].is_set(), 20, what="the generation to start")
        heard_busy_twice("full", "LLMServer:f")  # the proxy's router knows it is full
        # The engine holds its one: a request through the proxy, which has none in
        # flight there, is refused at once with OpenAI's 503 body.
        refused = httpx.post(url, json=short, timeout=30)
        assert refused.status_code == 503, refused.text  # not served behind it
        assert refused.json()["error"]["code"] == "service_unavailable"
        # Ray's count bound (max_queued_requests 0): no Retry-After unless configured
        assert "retry-after" not in refused.headers
    finally:
        for stream in streams:
            stream.cancel()
        for thread in threads:
            thread.join(10)
    # The engine's queue drains: served again.
    eventually(lambda: httpx.post(url, json=short, timeout=30).status_code == 200, 20,
               what="the proxy to serve again")
    serve.delete("full")
