"""The echo app from the README: `surge run examples.echo:app` or `python examples/demo.py`."""

from __future__ import annotations

from typing import Any

from surge import serve


@serve.deployment(max_ongoing_requests=100)
class Echo:
    async def __call__(self, request: Any) -> dict[str, str]:
        return {"echo": request.query_params.get("value", "")}

    def double(self, value: int) -> int:
        return value * 2


app = Echo.bind()
