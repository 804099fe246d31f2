"""Ray Serve 2.60 surfaces apps use: request context, status and handles from async
replica code, DEPLOY_FAILED as Ray reports it, and serve.status() with nothing running."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from surge.errors import RequestCancelledError
from surge.serve.context import _get_serve_request_context
from surge.serve.schema import ApplicationStatus, DeploymentStatus
from tests.e2e.conftest import Running
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e


@serve.deployment
class Other:
    def __call__(self, x: int = 0) -> int:
        return x + 1


@serve.deployment
class Introspect:
    async def __call__(self, request: Any) -> dict[str, Any]:
        context = _get_serve_request_context()
        status = serve.status()  # from async code on the replica's own loop
        other = serve.get_app_handle("other")
        return {"route": context.route, "request_id": context.request_id,
                "app": context.app_name, "model": context.multiplexed_model_id,
                "http": context.is_http_request,
                "other_status": status.applications["other"].status.value,
                "other_answer": await other.remote(41)}

    def from_handle(self) -> dict[str, Any]:
        context = _get_serve_request_context()
        return {"request_id": context.request_id, "app": context.app_name,
                "http": context.is_http_request, "model": context.multiplexed_model_id}


@serve.deployment
class Counting:
    def __init__(self) -> None:
        self.produced = 0

    def _secret(self) -> str:  # Ray lets handles call methods with one underscore
        return "hidden but callable"

    async def numbers(self) -> Any:
        for i in range(1_000_000):
            self.produced += 1
            yield i

    def count(self) -> int:
        return self.produced


@serve.deployment(max_constructor_retry_count=1)
class Broken:
    def __init__(self) -> None:
        raise ValueError("no weights here")


@pytest.fixture(scope="module")
def apps(surge_instance: Running) -> Iterator[Running]:
    serve.run(Other.bind(), name="other", route_prefix="/other")
    serve.run(Introspect.bind(), name="intro", route_prefix="/intro")
    yield surge_instance
    for name in ("intro", "other"):
        serve.delete(name)


def test_a_request_sees_its_context_and_may_ask_for_status_and_handles(apps: Running) -> None:
    response = httpx.get(f"{apps.url}/intro", timeout=30,
                         headers={"x-request-id": "req-7", "serve_multiplexed_model_id": "m3"})
    assert response.status_code == 200
    assert response.json() == {"route": "/intro", "request_id": "req-7", "app": "intro",
                               "model": "m3", "http": True, "other_status": "RUNNING",
                               "other_answer": 42}


def test_a_handle_call_sees_its_context(apps: Running) -> None:
    handle = serve.get_app_handle("intro").options(multiplexed_model_id="m9")
    seen = handle.from_handle.remote().result(timeout_s=30)
    assert seen["app"] == "intro" and seen["model"] == "m9" and seen["http"] is False
    assert seen["request_id"]  # a handle call gets an id too


def test_a_constructor_that_keeps_failing_is_deploy_failed_as_ray_reports_it(
        apps: Running) -> None:
    with pytest.raises(RuntimeError, match="no weights here"):  # as Ray's serve.run raises
        serve.run(Broken.bind(), name="broken", route_prefix="/broken")
    overview = serve.status().applications["broken"]
    assert overview.status is ApplicationStatus.DEPLOY_FAILED
    assert overview.deployments["Broken"].status is DeploymentStatus.DEPLOY_FAILED
    serve.delete("broken")


def test_status_with_nothing_running_is_empty() -> None:
    program = ("from surge import serve; s = serve.status(); "
               "print(len(s.applications), repr(s.http_address))")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=60, env={**os.environ,
                                          "SURGE_ADDRESS": f"127.0.0.1:{free_port()}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "''"]


def test_the_traceback_shows_the_users_frames_not_surges(apps: Running) -> None:
    with pytest.raises(RuntimeError) as raised:
        serve.run(Broken.bind(), name="broken2", route_prefix="/broken2")
    message = str(raised.value)
    assert "in __init__" in message and "ValueError: no weights here" in message
    assert "surge/replica" not in message and "surge/api" not in message
    serve.delete("broken2")


def test_private_methods_request_ids_and_cancelling_a_stream(apps: Running) -> None:
    handle = serve.run(Counting.bind(), name="counting", route_prefix=None)
    assert handle._secret.remote().result(timeout_s=30) == "hidden but callable"
    first, second = handle.count.remote(), handle.count.remote()
    assert first.request_id and first.request_id != second.request_id
    stream = handle.options(stream=True).numbers.remote()
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.cancel()
    assert stream.cancelled()
    with pytest.raises(RequestCancelledError):
        for _ in stream:  # what was already on its way may still come; then it ends
            pass
    produced = eventually(lambda: (n := handle.count.remote().result(timeout_s=30))
                          == handle.count.remote().result(timeout_s=30) and n, 10,
                          what="the cancelled generator to stop")
    assert produced < 1_000_000
    serve.delete("counting")
