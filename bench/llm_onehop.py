"""One hop vs two for an OpenAI app with several models, interleaved in one instance.

    python bench/llm_onehop.py [--requests 1500] [--warmup 200]

The same two-model app (FakeLLMEngine: no model, no token delay) deployed twice: at
/one by `build_openai_app`, whose chat requests the proxy sends straight to the model's
LLMServer (it reads the body's `model`), and at /two behind a subclass of OpenAiIngress,
which the proxy leaves alone, so each request takes the ingress replica's second hop.
One client sends 1-token chat requests, alternating /one and /two (the order flips
each round), so both see the same machine load. Prints p50/p90 per path, how many
requests each ingress replica forwarded, and a last `summary:` line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import free_port
from surge import serve
from surge.api.deployment import deployment
from surge.llm.builders import build_llm_deployment
from surge.llm.ingress import OpenAiIngress
from surge.serve.llm import build_openai_app

FAKE = "surge.testing:FakeLLMEngine"


class TwoHops(OpenAiIngress):
    """OpenAiIngress as it is, but a subclass: the proxy does not route by its models."""


def fake(model: str) -> dict[str, Any]:
    return {"model_loading_config": {"model_id": model}, "llm_engine": FAKE,
            "engine_kwargs": {"max_model_len": 256}}


def measure(url: str, requests: int, warmup: int) -> dict[str, list[float]]:
    body = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    latencies: dict[str, list[float]] = {"/one": [], "/two": []}
    with httpx.Client(base_url=url, timeout=10) as client:
        for i in range(requests + warmup):
            for prefix in ("/one", "/two") if i % 2 else ("/two", "/one"):
                start = time.perf_counter()
                answer = client.post(prefix + "/v1/chat/completions", json=body)
                if i >= warmup:
                    latencies[prefix].append((time.perf_counter() - start) * 1000)
                answer.raise_for_status()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    os.environ["SURGE_ADDRESS"] = f"127.0.0.1:{free_port()}"
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_openai_app({"llm_configs": [fake("a"), fake("b")]}), name="one",
                  route_prefix="/one")
        servers = {m: build_llm_deployment(fake(m)) for m in ("a", "b")}
        serve.run(deployment(TwoHops, name="TwoHops", max_ongoing_requests=10_000).bind(
            llm_deployments=servers), name="two", route_prefix="/two")
        latencies = measure(f"http://127.0.0.1:{port}", args.requests, args.warmup)
        forwarded = {app: serve.get_deployment_handle(name, app).ingress_stats.remote()
                     .result()["forwarded"] for app, name in (("one", "OpenAiIngress"),
                                                              ("two", "TwoHops"))}
    finally:
        serve.shutdown()
    figures = {}
    for prefix, values in latencies.items():
        values.sort()
        p50, p90 = statistics.median(values), values[int(len(values) * 0.9)]
        print(f"{prefix}: n={len(values)} p50={p50:.3f} ms p90={p90:.3f} ms "
              f"forwarded by its ingress: {forwarded[prefix[1:]]}")
        figures[prefix[1:]] = (p50, p90)
    print(f"summary: one_hop_p50_ms={figures['one'][0]:.3f} two_hop_p50_ms={figures['two'][0]:.3f} "
          f"one_hop_p90_ms={figures['one'][1]:.3f} two_hop_p90_ms={figures['two'][1]:.3f} "
          f"ingress_forwarded_one_hop={forwarded['one']}")


if __name__ == "__main__":
    main()
