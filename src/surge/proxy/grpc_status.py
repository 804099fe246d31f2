"""The gRPC ingress's decisions, sans-IO: which application a call goes to, and the status
each way a call can end gets, as Ray Serve 2.60 answers them (serve/_private/proxy.py,
grpc_util.py `get_grpc_response_status`).

Codes are grpc's status numbers (`grpc.StatusCode.X.value[0]`), so this module needs no
grpc; the shell turns them into `grpc.StatusCode`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from surge.errors import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaDiedError,
    RequestCancelledError,
)

__all__ = ["API_SERVICE", "CODE_NAMES", "HEALTHZ", "LIST_APPLICATIONS", "Code", "Timeout",
           "choose_app", "metadata_value", "status_of"]


class Code:
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


CODE_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
              "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
              "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
              "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")

API_SERVICE = "ray.serve.RayServeAPIService"
LIST_APPLICATIONS = f"/{API_SERVICE}/ListApplications"
HEALTHZ = f"/{API_SERVICE}/Healthz"
# gRPC status details travel in HTTP/2 trailers (8 KiB by default): Ray's cap.
MAX_DETAILS = 4096
_TRUNCATED = "... [truncated]"

Target = TypeVar("Target")


class Timeout(Exception):
    """The call's deadline (its own or request_timeout_s) passed before its answer."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self.timeout_s = timeout_s


def metadata_value(metadata: tuple[tuple[str, str | bytes], ...] | None, key: str) -> str:
    for name, value in metadata or ():
        if name == key and isinstance(value, str):
            return value
    return ""


def choose_app(app: str, apps: Mapping[str, Target]) -> tuple[Target | None, str]:
    """The application a call names in its `application` metadata (with exactly one
    application, any name or none picks it), else None and Ray's NOT_FOUND details."""
    if len(apps) == 1:
        return next(iter(apps.values())), ""
    target = apps.get(app) if app else None
    if target is not None:
        return target, ""
    named = f"Application '{app}' not found." if app else "Application metadata not set."
    return None, (f"{named} Ping {LIST_APPLICATIONS} for available applications.")


def truncate(details: str) -> str:
    if len(details) <= MAX_DETAILS:
        return details
    return details[:MAX_DETAILS - len(_TRUNCATED)] + _TRUNCATED


def status_of(exc: BaseException, request_id: str) -> tuple[int, str]:
    """The status of a call that ended with `exc` before the replica answered it."""
    if isinstance(exc, Timeout):
        return Code.DEADLINE_EXCEEDED, f"Request timed out after {exc.timeout_s}s."
    if isinstance(exc, RequestCancelledError):
        return Code.CANCELLED, f"Client for request {request_id} disconnected."
    if isinstance(exc, BackPressureError):  # Ray 2.60's code for a full queue
        return Code.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, DeploymentUnavailableError):
        return Code.UNAVAILABLE, str(exc)
    if isinstance(exc, ReplicaDiedError):
        return Code.INTERNAL, f"{exc}; the request may or may not have run."
    return Code.INTERNAL, truncate(str(exc))
