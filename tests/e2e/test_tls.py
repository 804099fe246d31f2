"""TLS on the HTTP ingress: HTTPS verified against a CA made here, old protocol
versions refused, and clients that do not speak TLS (or stall) on the TLS port.

Mutual TLS needs an instance of its own: tests/e2e/test_mtls.py.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from surge import serve
from surge.config import HTTPOptions
from surge.errors import ConfigError
from surge.proxy.tls import server_context
from tests.certs import Pki, make_pki
from tests.e2e.conftest import Running, running_instance
from tests.e2e.procs import alive, surge_processes

pytestmark = pytest.mark.e2e

HEADER_TIMEOUT_S = 1.0


@serve.deployment(num_replicas=1, max_ongoing_requests=8)
class Whoami:
    async def __call__(self, request: Request) -> Any:
        return {"scheme": request.url.scheme, "length": len(await request.body())}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_instance(pki: Pki) -> Iterator[Running]:
    with running_instance(ssl_certfile=str(pki.cert), ssl_keyfile=str(pki.key),
                          request_header_timeout_s=HEADER_TIMEOUT_S) as running:
        serve.run(Whoami.bind(), name="tls", route_prefix="/whoami")
        yield running


def https(running: Running) -> str:
    return f"https://127.0.0.1:{running.http_port}"


def trusting(pki: Pki, *, client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def proxy_pids() -> list[int]:
    import os

    return [pid for pid, title in surge_processes(os.getpid()).items() if "proxy" in title]


def test_https_verified_against_the_ca(tls_instance: Running, pki: Pki) -> None:
    with httpx.Client(base_url=https(tls_instance), verify=trusting(pki), timeout=30) as client:
        response = client.post("/whoami", content=b"x" * 100_000)
        assert response.status_code == 200
        assert response.json() == {"scheme": "https", "length": 100_000}
        assert client.get("/-/healthz").text == "success"
        assert client.get("/missing").text.endswith(
            f"Ping https://127.0.0.1:{tls_instance.http_port}/-/routes for available routes.")


def test_an_untrusted_client_refuses_the_certificate(tls_instance: Running) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{https(tls_instance)}/whoami", timeout=10)


def test_only_tls_1_2_and_newer(tls_instance: Running, pki: Pki) -> None:
    assert server_context(HTTPOptions(ssl_certfile=str(pki.cert), ssl_keyfile=str(pki.key))
                          ).minimum_version == ssl.TLSVersion.TLSv1_2
    for highest, expected in ((ssl.TLSVersion.TLSv1_2, "TLSv1.2"),
                              (ssl.TLSVersion.MAXIMUM_SUPPORTED, "TLSv1.3")):
        client = trusting(pki)
        client.maximum_version = highest
        with socket.create_connection(("127.0.0.1", tls_instance.http_port),
                                      timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() == expected
            assert tls.selected_alpn_protocol() in (None, "http/1.1")


def test_plain_http_to_the_tls_port_is_closed_and_harmless(tls_instance: Running,
                                                           pki: Pki) -> None:
    pids = proxy_pids()
    assert pids
    for garbage in (b"GET /whoami HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64,
                    b"\x16\x03\x01\x00\x05hello"):
        with socket.create_connection(("127.0.0.1", tls_instance.http_port),
                                      timeout=10) as raw:
            raw.sendall(garbage)
            data = _read_until_closed(raw)
            assert b"HTTP/1.1 200" not in data
    assert all(alive(pid) for pid in pids)
    with httpx.Client(verify=trusting(pki), timeout=30) as client:
        assert client.get(f"{https(tls_instance)}/whoami").status_code == 200


def test_a_stalled_handshake_is_cut_off(tls_instance: Running) -> None:
    # Connect and say nothing: the handshake timeout (request_header_timeout_s) ends it.
    with socket.create_connection(("127.0.0.1", tls_instance.http_port), timeout=10) as raw:
        assert _read_until_closed(raw) == b""


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            more = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not more:
            return data
        data += more


def test_bad_tls_files_fail_at_start_with_the_option_named(pki: Pki, tmp_path: Path) -> None:
    cases = [
        ({"ssl_certfile": str(tmp_path / "missing.pem"), "ssl_keyfile": str(pki.key)},
         "ssl_certfile: no such file"),
        ({"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.other_key)},
         "does not belong to the certificate"),
        ({"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.encrypted_key)},
         "the private key is encrypted"),
        ({"ssl_keyfile": str(pki.key)}, "need ssl_certfile"),
        ({"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.key),
          "ssl_cert_reqs": "required"}, "needs ssl_ca_certs"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            serve.start(http_options={"host": "127.0.0.1", "port": 1, **options})
