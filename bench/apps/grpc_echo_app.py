"""The gRPC echo app, on surge or on Ray Serve 2.60 (the same code, Ray's API).

    python grpc_echo_app.py surge|ray HTTP_PORT GRPC_PORT

The generated `bench_echo_pb2*` modules must be importable (bench/grpc_echo.py compiles
them and puts their directory on PYTHONPATH). `Say` echoes its payload, `Many` streams
it back `count` times, `__call__` is the same echo over HTTP (for the CPU comparison).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import bench_echo_pb2 as pb
from until_sigterm import serve_until_sigterm

SYSTEM = sys.argv[1]
if SYSTEM == "surge":
    from surge import serve
    from surge.serve.config import gRPCOptions
else:
    from ray import serve
    from ray.serve.config import gRPCOptions

SERVICER = "bench_echo_pb2_grpc.add_EchoServicer_to_server"


@serve.deployment(max_ongoing_requests=100)
class Echo:
    async def Say(self, request: Any) -> Any:
        return pb.EchoReply(payload=request.payload)

    async def Many(self, request: Any) -> Any:
        for index in range(request.count):
            yield pb.EchoReply(payload=request.payload, index=index)

    async def __call__(self, request: Any) -> dict[str, str]:
        return {"echo": request.query_params.get("value", "")}


def main() -> None:
    http_port, grpc_port = int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    if SYSTEM != "surge":  # a cluster of its own, never one that another program started
        import ray

        ray.init(address="local", include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": http_port},
                grpc_options=gRPCOptions(port=grpc_port, grpc_servicer_functions=[SERVICER]))
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    print(f"READY http://127.0.0.1:{http_port}/echo?value=x grpc=127.0.0.1:{grpc_port}",
          flush=True)

    serve_until_sigterm(serve.shutdown)


if __name__ == "__main__":
    main()
