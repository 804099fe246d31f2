"""Bearer-token checks for an application's HTTP route (RFC 6750), decided without I/O.

The proxy passes the request's `Authorization` header values and the application's
token digests; the answer is None (let it through) or a `Refusal`: the status, the
`WWW-Authenticate` challenge and a body. As RFC 6750 §3.1 says, a request without
Bearer credentials gets 401 with a bare challenge, a wrong token 401 with
`error="invalid_token"`, and an unreadable `Authorization` (two of them, an empty
token) 400 with `error="invalid_request"`; surge never answers 403 (it has no scopes:
a token either opens an application or it does not).

A presented token is hashed (SHA-256) and compared with `hmac.compare_digest` against
every accepted digest, without stopping at a match, so the time taken says nothing
about how much of a token was right or which token matched. Tokens are never part of
a refusal, so they cannot reach a log or a response.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

__all__ = ["MIN_TOKEN_CHARS", "Refusal", "check_bearer", "token_digest", "token_problem"]

# 16 characters of base64 are 96 bits: too many to guess over HTTP. Shorter ones are
# refused when the configuration is read.
MIN_TOKEN_CHARS = 16
# RFC 6750 §2.1 b64token: what may follow "Bearer ".
_B64TOKEN = re.compile(rb"[A-Za-z0-9\-._~+/]+=*")
_CHALLENGE = b'Bearer realm="surge"'


@dataclass(frozen=True)
class Refusal:
    status: int
    challenge: bytes  # the WWW-Authenticate header value
    message: bytes


MISSING = Refusal(401, _CHALLENGE,
                  b"Authentication required: send 'Authorization: Bearer <token>'.")
INVALID = Refusal(401, _CHALLENGE + b', error="invalid_token"',
                  b"The bearer token is not valid for this application.")
MALFORMED = Refusal(400, _CHALLENGE + b', error="invalid_request"',
                    b"Malformed Authorization header: send exactly one "
                    b"'Authorization: Bearer <token>'.")


def token_digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a configured token (the message never contains it)."""
    if len(token) < MIN_TOKEN_CHARS:
        return (f"is too short ({len(token)} characters); use at least {MIN_TOKEN_CHARS} "
                "random ones, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    if not token.isascii() or _B64TOKEN.fullmatch(token.encode()) is None:
        return ("has characters a bearer token cannot carry; use letters, digits and "
                "-._~+/ (RFC 6750), e.g. from secrets.token_urlsafe(32)")
    return None


def check_bearer(authorization: list[bytes], digests: tuple[bytes, ...]) -> Refusal | None:
    """None when one `Authorization: Bearer` header carries an accepted token."""
    if not authorization:
        return MISSING
    if len(authorization) > 1:
        return MALFORMED
    scheme, _, token = authorization[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return MISSING  # another scheme (Basic, ...): no Bearer credentials at all
    token = token.strip(b" \t")
    if _B64TOKEN.fullmatch(token) is None:
        return MALFORMED
    presented = token_digest(token)
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(digest, presented)
    return None if matched else INVALID
