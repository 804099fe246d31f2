"""A deployment that failed to start answers at once: HTTP 503, DeploymentUnavailableError.

Found by the chaos suite (tests/chaos, "__init__ raises"): requests to a DEPLOY_FAILED
application waited in the proxy's queue until the client gave up.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from surge import serve
from surge.errors import DeployFailedError, DeploymentUnavailableError
from tests.e2e.conftest import Running

pytestmark = pytest.mark.e2e

SECRET = "/opt/models/private-weights.bin is missing"


@serve.deployment(num_replicas=1, graceful_shutdown_timeout_s=1)
class NeverStarts:
    def __init__(self) -> None:
        raise RuntimeError(SECRET)

    def __call__(self, request: Any) -> str:  # pragma: no cover - never constructed
        return "unreachable"


def test_a_failed_deployment_answers_at_once(surge_instance: Running,
                                             client: httpx.Client) -> None:
    with pytest.raises(DeployFailedError, match="private-weights"):
        serve.run(NeverStarts.bind(), name="never", route_prefix="/never")
    # Without an answer the request would wait for its client's timeout (10 s here).
    response = client.get("/never", timeout=10)
    assert response.status_code == 503
    assert "retry-after" not in response.headers  # as Ray's
    assert "failed to start" in response.text
    assert "private-weights" not in response.text  # the traceback is the operator's
    handle = serve.get_app_handle("never")
    with pytest.raises(DeploymentUnavailableError, match="failed to start"):
        handle.remote().result(timeout_s=10)
    serve.delete("never")
