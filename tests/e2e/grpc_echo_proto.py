"""A .proto for the gRPC tests, compiled with grpcio-tools on first import.

The generated modules land in a directory named by the proto's hash under the temp dir
(compiled once, then reused by every process: the driver, the proxy and the replicas all
import them), which is put on sys.path; `echo_pb2` and `echo_pb2_grpc` are then importable.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile

PROTO = """
syntax = "proto3";
package surgetest;

message EchoRequest { string text = 1; bytes blob = 2; int32 count = 3; double sleep_s = 4; }
message EchoReply { string text = 1; bytes blob = 2; int32 index = 3; }

service Echo {
  rpc Say(EchoRequest) returns (EchoReply);
  rpc Slow(EchoRequest) returns (EchoReply);
  rpc Many(EchoRequest) returns (stream EchoReply);
  rpc Gather(stream EchoRequest) returns (EchoReply);
  rpc Chat(stream EchoRequest) returns (stream EchoReply);
}
"""

SERVICER = "surge_echo_pb2_grpc:add_EchoServicer_to_server"


def compiled_dir() -> str:
    digest = hashlib.sha256(PROTO.encode()).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), f"surge-test-proto-{digest}")
    if not os.path.exists(os.path.join(directory, "surge_echo_pb2_grpc.py")):
        from grpc_tools import protoc

        work = tempfile.mkdtemp(prefix="surge-proto-")
        with open(os.path.join(work, "surge_echo.proto"), "w") as file:
            file.write(PROTO)
        code = protoc.main(["protoc", f"-I{work}", f"--python_out={work}",
                            f"--grpc_python_out={work}", os.path.join(work, "surge_echo.proto")])
        if code != 0:
            raise RuntimeError(f"protoc failed ({code})")
        try:
            os.rename(work, directory)  # atomic: a racing process finds it whole or not at all
        except OSError:
            pass  # another process won
    return directory


_directory = compiled_dir()
if _directory not in sys.path:
    sys.path.insert(0, _directory)

import surge_echo_pb2 as echo_pb2  # noqa: E402
import surge_echo_pb2_grpc as echo_pb2_grpc  # noqa: E402

__all__ = ["PROTO", "SERVICER", "compiled_dir", "echo_pb2", "echo_pb2_grpc"]
