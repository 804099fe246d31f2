"""The multiplexing benchmark's app, on surge or Ray Serve 2.60 (the same code).

`python multiplex_app.py surge|ray PORT REPLICAS`: two applications, `/models` (REPLICAS
replicas, the mix) and `/single` (one replica: do two different models load at once?).
Each loads a model by sleeping 200 ms, holds at most 3 models (@serve.multiplexed's
default), runs a request for `work` seconds (query parameter, default 0.02) and answers
which replica it is, whether the model was resident when the request arrived, how many
loads that replica did and the models it holds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from until_sigterm import serve_until_sigterm

if sys.argv[1] == "ray":
    from ray import serve
else:
    from surge import serve  # type: ignore[no-redef]

LOAD_S = 0.2


class Model:
    def __init__(self, model_id: str, resident: set[str]) -> None:
        self.model_id = model_id
        self.resident = resident
        resident.add(model_id)

    def __del__(self) -> None:  # both systems call it when they evict the model
        self.resident.discard(self.model_id)


class Models:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.resident: set[str] = set()
        self.loads = 0

    @serve.multiplexed(max_num_models_per_replica=3)
    async def get_model(self, model_id: str) -> Model:
        self.loads += 1
        await asyncio.sleep(LOAD_S)
        return Model(model_id, self.resident)

    async def __call__(self, request: Any) -> dict[str, Any]:
        model_id = serve.get_multiplexed_model_id()
        hit = model_id in self.resident
        await self.get_model(model_id)
        await asyncio.sleep(float(request.query_params.get("work", "0.02")))
        return {"pid": self.pid, "hit": hit, "loads": self.loads,
                "held": sorted(self.resident)}


def main() -> None:
    port, replicas = int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # num_cpus 0: Ray would place only two 1-CPU replicas on this 2-core machine
    deployment = serve.deployment(Models, max_ongoing_requests=8,
                                  ray_actor_options={"num_cpus": 0})
    serve.run(deployment.options(num_replicas=replicas).bind(), name="models",
              route_prefix="/models")
    serve.run(deployment.options(name="Single", num_replicas=1).bind(), name="single",
              route_prefix="/single")
    print(f"READY http://127.0.0.1:{port}/models", flush=True)

    serve_until_sigterm(serve.shutdown)


if __name__ == "__main__":
    main()
