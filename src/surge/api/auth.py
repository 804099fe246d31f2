"""Reading an application's bearer tokens where it is deployed, and keeping only digests.

`resolve_auth` turns an `AuthConfig` (or its dict form) into `AccessTokens`: it reads the
environment variable and/or the file the config names, checks every token (long enough,
characters a bearer token can carry, policy.auth.token_problem), and keeps their SHA-256
digests. The tokens go no further than this process: the controller and the proxies
get digests. Errors say which source and which line is wrong, never the token; a
tokens file that other users may read draws a warning, as ssh does for keys.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from typing import Any

from surge.config import AuthConfig, from_mapping, unreadable
from surge.errors import ConfigError
from surge.model import AccessTokens
from surge.policy.auth import token_digest, token_problem

__all__ = ["resolve_auth"]

log = logging.getLogger("surge")


def auth_config(value: AuthConfig | Mapping[str, Any], where: str) -> AuthConfig:
    if isinstance(value, AuthConfig):
        return value
    return from_mapping(AuthConfig, value, where)


def resolve_auth(value: AuthConfig | Mapping[str, Any] | None, where: str = "auth",
                 environ: Mapping[str, str] | None = None,
                 base_dir: str | None = None) -> AccessTokens | None:
    """The digests of the tokens `value` points at; None when there is no auth."""
    if value is None:
        return None
    config = auth_config(value, where)
    environ = os.environ if environ is None else environ
    tokens: list[str] = []
    sources: list[str] = []
    if config.tokens:
        tokens += _checked(config.tokens, f"{where}.tokens", "item")
        sources.append("the Python API")
    if config.tokens_env is not None:
        tokens += _from_env(config.tokens_env, environ, where)
        sources.append(f"env {config.tokens_env}")
    if config.tokens_file is not None:
        path = config.tokens_file
        if base_dir is not None and not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        tokens += _from_file(path, where)
        sources.append(f"file {path}")
    digests = tuple(dict.fromkeys(token_digest(t) for t in tokens))
    return AccessTokens(digests, ", ".join(sources))


def _checked(tokens: tuple[str, ...] | list[str], source: str, unit: str) -> list[str]:
    for index, token in enumerate(tokens, 1):
        problem = token_problem(token)
        if problem is not None:
            raise ConfigError(f"{source}: the token at {unit} {index} {problem}.")
    return list(tokens)


def _from_env(name: str, environ: Mapping[str, str], where: str) -> list[str]:
    raw = environ.get(name)
    if raw is None:
        raise ConfigError(f"{where}.tokens_env: the environment variable {name} is not set; "
                          f"export it in the shell that deploys (tokens separated by commas "
                          "or spaces)")
    tokens = raw.replace(",", " ").split()
    if not tokens:
        raise ConfigError(f"{where}.tokens_env: the environment variable {name} is empty; "
                          "put at least one token in it")
    return _checked(tokens, f"{where}.tokens_env ({name})", "position")


def _from_file(path: str, where: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as source:
            mode = os.fstat(source.fileno()).st_mode
            text = source.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise unreadable(f"{where}.tokens_file", path, exc, "a file of tokens",
                         "the user that deploys") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s.tokens_file: %s may be read by other users (mode %o); "
                    "chmod 600 it", where, path, stat.S_IMODE(mode))
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            found.append((number, line))
    if not found:
        raise ConfigError(f"{where}.tokens_file: {path!r} holds no token; put one per line")
    for number, token in found:
        problem = token_problem(token)
        if problem is not None:
            raise ConfigError(f"{where}.tokens_file: the token on line {number} of {path!r} "
                              f"{problem}")
    return [token for _, token in found]
