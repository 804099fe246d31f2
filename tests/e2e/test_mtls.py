"""Mutual TLS: with ssl_ca_certs, the proxy requires a client certificate from that CA."""

from __future__ import annotations

import httpx
import pytest

from surge import serve
from tests.certs import make_pki
from tests.e2e.conftest import running_instance
from tests.e2e.test_tls import Whoami, https, trusting

pytestmark = pytest.mark.e2e


def test_mutual_tls_requires_a_client_certificate(tmp_path_factory: pytest.TempPathFactory
                                                  ) -> None:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    with running_instance(ssl_certfile=str(pki.cert), ssl_keyfile=str(pki.key),
                          ssl_ca_certs=str(pki.ca)) as running:
        serve.run(Whoami.bind(), name="mtls", route_prefix="/whoami")
        url = f"{https(running)}/whoami"
        with httpx.Client(verify=trusting(pki, client_cert=True), timeout=30) as client:
            assert client.get(url).json()["scheme"] == "https"
        with httpx.Client(verify=trusting(pki), timeout=30) as client, \
                pytest.raises(httpx.HTTPError):
            client.get(url)
