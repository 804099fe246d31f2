"""The control API's shared secret: who may deploy code to an instance.

The control connection carries pickled configs and user code, so whoever can talk
to it can run code in every surge process. The process that starts an instance makes
a random token, hands it to the controller (and through it to every surge process) in
the spec each reads on stdin (surge.launch), and writes it to a 0600 file in a 0700
per-user directory, named after the control address, for the same user's other
processes (`surge status`, a second driver); a process elsewhere sets
SURGE_CONTROL_TOKEN. A connection proves it knows the token by the mutual HMAC-SHA256
handshake (transport/handshake.py) before either end unpickles anything; the token
itself never travels, on control connections or on links to replicas over TCP.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile

__all__ = ["TOKEN_ENV", "find_token", "new_token", "publish", "token_path", "user_dir",
           "withdraw"]

TOKEN_ENV = "SURGE_CONTROL_TOKEN"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def user_dir() -> str:
    """`$TMPDIR/surge-UID`, private to this user; refuses one that anybody else could use."""
    path = os.path.join(tempfile.gettempdir(), f"surge-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or info.st_mode & 0o077:
        raise PermissionError(
            f"{path} must be a directory owned by uid {os.getuid()} with mode 0700 (it holds "
            "surge's control tokens); remove it or fix its owner and mode")
    return path


def token_path(address: str) -> str:
    return os.path.join(user_dir(), "control-" + address.replace(":", "_") + ".token")


def publish(address: str, token: str) -> str:
    """Write the token where this user's other processes look for it; returns the path."""
    path = token_path(address)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)
    os.replace(path + ".tmp", path)
    return path


def withdraw(address: str, token: str) -> None:
    """Remove the published token, unless another instance has since replaced it."""
    try:
        path = token_path(address)
        with open(path) as file:
            if file.read().strip() == token:
                os.unlink(path)
    except OSError:
        pass


def find_token(address: str) -> str | None:
    """SURGE_CONTROL_TOKEN if set, else the token published for this address, else None."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    try:
        with open(token_path(address)) as file:
            return file.read().strip() or None
    except OSError:
        return None
