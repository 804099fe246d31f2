"""A Ray Serve gRPC app as Ray's docs write one, for `surge run` of a YAML config."""

from __future__ import annotations

from typing import Any

from surge import serve
from tests.e2e.grpc_echo_proto import echo_pb2


@serve.deployment
class Greeter:
    def Say(self, request: Any) -> Any:
        return echo_pb2.EchoReply(text=f"hello {request.text}")


app = Greeter.bind()
