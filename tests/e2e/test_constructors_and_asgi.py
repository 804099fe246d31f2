"""Constructors and ASGI apps as Ray Serve runs them, written the way apps use them.

A constructor that starts a background task, an `async def __init__`, `__del__` on a
graceful stop; FastAPI with a lifespan that loads a model; every `serve.ingress` form
(APIRouter, builder function, `__serve_build_asgi_app__`, app only); route options kept;
a child deployment's backpressure answered 503 through a FastAPI ingress.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel

from surge import serve
from surge.errors import DeployFailedError
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(surge_instance) -> Iterator[httpx.Client]:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=surge_instance.url, timeout=30) as http:
        yield http


# -- constructors -----------------------------------------------------------------------


@serve.deployment
class Refreshing:
    """Starts a refresh loop in __init__, as apps that poll a feature store do."""

    def __init__(self) -> None:
        self.refreshes = 0
        self.loop_running = asyncio.get_running_loop().is_running()
        self.task = asyncio.create_task(self.refresh())

    async def refresh(self) -> None:
        while True:
            self.refreshes += 1
            await asyncio.sleep(0.05)

    async def __call__(self) -> dict[str, Any]:
        return {"refreshes": self.refreshes, "loop_running": self.loop_running}


def test_a_constructor_can_start_background_tasks(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Refreshing.bind(), name="refreshing", route_prefix=None)
    first = handle.remote().result(timeout_s=10)
    assert first["loop_running"] is True
    eventually(lambda: handle.remote().result(timeout_s=10)["refreshes"] > first["refreshes"],
               10, what="the refresh task running")
    serve.delete("refreshing")


@serve.deployment
class AsyncInit:
    async def __init__(self, value: str) -> None:
        await asyncio.sleep(0.01)
        self.value = value

    def __call__(self) -> str:
        return self.value


def test_an_async_constructor_is_awaited(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(AsyncInit.bind("ready"), name="async-init", route_prefix=None)
    assert handle.remote().result(timeout_s=10) == "ready"
    serve.delete("async-init")


@serve.deployment
class SyncDestructor:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self) -> str:
        return "alive"

    def __del__(self) -> None:
        with open(self.marker, "a") as out:
            out.write("sync\n")


@serve.deployment
class AsyncDestructor:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self) -> str:
        return "alive"

    async def __del__(self) -> None:
        await asyncio.sleep(0.01)
        with open(self.marker, "a") as out:
            out.write("async\n")


def test_del_runs_once_on_a_graceful_stop(surge_instance, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for name, cls in (("sync", SyncDestructor), ("async", AsyncDestructor)):
        marker = tmp_path / f"{name}.txt"
        handle = serve.run(cls.bind(str(marker)), name=f"del-{name}", route_prefix=None)
        assert handle.remote().result(timeout_s=10) == "alive"
        assert not marker.exists()
        serve.delete(f"del-{name}")  # waits until the replica is gone
        assert marker.read_text() == f"{name}\n"


# -- FastAPI lifespan -------------------------------------------------------------------


def lifespan_app(marker: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def load_model(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        await asyncio.sleep(0.01)  # "load the weights"
        yield {"model": "tiny-model-v1"}
        Path(marker).write_text("unloaded\n")

    app = FastAPI(lifespan=load_model)

    @app.get("/predict")
    def predict(request: Request) -> dict[str, str]:
        return {"model": request.state.model}

    return app


@serve.deployment
@serve.ingress()
class WithLifespan:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __serve_build_asgi_app__(self) -> FastAPI:
        return lifespan_app(self.marker)


def test_fastapi_lifespan_loads_before_serving_and_unloads_on_stop(  # type: ignore[no-untyped-def]
        surge_instance, client: httpx.Client, tmp_path: Path) -> None:
    marker = tmp_path / "unloaded.txt"
    serve.run(WithLifespan.bind(str(marker)), name="lifespan", route_prefix="/lifespan")
    assert client.get("/lifespan/predict").json() == {"model": "tiny-model-v1"}
    assert not marker.exists()
    serve.delete("lifespan")
    assert marker.read_text() == "unloaded\n"


@contextlib.asynccontextmanager
async def failing_load(app: FastAPI) -> AsyncIterator[None]:
    raise RuntimeError("weights not found at /models/missing")
    yield


failing_app = FastAPI(lifespan=failing_load)


@serve.deployment(max_constructor_retry_count=1)
@serve.ingress(failing_app)
class FailingLifespan:
    pass


def test_a_failed_lifespan_startup_fails_the_deploy_with_its_reason(surge_instance) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DeployFailedError, match="weights not found at /models/missing"):
        serve.run(FailingLifespan.bind(), name="bad-lifespan", route_prefix="/bad-lifespan")
    serve.delete("bad-lifespan")


# -- serve.ingress forms ----------------------------------------------------------------


router = APIRouter(prefix="/v1")


class Item(BaseModel):
    name: str
    price: float | None = None


@serve.deployment
@serve.ingress(router)
class RouterIngress:
    def __init__(self, currency: str) -> None:
        self.currency = currency

    @router.get("/price", summary="the price", deprecated=True)
    def price(self) -> dict[str, str]:
        return {"currency": self.currency}

    @router.post("/items", response_model=Item, response_model_exclude_unset=True)
    def create(self, item: Item) -> Item:
        return item


def test_an_apirouter_ingress_with_class_methods(surge_instance, client: httpx.Client) -> None:  # type: ignore[no-untyped-def]
    serve.run(RouterIngress.bind("EUR"), name="router", route_prefix="/shop")
    assert client.get("/shop/v1/price").json() == {"currency": "EUR"}
    # response_model_exclude_unset survived the binding: no "price": null.
    assert client.post("/shop/v1/items", json={"name": "pen"}).json() == {"name": "pen"}
    serve.delete("router")


api_with_options = FastAPI()


@serve.deployment
@serve.ingress(api_with_options)
class RouteOptions:
    @api_with_options.get("/old", summary="the old way", deprecated=True,
                          openapi_extra={"x-owner": "search"}, status_code=202)
    def old(self) -> str:
        return "old"


def test_route_options_are_kept_when_routes_are_bound(  # type: ignore[no-untyped-def]
        surge_instance, client: httpx.Client) -> None:
    serve.run(RouteOptions.bind(), name="options", route_prefix="/options")
    response = client.get("/options/old")
    assert response.status_code == 202 and response.json() == "old"
    operation = client.get("/options/openapi.json").json()["paths"]["/old"]["get"]
    assert operation["summary"] == "the old way"
    assert operation["deprecated"] is True
    assert operation["x-owner"] == "search"
    serve.delete("options")


BUILT_IN_REPLICA: list[int] = []


def build_asgi_app() -> FastAPI:
    app = FastAPI()
    BUILT_IN_REPLICA.append(threading.get_ident())  # runs in the replica, not here

    @app.get("/built")
    def built() -> dict[str, int]:
        return {"builds": len(BUILT_IN_REPLICA)}

    return app


BuilderIngress = serve.deployment(serve.ingress(build_asgi_app)())


def test_a_builder_function_makes_the_app_in_the_replica(  # type: ignore[no-untyped-def]
        surge_instance, client: httpx.Client) -> None:
    serve.run(BuilderIngress.bind(), name="builder", route_prefix="/builder")
    assert client.get("/builder/built").json() == {"builds": 1}
    assert BUILT_IN_REPLICA == []  # the driver never called it
    serve.delete("builder")


def test_ingress_refuses_what_ray_refuses() -> None:
    with pytest.raises(ValueError, match="may not have __call__"):
        @serve.ingress(FastAPI())
        class Callable:
            def __call__(self) -> None: ...
    with pytest.raises(ValueError, match="__serve_build_asgi_app__"):
        @serve.ingress()
        class NoApp:
            pass


# -- backpressure through FastAPI -------------------------------------------------------


@serve.deployment(max_ongoing_requests=1, max_queued_requests=0)
class SlowModel:
    async def __call__(self) -> str:
        await asyncio.sleep(2.0)
        return "done"


front = FastAPI()


@serve.deployment
@serve.ingress(front)
class Front:
    def __init__(self, model: Any) -> None:
        self.model = model

    @front.get("/infer")
    async def infer(self) -> str:
        result: str = await self.model.remote()
        return result


def test_a_childs_backpressure_is_a_503_through_fastapi(surge_instance) -> None:  # type: ignore[no-untyped-def]
    serve.run(Front.bind(SlowModel.bind()), name="front", route_prefix="/front")

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=surge_instance.url, timeout=30) as http:
            return list(await asyncio.gather(*(http.get("/front/infer") for _ in range(4))))

    responses = asyncio.run(burst())
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 503 in codes, codes
    refused = next(r for r in responses if r.status_code == 503)
    assert "retry-after" not in refused.headers  # Ray's count bound, none configured
    assert "backpressure" in refused.text
    serve.delete("front")
