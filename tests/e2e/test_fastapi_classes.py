"""FastAPI apps where Ray Serve's users write them: ingress classes defined inside a
function (a test body, a factory), so shipped by value with `<locals>` in their qualname,
and apps that include routers.

The client is made after the classes: a pydantic model defined in a function keeps that
function's locals, and an open client's SSL context cannot travel to a replica.
"""

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, BackgroundTasks, Depends, FastAPI, WebSocket
from pydantic import BaseModel
from websockets.sync.client import connect

from surge import serve
from surge.errors import RayServeException
from tests.e2e.conftest import answer_once
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


def make_counter_app(start: int) -> Any:
    """A factory, as apps built per configuration are written."""
    app = FastAPI()

    class Count(BaseModel):
        value: int

    def step() -> int:
        return 2

    class Base:
        def __init__(self) -> None:
            self.count = start

        @app.get("/base")
        def base(self) -> int:  # inherited: bound to the subclass's instance
            return self.count

    @serve.deployment
    @serve.ingress(app)
    class Counter(Base):
        @app.post("/add/{amount}", response_model=Count)
        def add(self, amount: int, by: int = Depends(step)) -> Any:
            self.count += amount * by
            return {"value": self.count, "ignored": "by response_model"}

        @app.get("/count")
        async def read(self) -> int:
            return self.count

        @app.websocket("/ws")
        async def ws(self, websocket: WebSocket) -> None:
            await answer_once(websocket, lambda name: f"{name}:{self.count}")

    return Counter


def test_a_class_made_in_a_function_binds_self(surge_instance) -> None:  # type: ignore[no-untyped-def]
    serve.run(make_counter_app(10).bind(), name="counter", route_prefix="/counter")
    with httpx.Client(base_url=surge_instance.url, timeout=30) as client:
        assert client.get("/counter/count").json() == 10
        added = client.post("/counter/add/3")
        assert added.status_code == 200, added.text
        assert added.json() == {"value": 16}
        assert client.get("/counter/base").json() == 16
        assert client.post("/counter/add/x").status_code == 422  # the path param's type
        schema = client.get("/counter/openapi.json").json()
        parameters = schema["paths"]["/add/{amount}"]["post"]["parameters"]
        assert [p["name"] for p in parameters] == ["amount"]  # no `self`
    ws_url = surge_instance.url.replace("http", "ws") + "/counter/ws"
    with connect(ws_url) as socket:
        socket.send("n")
        assert socket.recv(timeout=10) == "n:16"
    serve.delete("counter")


def test_a_class_in_a_test_body_with_an_included_router(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = FastAPI()
    router = APIRouter(prefix="/v1")

    @router.get("/free")
    def free() -> str:
        return "free"

    app.include_router(router)  # FastAPI keeps a lock per included router

    @serve.deployment
    @serve.ingress(app)
    class Local:
        def __init__(self, greeting: str) -> None:
            self.greeting = greeting

        @app.get("/v1/hello/{name}")
        def hello(self, name: str) -> str:
            return f"{self.greeting} {name}"

    @app.get("/late")  # after the decoration: as in Ray, which froze the app there
    def late() -> str:
        return "late"

    serve.run(Local.bind("hi"), name="local", route_prefix="/local")
    with httpx.Client(base_url=surge_instance.url, timeout=30) as client:
        assert client.get("/local/v1/hello/ann").json() == "hi ann"
        assert client.get("/local/v1/free").json() == "free"
        assert client.get("/local/late").status_code == 404
    serve.delete("local")


def test_two_fastapi_ingresses_in_one_application_are_refused(surge_instance) -> None:  # type: ignore[no-untyped-def]
    first_app, second_app = FastAPI(), FastAPI()

    @serve.deployment
    @serve.ingress(second_app)
    class Inner:
        @second_app.get("/")
        def root(self) -> str:
            return "inner"

    @serve.deployment
    @serve.ingress(first_app)
    class Outer:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        @first_app.get("/")
        def root(self) -> str:
            return "outer"

    with pytest.raises(RayServeException,
                       match='Found multiple FastAPI deployments in application "two"'):
        serve.run(Outer.bind(Inner.bind()), name="two", route_prefix="/two")
    assert "two" not in serve.status().applications  # nothing was deployed


def test_an_app_shared_by_two_ingress_classes_serves_each_its_own_routes(  # type: ignore[no-untyped-def]
        surge_instance) -> None:
    app = FastAPI()

    @serve.deployment
    @serve.ingress(app)
    class First:
        @app.get("/")
        def root(self) -> str:
            return "first"

        @app.get("/one")
        def one(self) -> str:
            return "one"

    @serve.deployment
    @serve.ingress(app)
    class Second:
        @app.get("/")
        def root(self) -> str:
            return "second"

        @app.get("/two")
        def two(self) -> str:
            return "two"

    serve.run(First.bind(), name="first", route_prefix="/first")
    serve.run(Second.bind(), name="second", route_prefix="/second")
    with httpx.Client(base_url=surge_instance.url, timeout=30) as client:
        assert client.get("/first/").json() == "first"
        assert client.get("/second/").json() == "second"  # not First.root without self
        assert client.get("/first/one").json() == "one"
        assert client.get("/second/two").json() == "two"
        assert client.get("/first/two").status_code == 404
        assert client.get("/second/one").status_code == 404
    serve.delete("first")
    serve.delete("second")


def test_a_background_task_runs_after_the_response_is_sent(surge_instance,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    gate, done = tmp_path / "gate", tmp_path / "done"
    app = FastAPI()

    def finish() -> None:  # waits for the test to have had its answer
        deadline = time.monotonic() + 30
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        done.write_text("written")

    @serve.deployment
    @serve.ingress(app)
    class Tasks:
        @app.get("/")
        def start(self, tasks: BackgroundTasks) -> str:
            tasks.add_task(finish)
            return "answered"

    serve.run(Tasks.bind(), name="tasks", route_prefix="/tasks")
    answer = httpx.get(f"{surge_instance.url}/tasks/", timeout=20)
    assert answer.json() == "answered" and not done.exists()  # the task has not run yet
    gate.touch()
    eventually(done.exists, 10, what="the background task to finish after the answer")
    serve.delete("tasks")
