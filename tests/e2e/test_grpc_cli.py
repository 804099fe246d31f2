"""`surge run` of a YAML config with Ray's `grpc_options`, called by a real grpcio client;
`surge build --grpc-servicer-functions` writes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml

from tests.e2e.grpc_echo_proto import SERVICER, compiled_dir, echo_pb2, echo_pb2_grpc
from tests.e2e.test_cli_config import _surge, _wait_for_line
from tests.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
http_options:
  port: {http_port}
grpc_options:
  port: {grpc_port}
  grpc_servicer_functions: ["{servicer}"]
applications:
- name: greeter
  route_prefix: /greeter
  import_path: tests.e2e.grpc_app:app
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}")
    paths = (str(ROOT), compiled_dir(), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def test_surge_run_serves_the_configs_grpc_options(tmp_path: Path) -> None:
    grpc_port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(http_port=free_port(), grpc_port=grpc_port,
                                    servicer=SERVICER))
    env = _env()
    process = subprocess.Popen([sys.executable, "-m", "surge.cli.main", "run", str(config)],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        _wait_for_line(process, "Ctrl-C to stop", timeout=60)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = echo_pb2_grpc.EchoStub(channel).Say(
                echo_pb2.EchoRequest(text="yaml"), metadata=(("application", "greeter"),),
                timeout=10)
        assert reply.text == "hello yaml"
        stopped = _surge("shutdown", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_surge_build_writes_grpc_options() -> None:
    built = _surge("build", "tests.e2e.grpc_app:app", "--grpc-servicer-functions", SERVICER,
                   env=_env())
    assert built.returncode == 0, built.stderr
    data = yaml.safe_load(built.stdout)
    assert data["grpc_options"] == {"port": 9000, "grpc_servicer_functions": [SERVICER],
                                    "enable_reflection": True}
    assert list(data).index("grpc_options") == list(data).index("http_options") + 1


def test_with_the_http_certificate_the_grpc_port_is_tls_only(tmp_path: Path) -> None:
    from surge import serve
    from tests.certs import make_pki
    from tests.e2e.conftest import running_instance
    from tests.e2e.grpc_app import app

    pki = make_pki(tmp_path)
    port = free_port()
    options = {"grpc_options": {"port": port, "grpc_servicer_functions": [SERVICER]}}
    with running_instance(options, ssl_certfile=str(pki.cert), ssl_keyfile=str(pki.key)):
        serve.run(app, name="greeter", route_prefix="/greeter")
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            reply = echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text="tls"),
                                                        timeout=10)
        assert reply.text == "hello tls"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, \
                pytest.raises(grpc.RpcError) as info:
            echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text="plain"), timeout=5)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
