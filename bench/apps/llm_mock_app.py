"""An OpenAI app on mock vLLM engines, beside a plain POST echo, for bench/llm_router_cpu.py:
`python llm_mock_app.py PORT REPLICAS`.

`/` is `build_openai_app` on `surge.testing:MockVLLMEngine` (REPLICAS replicas, steps of
0.2 ms and no per-token cost: the engines are never the limit), `/off` the same app with
`request_router_kwargs: {prefix_routing: false}` (its router reads no prompt); `/echo`
answers any POST with its body's length, so a request there takes the same proxy path
without the LLM routing (no prompt read, no prefix choice).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from until_sigterm import serve_until_sigterm

from surge import serve
from surge.serve.llm import build_openai_app


@serve.deployment(max_ongoing_requests=1000)
class Echo:
    async def __call__(self, request: Any) -> dict[str, int]:
        return {"bytes": len(await request.body())}


def llm(replicas: int, prefix_routing: bool) -> dict[str, Any]:
    router = {"request_router_kwargs": {"prefix_routing": prefix_routing}}
    return {"llm_configs": [{
        "model_loading_config": {"model_id": "mock"},
        "llm_engine": "surge.testing:MockVLLMEngine",
        "engine_kwargs": {"step_s": 0.0002, "decode_s_per_seq": 0.0,
                          "prefill_s_per_token": 0.0, "max_num_seqs": 512,
                          "max_num_batched_tokens": 1_000_000, "num_blocks": 200_000,
                          "max_model_len": 200_000},
        "deployment_config": {"num_replicas": replicas, "max_ongoing_requests": 1000,
                              "request_router_config": router}}]}


def main() -> None:
    port, replicas = int(sys.argv[1]), int(sys.argv[2])
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    serve.start(http_options={"port": port})
    serve.run(build_openai_app(llm(replicas, True)), name="llm", route_prefix="/")
    # the same app with prefix routing off (request_router_kwargs), at /off
    serve.run(build_openai_app(llm(replicas, False)), name="llm-off", route_prefix="/off")
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    print(f"READY http://127.0.0.1:{port}", flush=True)
    serve_until_sigterm(None)


if __name__ == "__main__":
    main()
