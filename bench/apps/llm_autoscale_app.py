"""An OpenAI app on mock vLLM engines, autoscaled, for bench/llm_sim_vs_real.py:
`python llm_autoscale_app.py PORT CONFIG_JSON`.

CONFIG_JSON: {"engine_kwargs": {...EngineTiming fields}, "deployment": {max_ongoing_requests,
max_queued_requests, autoscaling_config}}. `build_openai_app` on
`surge.testing:MockVLLMEngine` with those settings; prints `READY url` once the
autoscaling floor's replicas run, then blocks until SIGTERM. Run with
SURGE_LOG_LEVEL=INFO: the controller's "started in X s" lines on stderr are the
replicas' measured start-up times.
"""

from __future__ import annotations

import json
import os
import sys

from until_sigterm import serve_until_sigterm, wait_for_replicas

from surge import serve
from surge.serve.llm import build_openai_app


def main() -> None:
    port, config = int(sys.argv[1]), json.loads(sys.argv[2])
    os.environ.setdefault("SURGE_LOG_LEVEL", "INFO")
    serve.start(http_options={"port": port})
    deployment = config["deployment"]
    serve.run(build_openai_app({"llm_configs": [{
        "model_loading_config": {"model_id": "mock"},
        "llm_engine": "surge.testing:MockVLLMEngine",
        "engine_kwargs": config["engine_kwargs"],
        "deployment_config": deployment}]}), name="llm", route_prefix="/")
    floor = (deployment.get("autoscaling_config") or {}).get("min_replicas", 1)
    # one model: its LLMServer is the ingress
    wait_for_replicas(serve, "llm", {"RUNNING": floor}, 120)
    print(f"READY http://127.0.0.1:{port}", flush=True)
    serve_until_sigterm(serve.shutdown)


if __name__ == "__main__":
    main()
