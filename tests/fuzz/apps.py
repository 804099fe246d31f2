"""The applications the fuzz suite attacks: an echo, a JSON API (FastAPI) and a locked one."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from surge import serve

api = FastAPI()


@api.exception_handler(RequestValidationError)
async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own handler echoes the input back and fails (500) when it cannot encode
    # it: a non-UTF-8 text/plain body, or 1e400 / NaN in JSON (FastAPI 0.165, found by
    # the fuzz suite). A hardened JSON app answers without echoing; see SECURITY.md.
    return JSONResponse({"detail": "the body is not a valid item"}, status_code=422)


class Item(BaseModel):
    name: str
    quantity: int


@api.post("/items")
async def create(item: Item) -> dict[str, Any]:
    # Not the name itself: JSON may carry a lone surrogate ("\ud800"), valid input that
    # no UTF-8 response can echo (the user code's 500, not surge's; found by the fuzz).
    return {"name_length": len(item.name), "quantity": item.quantity}


@serve.deployment(num_replicas=1, max_ongoing_requests=32)
@serve.ingress(api)
class JsonApi:
    pass


@serve.deployment(num_replicas=1, max_ongoing_requests=32)
class Echo:
    async def __call__(self, request: Request) -> Any:
        body = await request.body()
        return {"length": len(body), "headers": len(request.headers)}

    def ping(self, value: int) -> int:
        return value + 1
