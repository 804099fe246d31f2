"""Auth and TLS configuration: YAML errors with file:line, token sources, the RFC 6750
decision (pure), and the TLS option shapes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from surge.api.auth import resolve_auth
from surge.api.config_file import load_config
from surge.config import HTTPOptions
from surge.errors import ConfigError
from surge.policy.auth import INVALID, MALFORMED, MISSING, check_bearer, token_digest
from tests.certs import make_pki

GOOD = "a" * 20
OTHER = "b" * 20


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


APP = "applications:\n- name: a\n  import_path: m:app\n"


@pytest.mark.parametrize(("auth", "line", "message"), [
    ("  auth: {tokens: [x]}\n", 4, "applications[0].auth.tokens: surge does not take tokens "
                                   "written in a config file"),
    ("  auth: {tokens_envv: X}\n", 4, "unknown key. Did you mean 'tokens_env'?"),
    ("  auth: {tokens_env: 'not a name'}\n", 4, "tokens_env must name an environment"),
    ("  auth: {}\n", 4, "auth needs tokens_env"),
    ("  auth: tokens\n", 4, "applications[0].auth: expected a mapping"),
])
def test_yaml_auth_mistakes_name_file_and_line(tmp_path: Path, auth: str, line: int,
                                               message: str) -> None:
    path = write(tmp_path, APP + auth)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert f"{path}:{line}: " in str(raised.value)
    assert message in str(raised.value)


def test_yaml_auth_relative_file_is_next_to_the_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, APP + "  auth: {tokens_file: tokens.txt}\n"))
    app = config.applications[0]
    assert app.auth is not None
    assert app.auth.tokens_file == str(tmp_path.resolve() / "tokens.txt")


def test_tls_mistakes_name_the_option_and_line(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    path = write(tmp_path, f"http_options:\n  ssl_certfile: {pki.cert}\n"
                           f"  ssl_keyfile: {pki.other_key}\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: http_options.ssl_keyfile: the private "
                                          "key .* does not belong"):
        load_config(path)
    path = write(tmp_path, f"http_options:\n  ssl_certfile: {tmp_path}/nope.pem\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: http_options.ssl_certfile: no such"):
        load_config(path)
    path = write(tmp_path, f"http_options:\n  ssl_certfile: {pki.cert}\n  ssl_keyfile: "
                           f"{pki.key}\n  ssl_ca_certs: {pki.ca}\n")
    options = load_config(path).http_options
    assert (options.tls, options.ssl_cert_reqs) == (True, "required")


def test_tls_option_shapes() -> None:
    assert HTTPOptions().tls is False
    assert HTTPOptions(ssl_certfile="c", ssl_ca_certs="ca", ssl_cert_reqs="optional"
                       ).ssl_cert_reqs == "optional"
    assert HTTPOptions(ssl_certfile="c", ssl_ca_certs="ca", ssl_cert_reqs=2
                       ).ssl_cert_reqs == "required"  # uvicorn's ssl.CERT_REQUIRED
    assert HTTPOptions(ssl_certfile="c").ssl_cert_reqs == "none"
    with pytest.raises(ConfigError, match="ssl_cert_reqs must be one of"):
        HTTPOptions(ssl_certfile="c", ssl_cert_reqs="sometimes")
    with pytest.raises(ConfigError, match="need ssl_certfile"):
        HTTPOptions(ssl_ca_certs="ca")
    with pytest.raises(ConfigError, match="request_body_timeout_s"):
        HTTPOptions(request_body_timeout_s=0)


# -- where tokens come from ----------------------------------------------------------------


def test_tokens_from_env_and_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# comment\n\n  {OTHER}  \n")
    tokens.chmod(0o600)
    resolved = resolve_auth({"tokens_env": "T", "tokens_file": str(tokens)},
                            environ={"T": f"{GOOD}, {GOOD}"})
    assert resolved is not None
    assert set(resolved.digests) == {token_digest(GOOD), token_digest(OTHER)}
    assert GOOD not in repr(resolved) and OTHER not in repr(resolved)
    assert resolve_auth(None) is None


@pytest.mark.parametrize(("env", "text", "message"), [
    ({}, None, "the environment variable T is not set"),
    ({"T": " , "}, None, "the environment variable T is empty"),
    ({"T": f"{GOOD} short"}, None, "the token at position 2 is too short"),
    ({"T": f"{GOOD} {'é' * 20}"}, None, "characters a bearer token cannot carry"),
    ({"T": GOOD}, "# only a comment\n", "holds no token"),
    ({"T": GOOD}, f"{GOOD}\nshort\n", "the token on line 2 of"),
])
def test_token_source_errors_never_show_the_token(tmp_path: Path, env: dict[str, str],
                                                  text: str | None, message: str) -> None:
    spec: dict[str, str] = {"tokens_env": "T"}
    if text is not None:
        (tmp_path / "tokens").write_text(text)
        spec["tokens_file"] = str(tmp_path / "tokens")
    with pytest.raises(ConfigError, match=message) as raised:
        resolve_auth(spec, environ=env)
    assert GOOD not in str(raised.value)


def test_missing_and_world_readable_token_files(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        resolve_auth({"tokens_file": str(tmp_path / "missing")})
    loose = tmp_path / "loose"
    loose.write_text(GOOD + "\n")
    loose.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="surge"):
        resolve_auth({"tokens_file": str(loose)})
    assert "chmod 600" in caplog.text
    assert GOOD not in caplog.text


# -- the decision (policy/auth.py) ---------------------------------------------------------


def test_check_bearer_follows_rfc_6750() -> None:
    digests = (token_digest(GOOD), token_digest(OTHER))
    assert check_bearer([f"Bearer {GOOD}".encode()], digests) is None
    assert check_bearer([f"bearer  {OTHER} ".encode()], digests) is None
    assert check_bearer([], digests) is MISSING
    assert check_bearer([b"Basic dXNlcjpwYXNz"], digests) is MISSING
    assert check_bearer([b"Bearer " + b"c" * 20], digests) is INVALID
    assert check_bearer([f"Bearer {GOOD}x".encode()], digests) is INVALID
    assert check_bearer([b"Bearer"], digests) is MALFORMED
    assert check_bearer([b"Bearer a b"], digests) is MALFORMED
    assert check_bearer([b"Bearer \xff"], digests) is MALFORMED
    assert check_bearer([f"Bearer {GOOD}".encode()] * 2, digests) is MALFORMED
    assert (MISSING.status, INVALID.status, MALFORMED.status) == (401, 401, 400)
    assert b'error="invalid_token"' in INVALID.challenge
