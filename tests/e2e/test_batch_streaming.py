"""@serve.batch as an LLM-style deployment uses it: (prompt, params) pairs batched into
one async generator that streams each caller its own tokens, over HTTP and handles at
once, with the batch size set at runtime from user_config."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from surge import serve

pytestmark = pytest.mark.e2e

HTTP_CALLS = {"h0": 2, "h1": 5, "h2": 3}  # prompt -> tokens wanted
HANDLE_CALLS = {"d0": 4, "d1": 1, "d2": 6}
CALLERS = len(HTTP_CALLS) + len(HANDLE_CALLS)


@serve.deployment(max_ongoing_requests=16, user_config={"max_batch_size": CALLERS})
class Generator:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def reconfigure(self, config: dict[str, int]) -> None:
        self.generate.set_max_batch_size(config["max_batch_size"])

    # The wait is long on purpose: a batch leaves only when it is full, so every caller
    # shares one batch however the calls arrive; without reconfigure's size it would be
    # batches of 2.
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=60)
    async def generate(self, prompts: list[str],
                       params: list[dict[str, int]]) -> AsyncIterator[list[Any]]:
        self.batches.append(sorted(prompts))
        for step in range(max(p["tokens"] for p in params)):
            yield [f"{prompt}:{step}" if step < p["tokens"] else StopIteration
                   for prompt, p in zip(prompts, params, strict=True)]

    async def __call__(self, request: Request) -> StreamingResponse:
        prompt = request.query_params["prompt"]
        params = {"tokens": int(request.query_params["tokens"])}

        async def lines() -> AsyncIterator[str]:
            async for token in self.generate(prompt, params):
                yield token + "\n"

        return StreamingResponse(lines(), media_type="text/plain")

    def batch_log(self) -> list[list[str]]:
        return self.batches


def expected(prompt: str, tokens: int) -> list[str]:
    return [f"{prompt}:{step}" for step in range(tokens)]


def test_streaming_batch_over_http_and_handles_at_once(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Generator.bind(), name="batchgen", route_prefix="/gen")
    stream = handle.options(stream=True)

    async def over_http(http: httpx.AsyncClient, prompt: str, tokens: int) -> list[str]:
        async with http.stream("GET", "/gen", params={"prompt": prompt,
                                                      "tokens": tokens}) as response:
            assert response.status_code == 200
            return [line async for line in response.aiter_lines() if line]

    async def over_handle(index: int, prompt: str, tokens: int) -> list[str]:
        # positional and keyword calls (named as the batch method names its lists) share
        # the batch alike
        call = (stream.generate.remote(prompt, {"tokens": tokens}) if index % 2 == 0 else
                stream.generate.remote(prompts=prompt, params={"tokens": tokens}))
        return [token async for token in call]

    async def everyone() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=surge_instance.url, timeout=90) as http:
            calls = [over_http(http, p, n) for p, n in HTTP_CALLS.items()]
            calls += [over_handle(i, p, n) for i, (p, n) in enumerate(HANDLE_CALLS.items())]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(everyone())
    wanted = [expected(p, n) for p, n in {**HTTP_CALLS, **HANDLE_CALLS}.items()]
    assert results == wanted
    assert handle.batch_log.remote().result(timeout_s=10) == [
        sorted([*HTTP_CALLS, *HANDLE_CALLS])]


def test_a_batch_generator_of_a_class_made_in_a_function_ends_its_streams(  # type: ignore[no-untyped-def]
        surge_instance) -> None:
    # A class defined in a function travels by value, and so does its batched method's
    # wrapper: the stream's end must still be recognised in the replica (it reached the
    # body as an object without encode(), and the client saw a truncated chunked body).
    @serve.deployment
    class Counter:
        @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
        async def count(self, limits: list[int]) -> AsyncIterator[list[Any]]:
            for step in range(max(limits)):
                yield [str(step) if step < limit else StopIteration for limit in limits]

        async def __call__(self, request: Request) -> StreamingResponse:
            return StreamingResponse(self.count(int(request.query_params["n"])))

    serve.run(Counter.bind(), name="batchlocal", route_prefix="/local")

    async def read(http: httpx.AsyncClient, n: int) -> str:
        response = await http.get("/local", params={"n": n})
        assert response.status_code == 200
        return response.text

    async def everyone() -> list[str]:
        async with httpx.AsyncClient(base_url=surge_instance.url, timeout=60) as http:
            return list(await asyncio.gather(*(read(http, n) for n in (1, 3, 5))))

    assert asyncio.run(everyone()) == ["0", "012", "01234"]
    serve.delete("batchlocal")
