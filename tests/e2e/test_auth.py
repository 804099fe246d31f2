"""Bearer-token authentication per application, over real HTTP (RFC 6750 answers).

One instance serves three applications: /open (no auth), /locked (tokens from an
environment variable) and /filed (tokens from a file). The replica behind /locked
counts what reaches it, so the tests can show a refused request never got there.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from surge import serve
from surge.errors import ConfigError
from surge.serve.config import AuthConfig
from tests.e2e.conftest import Running, running_instance
from tests.e2e.test_http import RawConnection, request_bytes

pytestmark = pytest.mark.e2e

TOKEN_A = secrets.token_urlsafe(24)
TOKEN_B = secrets.token_urlsafe(24)
FILE_TOKEN = secrets.token_urlsafe(24)
ENV = "SURGE_TEST_AUTH_TOKENS"


@serve.deployment(num_replicas=1, max_ongoing_requests=8)
class Counter:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: Request) -> Any:
        self.calls += 1
        body = await request.body()
        return {"calls": self.calls, "length": len(body), "scheme": request.url.scheme}

    def count(self) -> int:
        return self.calls


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tokens_file = tmp_path_factory.mktemp("auth") / "tokens"
    tokens_file.write_text(f"# one per line\n\n{FILE_TOKEN}\n")
    tokens_file.chmod(0o600)
    os.environ[ENV] = f"{TOKEN_A}, {TOKEN_B}"
    try:
        with running_instance() as running:
            serve.run(Counter.bind(), name="open", route_prefix="/open")
            serve.run(Counter.bind(), name="locked", route_prefix="/locked",
                      auth={"tokens_env": ENV})
            serve.run(Counter.bind(), name="filed", route_prefix="/filed",
                      auth=AuthConfig(tokens_file=str(tokens_file)))
            yield running
    finally:
        os.environ.pop(ENV, None)


@pytest.fixture
def http(instance: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=instance.url, timeout=30) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def locked_calls() -> int:
    calls: int = serve.get_app_handle("locked").count.remote().result(timeout_s=15)
    return calls


def test_open_application_needs_no_token(http: httpx.Client) -> None:
    assert http.get("/open").status_code == 200
    assert http.get("/-/healthz").status_code == 200


def test_missing_token_is_401_with_a_bearer_challenge(http: httpx.Client) -> None:
    before = locked_calls()
    response = http.get("/locked")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="surge"'
    assert "Authorization: Bearer" in response.text
    assert locked_calls() == before  # refused in the proxy: the replica never saw it


def test_wrong_token_is_401_invalid_token(http: httpx.Client) -> None:
    before = locked_calls()
    for wrong in (TOKEN_A[:-1], TOKEN_A + "x", FILE_TOKEN, "x" * 32):
        response = http.get("/locked", headers=bearer(wrong))
        assert response.status_code == 401, wrong
        assert response.headers["www-authenticate"] == \
            'Bearer realm="surge", error="invalid_token"'
        assert wrong not in response.text
    assert locked_calls() == before


def test_each_configured_token_opens_its_application(http: httpx.Client) -> None:
    for token in (TOKEN_A, TOKEN_B):
        response = http.get("/locked", headers=bearer(token))
        assert response.status_code == 200
        assert response.json()["scheme"] == "http"
    assert http.get("/filed", headers=bearer(FILE_TOKEN)).status_code == 200
    # A token is for its application only.
    assert http.get("/filed", headers=bearer(TOKEN_A)).status_code == 401
    # The scheme is case-insensitive (RFC 9110 11.1).
    assert http.get("/locked", headers={"authorization": f"bearer {TOKEN_A}"}).status_code \
        == 200


def test_other_schemes_and_malformed_headers(instance: Running, http: httpx.Client) -> None:
    basic = http.get("/locked", auth=("user", TOKEN_A))
    assert basic.status_code == 401
    assert basic.headers["www-authenticate"] == 'Bearer realm="surge"'
    assert http.get("/locked", headers={"authorization": "Bearer"}).status_code == 400
    assert http.get("/locked", headers={"authorization": "Bearer a b"}).status_code == 400
    with RawConnection(instance.http_port) as conn:
        conn.send(b"GET /locked HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  + TOKEN_A.encode() + b"\r\nAuthorization: Bearer " + TOKEN_A.encode()
                  + b"\r\n\r\n")
        response = conn.read_response()
        assert response.status == 400
        assert 'error="invalid_request"' in response.headers["www-authenticate"]


def test_refused_body_is_dropped_and_the_connection_stays_usable(instance: Running) -> None:
    before = locked_calls()
    with RawConnection(instance.http_port) as conn:
        conn.send(request_bytes("POST", "/locked", body=b"x" * 50_000))
        conn.send(request_bytes("POST", "/locked", headers=bearer(TOKEN_A), body=b"abc"))
        refused, served = conn.read_responses(2)
    assert refused.status == 401
    assert served.status == 200
    assert b'"length":3' in served.body
    assert locked_calls() == before + 1


def test_expect_continue_is_not_invited_when_refused(instance: Running) -> None:
    with RawConnection(instance.http_port) as conn:
        conn.send(b"POST /locked HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        # a hold to prove a negative: no "100 Continue" comes within 0.5 s
        head = conn.read_raw_until(lambda data: b"\r\n" in data, timeout_s=0.5)
        assert not head.startswith(b"HTTP/1.1 100")
        conn.send(b"hello")
        assert conn.read_response().status == 401


def test_run_refuses_bad_auth_config_before_deploying(instance: Running) -> None:
    with pytest.raises(ConfigError, match="SURGE_TEST_UNSET_VARIABLE is not set"):
        serve.run(Counter.bind(), name="bad", route_prefix="/bad",
                  auth={"tokens_env": "SURGE_TEST_UNSET_VARIABLE"})
    with pytest.raises(ConfigError, match="too short"):
        serve.run(Counter.bind(), name="bad", route_prefix="/bad",
                  auth=AuthConfig(tokens=["short"]))
    with pytest.raises(ConfigError, match="unknown key 'token'"):
        serve.run(Counter.bind(), name="bad", route_prefix="/bad", auth={"token": "x"})
    assert "bad" not in serve.status().applications


def test_auth_digests_and_not_tokens_leave_the_driver(instance: Running,
                                                       tmp_path: Path) -> None:
    # What the controller reports about the application holds no token.
    text = repr(serve.status()) + repr(serve.status().to_dict())
    for token in (TOKEN_A, TOKEN_B, FILE_TOKEN):
        assert token not in text
    assert repr(_resolved()) == "AccessTokens(2 token(s) from env " + ENV + ")"


def _resolved() -> Any:
    from surge.api.auth import resolve_auth

    return resolve_auth({"tokens_env": ENV})
