"""The calibration app on surge: `python calibrate_surge.py PORT CONFIG_JSON`.

CONFIG_JSON: {"init_s": 1.0, "mu": ..., "sigma": ..., "deployment": {max_ongoing_requests,
max_queued_requests, autoscaling_config}}. The handler sleeps a lognormal service time
(no CPU burnt, so 2 cores can stand for many GPUs); the constructor sleeps `init_s` (the
model load). Prints `READY url` once the warm replicas (and standbys) are up, then
blocks. Run with SURGE_LOG_LEVEL=INFO: the controller's "started in X s" lines on stderr
are the measured start-up times.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

from until_sigterm import serve_until_sigterm, wait_for_replicas

from surge import serve


@serve.deployment
class Sleeper:
    def __init__(self, init_s: float, mu: float, sigma: float) -> None:
        time.sleep(init_s)
        self.rng = random.Random()
        self.mu, self.sigma = mu, sigma

    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(self.rng.lognormvariate(self.mu, self.sigma))
        return "ok"


def main() -> None:
    port, config = int(sys.argv[1]), json.loads(sys.argv[2])
    os.environ.setdefault("SURGE_LOG_LEVEL", "INFO")
    serve.start(http_options={"port": port})
    options = config["deployment"]
    app = Sleeper.options(**options).bind(config["init_s"], config["mu"], config["sigma"])
    serve.run(app, name="calibrate", route_prefix="/calibrate")
    scaling = options.get("autoscaling_config") or {}
    running, standby = scaling.get("min_replicas", 1), scaling.get("standby_replicas", 0)
    wait_for_replicas(serve, "calibrate", {"RUNNING": running, "STANDBY": standby}, 60)
    print(f"READY http://127.0.0.1:{port}/calibrate", flush=True)
    serve_until_sigterm(serve.shutdown)


if __name__ == "__main__":
    main()
