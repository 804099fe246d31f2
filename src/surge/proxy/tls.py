"""TLS for the HTTP ingress: one `ssl.SSLContext` per proxy worker, built from PEM files.

`server_context` is what a proxy worker listens with: TLS 1.2 or newer, the default
server ciphers of Python's `ssl` (forward secrecy, no RC4/3DES), ALPN `http/1.1`, and,
with `ssl_ca_certs`, client certificates verified against that bundle. `check_tls_files`
builds the same context where the options are given (serve.start, a config file) so a
missing, unreadable or mismatched file is an error there, naming the option, instead of
a proxy that does not start. An encrypted key is refused rather than prompted for: a
proxy worker has no terminal, and OpenSSL's prompt would block it.
"""

from __future__ import annotations

import ssl
from typing import Protocol

from surge.config import unreadable
from surge.errors import ConfigError

__all__ = ["TlsFiles", "check_tls_files", "server_context"]

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
              "required": ssl.CERT_REQUIRED}


class TlsFiles(Protocol):
    """HTTPOptions and ProxySpec both carry these."""

    @property
    def ssl_certfile(self) -> str | None: ...
    @property
    def ssl_keyfile(self) -> str | None: ...
    @property
    def ssl_ca_certs(self) -> str | None: ...
    @property
    def ssl_cert_reqs(self) -> str | int | None: ...


def check_tls_files(options: TlsFiles) -> None:
    """Raise ConfigError when the TLS files of `options` cannot serve; no-op without TLS."""
    if options.ssl_certfile is not None:
        server_context(options)


def _no_password() -> str:
    raise ConfigError("the private key is encrypted; surge takes no key password (it would "
                      "travel on a command line): decrypt it with `openssl pkey -in KEY -out "
                      "KEY.plain` and protect that file with chmod 600")


def server_context(options: TlsFiles) -> ssl.SSLContext:
    certfile, keyfile = options.ssl_certfile, options.ssl_keyfile
    if certfile is None:
        raise ConfigError("http_options.ssl_certfile is not set")
    _readable("ssl_certfile", certfile)
    if keyfile is not None:
        _readable("ssl_keyfile", keyfile)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except ConfigError as exc:
        raise ConfigError(f"http_options.ssl_keyfile: {exc}") from None
    except ssl.SSLError as exc:
        raise ConfigError(_chain_error(certfile, keyfile, exc)) from None
    reqs = options.ssl_cert_reqs if isinstance(options.ssl_cert_reqs, str) else "none"
    if options.ssl_ca_certs is not None:
        _readable("ssl_ca_certs", options.ssl_ca_certs)
        try:
            context.load_verify_locations(cafile=options.ssl_ca_certs)
        except ssl.SSLError as exc:
            raise ConfigError(f"http_options.ssl_ca_certs: {options.ssl_ca_certs!r} is not "
                              f"a PEM bundle of CA certificates ({exc.reason or exc})") from None
    context.verify_mode = _CERT_REQS.get(reqs, ssl.CERT_NONE)
    return context


def _readable(option: str, path: str) -> None:
    try:
        with open(path, "rb") as source:
            source.read(1)
    except OSError as exc:
        raise unreadable(f"http_options.{option}", path, exc, "the PEM file",
                         "the user that runs surge") from None


def _chain_error(certfile: str, keyfile: str | None, exc: ssl.SSLError) -> str:
    reason = str(exc.reason or exc)
    if "KEY_VALUES_MISMATCH" in reason:
        return (f"http_options.ssl_keyfile: the private key {keyfile or certfile!r} does not "
                f"belong to the certificate {certfile!r}; give the key the certificate was "
                "issued for")
    if keyfile is None:
        return (f"http_options.ssl_certfile: {certfile!r} must hold the certificate and its "
                f"private key in PEM (or set ssl_keyfile) ({reason})")
    return (f"http_options.ssl_certfile/ssl_keyfile: {certfile!r} and {keyfile!r} must be a "
            f"PEM certificate (chain) and its PEM private key ({reason})")
