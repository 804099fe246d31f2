"""The autoscaling-step app on Ray Serve 2.60: `python step_ray.py PORT default|tuned`.

Replicas ask for num_cpus=0.25 so that 8 fit on 2 cores. Prints READY, then a
`REPLICAS wall running target` line every 100 ms (target: running + starting).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

from ray import serve

BASE = {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 2}
CASES: dict[str, dict[str, Any]] = {
    "default": BASE,
    "tuned": {**BASE, "upscale_delay_s": 0, "metrics_interval_s": 0.5,
              "look_back_period_s": 2, "upscaling_factor": 2},
}


@serve.deployment(max_ongoing_requests=5, ray_actor_options={"num_cpus": 0.25})
class Step:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(0.02)
        return "ok"


def main() -> None:
    port, case = int(sys.argv[1]), sys.argv[2]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Step.options(autoscaling_config=CASES[case]).bind(), name="step",
              route_prefix="/step")
    print(f"READY http://127.0.0.1:{port}/step", flush=True)

    def stop(*_: Any) -> None:
        serve.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        try:
            overview = serve.status().applications["step"].deployments["Step"]
            states = overview.replica_states
            running = states.get("RUNNING", 0)
            target = running + states.get("STARTING", 0) + states.get("UPDATING", 0)
            print(f"REPLICAS {time.time():.3f} {running} {target}", flush=True)
        except Exception as exc:  # status can fail transiently while scaling
            print(f"# status failed: {exc!r}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
