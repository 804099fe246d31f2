"""The autoscaling-step app on surge: `python step_surge.py PORT CASE`.

CASE: ray_default | ray_tuned | proactive | proactive_standby. Prints READY, then a
`REPLICAS wall running target` line every 100 ms.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from until_sigterm import wait_for_replicas

from surge import serve

BASE = {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 2}
CASES: dict[str, dict[str, Any]] = {
    "ray_default": {**BASE, "policy": {"policy_function": "ray_default"}},
    "ray_tuned": {**BASE, "upscale_delay_s": 0, "metrics_interval_s": 0.5,
                  "look_back_period_s": 2, "upscaling_factor": 2,
                  "policy": {"policy_function": "ray_default"}},
    "proactive": {**BASE},
    "proactive_standby": {**BASE, "standby_replicas": 2},
}


@serve.deployment(max_ongoing_requests=5)
class Step:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(0.02)
        return "ok"


def main() -> None:
    port, case = int(sys.argv[1]), sys.argv[2]
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    serve.start(http_options={"port": port})
    serve.run(Step.options(autoscaling_config=CASES[case]).bind(), name="step",
              route_prefix="/step")
    wait_for_replicas(serve, "step", {"STANDBY": CASES[case].get("standby_replicas", 0)}, 30)
    print(f"READY http://127.0.0.1:{port}/step", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        overview = serve.status().applications["step"].deployments["Step"]
        running = overview.replica_states.get("RUNNING", 0)
        print(f"REPLICAS {time.time():.3f} {running} {overview.target_replicas}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
