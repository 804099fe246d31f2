"""The deployments the chaos scenarios run: small handlers with a way to break each one.

Replicas import this module by name (the repository root is on their sys.path), so the
classes live here rather than in a test module.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from surge import serve

# Short health checks, so a hung replica is caught within ~2 s (3 failed checks).
HEALTH_PERIOD_S = 0.5
HEALTH_TIMEOUT_S = 0.5
# What the broken constructor raises; the deploy error must carry it to the user.
BROKEN_MESSAGE = "chaos: the model weights are missing (raised on purpose)"


@serve.deployment(num_replicas=2, max_ongoing_requests=8,
                  health_check_period_s=HEALTH_PERIOD_S,
                  health_check_timeout_s=HEALTH_TIMEOUT_S, graceful_shutdown_timeout_s=1)
class Work:
    """Answers after `service_ms`; `?hang=1` makes this replica hang for good.

    A hung replica blocks its event loop (a blocking call inside async code, the
    classic bug): it answers nothing any more, health checks included.
    """

    def __init__(self, service_ms: float = 10.0) -> None:
        self.service_s = service_ms / 1000

    async def __call__(self, request: Any) -> Any:
        if request.query_params.get("hang"):
            # The loop blocks for good (until the controller kills the process) once this
            # answer left: a replica writes its frames on its loop's next turn, so a
            # request that blocked it at once could keep this answer in (seen in CI).
            asyncio.get_running_loop().call_later(0.1, time.sleep, 3600)
            return {"pid": os.getpid()}
        await asyncio.sleep(self.service_s)
        return "ok"


@serve.deployment(num_replicas=1, graceful_shutdown_timeout_s=1)
class Broken:
    """Every constructor call appends its pid to `attempts_file`, then raises."""

    def __init__(self, attempts_file: str) -> None:
        with open(attempts_file, "a") as out:
            out.write(f"{os.getpid()}\n")
        raise RuntimeError(BROKEN_MESSAGE)

    def __call__(self, request: Any) -> str:  # pragma: no cover - never constructed
        return "unreachable"


# Bounded capacity: at most MAX_REPLICAS x MAX_ONGOING requests run, MAX_QUEUED wait
# (the whole deployment's budget), each takes SERVICE_MS: about 80 requests/s served.
CAPPED_SERVICE_MS = 50.0
CAPPED_MAX_ONGOING = 2
CAPPED_MAX_QUEUED = 4
CAPPED_MAX_REPLICAS = 2


@serve.deployment(max_ongoing_requests=CAPPED_MAX_ONGOING,
                  max_queued_requests=CAPPED_MAX_QUEUED, graceful_shutdown_timeout_s=1,
                  autoscaling_config={"min_replicas": 1, "max_replicas": CAPPED_MAX_REPLICAS,
                                      "target_ongoing_requests": 1})
class Capped:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(CAPPED_SERVICE_MS / 1000)
        return "ok"


def capped_capacity_rps() -> float:
    return CAPPED_MAX_REPLICAS * CAPPED_MAX_ONGOING / (CAPPED_SERVICE_MS / 1000)
