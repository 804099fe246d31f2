"""For the standby tests (mock engines and vLLM): replica states from the controller,
and a hold-then-probe run: a long stream fills the running replica's one slot
(max_ongoing_requests 1), then a probe is sent, which only a second replica can answer
while the hold lasts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from surge.api.instance import current


def states(app: str) -> dict[str, str]:
    """{replica id: state} of the app's replicas, from the controller's table."""
    found = current()
    assert found is not None
    return {r["replica_id"]: r["state"] for r in found.call("replicas", timeout=10)
            if r["app"] == app}


def chat(model: str, max_tokens: int, n: int = 1) -> dict[str, Any]:
    return {"model": model, "stream": True, "max_tokens": max_tokens, "n": n,
            "ignore_eos": True, "messages": [{"role": "user", "content": "hello there"}]}


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                  first: asyncio.Future[float]) -> None:
    async with client.stream("POST", path, json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if not first.done() and '"content"' in line:
                first.set_result(time.monotonic())


async def hold_then_probe(url: str, path: str, hold: dict[str, Any], probe: dict[str, Any],
                          timeout_s: float) -> tuple[float, bool]:
    """(seconds from sending the probe to its first token, whether the hold was still
    streaming then)."""
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        held: asyncio.Future[float] = loop.create_future()
        holding = asyncio.ensure_future(_stream(client, path, hold, held))
        await asyncio.wait_for(asyncio.shield(held), timeout_s)
        probed: asyncio.Future[float] = loop.create_future()
        sent = time.monotonic()
        answer = asyncio.ensure_future(_stream(client, path, probe, probed))
        token = await asyncio.wait_for(asyncio.shield(probed), timeout_s)
        still = not holding.done()
        holding.cancel()
        await answer
        return token - sent, still
