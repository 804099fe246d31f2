"""The exception tree, grouped by whose fault it is and what the caller does next.

    RayServeException                    base of everything surge raises (Ray's name)
    ├── ConfigError (ValueError)         your configuration is wrong: fix it, nothing was changed
    ├── BackPressureError                overload: the queue budget is used up; retry after
    │                                    `retry_after_s` (HTTP 503, + Retry-After when
    │                                    `advise_retry`)
    ├── DeploymentUnavailableError       no replica can serve (none started, or all failed)
    ├── ReplicaDiedError                 the replica serving the request died mid-request; the
    │                                    request may or may not have run (HTTP 500)
    ├── ReplicaUnavailableError          the replica chosen with `choose_replica` has gone
    │                                    before `dispatch` reached it: choose again
    ├── RequestCancelledError            the request was cancelled (client gone: HTTP 499)
    ├── GetTimeoutError (TimeoutError)   `.result(timeout_s=)` or the request timeout expired
    │                                    (HTTP 408)
    ├── UserCodeError                    your deployment raised an exception that could not be
    │                                    sent back as itself; the message holds its traceback
    ├── DeployFailedError (RuntimeError) an application could not be deployed (constructor
    │                                    failed, import failed); the message says why
    ├── ControllerUnavailableError       no surge instance answers at the control address
    ├── ControlAuthError (PermissionError) the instance refused this process's control token:
    │                                    set SURGE_CONTROL_TOKEN to that instance's token
    └── WeightStoreError                 surge.weights could not give these weights
        ├── WeightSourceError (ValueError)  the source is missing, unreadable or malformed:
        │                                fix the file (the message names it and what is wrong)
        ├── WeightBudgetError            the entry does not fit the store's budget beside the
        │                                entries replicas hold: raise budget_bytes, or hold fewer
        ├── WeightStoreFullError (OSError) the store's directory (/dev/shm) has no room left:
        │                                enlarge it, or lower the budget
        └── WeightStoreUnavailableError  this node's store does not answer (it died and is
                                         being restarted): the replica's start is retried
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

__all__ = [
    "BackPressureError",
    "ConfigError",
    "ControlAuthError",
    "ControllerUnavailableError",
    "DeployFailedError",
    "DeploymentUnavailableError",
    "GetTimeoutError",
    "RayServeException",
    "ReplicaDiedError",
    "ReplicaUnavailableError",
    "RequestCancelledError",
    "UserCodeError",
    "WeightBudgetError",
    "WeightSourceError",
    "WeightStoreError",
    "WeightStoreFullError",
    "WeightStoreUnavailableError",
]


class RayServeException(Exception):
    """Base class of every error surge raises (named as in Ray Serve)."""


class DeploymentNotFoundError(RayServeException, KeyError):
    """No such deployment (a KeyError too, as Ray's get_deployment_handle raises)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(RayServeException, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


class BackPressureError(RayServeException):
    """The deployment's queue budget is exhausted; the request was not started."""

    def __init__(
        self,
        *,
        deployment: str,
        num_queued_requests: int,
        max_queued_requests: int,
        retry_after_s: float,
        status_code: int = 503,
        reason: str = "",
        advise_retry: bool = True,
    ) -> None:
        self.deployment = deployment
        self.num_queued_requests = num_queued_requests
        self.max_queued_requests = max_queued_requests
        self.retry_after_s = retry_after_s
        self.status_code = status_code  # the HTTP answer (backpressure_config: 503 or 429)
        self.reason = reason  # why, when not the count (surge's wait bound)
        # Whether an HTTP answer carries Retry-After: Ray's count bound sends none unless
        # backpressure_config.retry_after_s is set; surge's wait bound always advises.
        self.advise_retry = advise_retry
        why = f": {reason}" if reason else ""
        super().__init__(
            f"Request dropped due to backpressure for deployment {deployment!r} "
            f"(num_queued_requests={num_queued_requests}, "
            f"max_queued_requests={max_queued_requests}){why}; retry after "
            f"{retry_after_s:.2f}s."
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_backpressure, (self.deployment, self.num_queued_requests,
                                        self.max_queued_requests, self.retry_after_s,
                                        self.status_code, self.reason, self.advise_retry))


def _rebuild_backpressure(
    deployment: str, queued: int, limit: int, retry_after_s: float, status_code: int = 503,
    reason: str = "", advise_retry: bool = True,
) -> BackPressureError:
    return BackPressureError(deployment=deployment, num_queued_requests=queued,
                             max_queued_requests=limit, retry_after_s=retry_after_s,
                             status_code=status_code, reason=reason, advise_retry=advise_retry)


class DeploymentUnavailableError(RayServeException):
    """No replica of the deployment can serve right now."""


class ReplicaDiedError(RayServeException):
    """The replica died while the request was in flight on it."""


class ReplicaUnavailableError(RayServeException):
    """The replica a request was dispatched to (`handle.choose_replica`, then
    `dispatch`) has gone; choose again."""

    def __init__(self, replica_id: str) -> None:
        super().__init__(f"Replica {replica_id} is no longer available.")
        self.replica_id = replica_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.replica_id,))


class RequestCancelledError(RayServeException):
    """The request was cancelled before it finished."""


class GetTimeoutError(RayServeException, TimeoutError):
    """The result did not arrive within the timeout."""


class UserCodeError(RayServeException):
    """The deployment raised; carries the remote traceback as text."""


class DeployFailedError(RayServeException, RuntimeError):
    """An application failed to deploy; the message holds the reason (a RuntimeError,
    as Ray's serve.run raises)."""


class ControllerUnavailableError(RayServeException):
    """No surge controller answers at the control address."""


class ControlAuthError(RayServeException, PermissionError):
    """The control API refused this connection: its token is missing or wrong."""


class WeightStoreError(RayServeException):
    """surge.weights could not give the weights asked for; the subclass says why."""


class WeightSourceError(WeightStoreError, ValueError):
    """The weights' source is missing, unreadable or malformed (the message names it)."""


class WeightBudgetError(WeightStoreError):
    """The entry does not fit the store's byte budget beside the entries replicas hold."""


class WeightStoreFullError(WeightStoreError, OSError):
    """The store's directory has no room for the entry (a full /dev/shm)."""


class WeightStoreUnavailableError(WeightStoreError):
    """This node's weight store does not answer."""


_SURGE = os.path.dirname(os.path.abspath(__file__))  # src/surge


def users_traceback() -> str:
    """The exception being handled, with surge's own frames (and the import machinery's)
    left out, as Ray shows a failed constructor: what the user can act on."""
    _, exc, tb = sys.exc_info()
    assert exc is not None
    frames = [f for f in traceback.extract_tb(tb)
              if not os.path.abspath(f.filename).startswith(_SURGE + os.sep)
              and not f.filename.startswith("<frozen ")]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)
