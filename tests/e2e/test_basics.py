"""The Quick-start path: deploy, call by HTTP and by handle, status, delete."""

from __future__ import annotations

import httpx
import pytest

from surge import serve
from surge.model import ApplicationStatus, DeploymentStatus

pytestmark = pytest.mark.e2e


@serve.deployment(num_replicas=1, max_ongoing_requests=2, max_queued_requests=4)
class Echo:
    async def __call__(self, request):  # type: ignore[no-untyped-def]
        return {"echo": request.query_params.get("value", "")}

    def double(self, value: int) -> int:
        return value * 2


def test_echo_by_http_and_handle(surge_instance, client: httpx.Client) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    assert handle.double.remote(4).result(timeout_s=15) == 8
    response = client.get("/echo", params={"value": "x"})
    assert response.status_code == 200
    assert response.json() == {"echo": "x"}
    assert response.headers["x-request-id"]
    status = serve.status()
    app = status.applications["echo"]
    assert app.status is ApplicationStatus.RUNNING
    assert app.deployments["Echo"].status is DeploymentStatus.HEALTHY
    assert app.deployments["Echo"].replica_states == {"RUNNING": 1}
    serve.delete("echo")
    assert "echo" not in serve.status().applications
    assert client.get("/echo").status_code == 404
