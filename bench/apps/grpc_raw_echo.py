"""The raw anchor of bench/grpc_echo.py: grpcio's own asyncio server (uvloop) answering
the echo in its one process, parsing and serializing there, no proxy and no hop.

    python grpc_raw_echo.py GRPC_PORT

What any Python gRPC server costs on this machine: the floor for surge's two hops.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import bench_echo_pb2 as pb
import bench_echo_pb2_grpc as pb_grpc
import grpc
import setproctitle
import uvloop

MAX_MESSAGE = 64 * 1024 * 1024


class Echo(pb_grpc.EchoServicer):  # type: ignore[misc]
    async def Say(self, request: Any, context: Any) -> Any:
        return pb.EchoReply(payload=request.payload)

    async def Many(self, request: Any, context: Any) -> Any:
        for index in range(request.count):
            yield pb.EchoReply(payload=request.payload, index=index)


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", MAX_MESSAGE),
                                      ("grpc.max_receive_message_length", MAX_MESSAGE)])
    pb_grpc.add_EchoServicer_to_server(Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"READY http://127.0.0.1:{port}/ grpc=127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    setproctitle.setproctitle("raw_server grpc")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvloop.run(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
