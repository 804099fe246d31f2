"""`backpressure_config` (Ray Serve 2.60): 429 instead of 503, and a fixed Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from surge.errors import BackPressureError
from surge.serve.config import BackpressureConfig
from tests.e2e.conftest import Running

pytestmark = pytest.mark.e2e


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1,
                  backpressure_config=BackpressureConfig(status_code=429, retry_after_s=2.5))
class Polite:
    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(1.0)
        return "done"

    async def wait(self) -> str:
        await asyncio.sleep(1.0)
        return "done"


@pytest.fixture(scope="module")
def polite(surge_instance: Running) -> Iterator[Running]:
    serve.run(Polite.bind(), name="polite", route_prefix="/polite")
    yield surge_instance
    serve.delete("polite")


def test_over_the_queue_budget_is_429_with_the_configured_retry_after(polite: Running) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=polite.url, timeout=30,
                                     limits=httpx.Limits(max_connections=5)) as client:
            return await asyncio.gather(*(client.get("/polite") for _ in range(5)))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 429, 429, 429]  # one runs, one waits, three turned away
    for response in responses:
        if response.status_code == 429:
            assert response.headers["retry-after"] == "3"  # 2.5 s, rounded up


def test_handles_get_backpressure_error_with_the_configured_numbers(polite: Running) -> None:
    handle = serve.get_app_handle("polite")
    calls = [handle.wait.remote() for _ in range(5)]
    outcomes: list[Any] = []
    for call in calls:
        try:
            outcomes.append(call.result(timeout_s=30))
        except BackPressureError as exc:
            outcomes.append((exc.status_code, exc.retry_after_s))
    assert sorted(outcomes, key=str) == [(429, 2.5)] * 3 + ["done"] * 2
