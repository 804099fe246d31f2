"""A proxy that stops drains its gRPC calls: the calls in flight end with their answer,
health watchers hear NOT_SERVING, and the connection is told GOAWAY (no new calls on
it) before it closes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from surge import serve
from tests.e2e.conftest import running_instance
from tests.e2e.dashboard_tools import at_replicas
from tests.e2e.grpc_echo_proto import SERVICER, echo_pb2, echo_pb2_grpc
from tests.e2e.procs import alive, surge_processes
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e


@serve.deployment
class Echo:
    async def Slow(self, request: Any) -> Any:
        await asyncio.sleep(request.sleep_s)
        return echo_pb2.EchoReply(text="slept")


@pytest.fixture
def target() -> Iterator[str]:
    port = free_port()
    options = {"grpc_options": {"port": port, "grpc_servicer_functions": [SERVICER],
                                "enable_health_service": True}}
    with running_instance(start_options=options):
        serve.run(Echo.bind(), name="drain", route_prefix="/drain")
        yield f"127.0.0.1:{port}"


def test_a_stopping_proxy_finishes_its_calls_and_tells_watchers(target: str) -> None:
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    health_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    proxy = next(pid for pid, title in surge_processes(os.getpid()).items()
                 if title.startswith("surge:proxy"))
    with grpc.insecure_channel(target) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        watch = health_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(),
                                                      timeout=20)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        replies: list[Any] = []
        slow = threading.Thread(target=lambda: replies.append(stub.Slow(
            echo_pb2.EchoRequest(sleep_s=1.5), timeout=20)))
        slow.start()
        eventually(lambda: at_replicas("drain") == 1, 10, what="the call at its replica")
        os.kill(proxy, signal.SIGTERM)  # the proxy this test's instance started
        stopped = time.monotonic()
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        slow.join(timeout=20)
        assert [reply.text for reply in replies] == ["slept"]
        # The watch stays open: the drain waits for the slow call, not for it (a drain
        # lasts at most 5 s; this one about the 1 s the call had left).
        eventually(lambda: not alive(proxy), 10, what="the drained proxy to exit")
        assert time.monotonic() - stopped < 4.0
