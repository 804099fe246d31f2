"""DeploymentHandle: call a deployment from Python, through the same router as HTTP.

`handle.remote()` returns a `DeploymentResponse` at once (a
`DeploymentResponseGenerator` with `.options(stream=True)`): each call, from its
submission on whichever thread makes it to its answer, is router/responses.py's.
`handle.method.choose_replica()` holds a slot on a replica and `.dispatch(selection, ...)`
sends the call there (router/selection.py).
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

from surge.model import DeploymentId
from surge.router.answers import decode_failure
from surge.router.responses import DeploymentResponse, DeploymentResponseGenerator, HandleCall
from surge.router.runtime import current_runtime
from surge.router.selection import ReplicaSelection, choose_replica

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator",
           "HandleOptions", "ReplicaSelection", "decode_failure"]


@dataclass(frozen=True)
class HandleOptions:
    """What `handle.options()` sets (Ray's `handle.handle_options`). Kept in one record,
    not as the handle's own attributes, so that a deployment method named `stream`,
    `method_name` or `session_id` is reached as `handle.stream` like any other."""

    method_name: str = "__call__"
    stream: bool = False
    multiplexed_model_id: str = ""
    session_id: str = ""  # as Ray: the callee's request context says it


class DeploymentHandle:
    """A handle to a deployment (Ray Serve's `DeploymentHandle`).

    Any attribute that is not the handle's own API (`options`, `remote`,
    `choose_replica`, `dispatch`, `shutdown`, `shutdown_async`, `deployment_name`,
    `app_name`, `deployment_id`, `handle_options`, `handle_id`, `init_options`, and
    Ray's internal `request_counter`, which surge has not) is a method of the deployment.
    """

    # Ray's handles keep InitHandleOptions here once their router starts; surge's handles
    # have none of their own (routers belong to the process's runtime, shared by all).
    init_options: None = None

    def __init__(self, deployment_name: str, app_name: str, *,
                 handle_options: HandleOptions | None = None,
                 _handle_id: str | None = None) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.deployment_id = DeploymentId(app_name, deployment_name)
        self.handle_options = handle_options or HandleOptions()
        # As Ray's: random per handle, shared with the handles `.options()` and
        # `.method` make from it; a handle rebuilt from a pickle gets a new one.
        self.handle_id = _handle_id or secrets.token_hex(4)

    def __repr__(self) -> str:
        options = self.handle_options
        return (f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r}, "
                f"method={options.method_name!r}, stream={options.stream})")

    def options(self, *, method_name: str | None = None, stream: bool | None = None,
                multiplexed_model_id: str | None = None, session_id: str | None = None,
                **_ray_only: Any) -> DeploymentHandle:
        old = self.handle_options
        return DeploymentHandle(self.deployment_name, self.app_name, handle_options=HandleOptions(
            old.method_name if method_name is None else method_name,
            old.stream if stream is None else stream,
            old.multiplexed_model_id if multiplexed_model_id is None else multiplexed_model_id,
            old.session_id if session_id is None else session_id), _handle_id=self.handle_id)

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("__"):  # Python's protocols; `_private` methods are callable
            raise AttributeError(name)
        if name == "request_counter":  # an attribute on Ray's handles, so never a method
            raise AttributeError(
                "'DeploymentHandle' has no 'request_counter': Ray's per-handle metrics "
                "Counter is internal; surge counts calls per deployment "
                "(serve_deployment_request_counter_total, docs/observability.md). Call a "
                "deployment method of that name with "
                "handle.options(method_name='request_counter').")
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any
               ) -> DeploymentResponse | DeploymentResponseGenerator:
        request = HandleCall(self.deployment_id, self.handle_options, args, kwargs)
        if self.handle_options.stream:
            return DeploymentResponseGenerator(request)
        return DeploymentResponse(request)

    def choose_replica(self, *args: Any, **kwargs: Any
                       ) -> contextlib.AbstractAsyncContextManager[ReplicaSelection]:
        """`async with handle.method.choose_replica() as selection:` holds a slot on the
        replica this call would go to, until `dispatch(selection, ...)` uses it or the
        block ends (router/selection.py). The arguments do not steer surge's routing."""
        return choose_replica(current_runtime(), self.deployment_id, self.handle_options)

    def dispatch(self, selection: ReplicaSelection, *args: Any, **kwargs: Any
                 ) -> DeploymentResponse | DeploymentResponseGenerator:
        """Send the call to the replica `selection` names, in the slot it holds, with the
        method and options of the handle that chose it (awaited before the block ends)."""
        if not isinstance(selection, ReplicaSelection):
            raise TypeError(f"dispatch takes a ReplicaSelection, not {type(selection).__name__}")
        if selection._deployment_id != self.deployment_id:
            raise ValueError(
                "Cannot dispatch a selection created for a different deployment. This handle "
                f"is for {self.deployment_id}, but the selection was created for "
                f"{selection._deployment_id}.")
        if selection._dispatched:
            raise RuntimeError(f"ReplicaSelection for {selection.replica_id} has already "
                               "been dispatched.")
        selection._dispatched = True
        options = selection._options or HandleOptions()  # the handle's that chose it
        request = HandleCall(self.deployment_id, options, args, kwargs, selection._reservation)
        if options.stream:
            return DeploymentResponseGenerator(request)
        return DeploymentResponse(request)

    def shutdown(self) -> None:
        """As Ray's, which stops the handle's own metrics pusher; calls still work after
        it. surge's router and its load reports belong to the process's runtime and are
        shared by every handle to the deployment, so there is nothing of this handle's
        own to stop: they end with the runtime (`serve.shutdown()`, process exit)."""

    async def shutdown_async(self) -> None:
        """`shutdown()` for a caller on an event loop (Ray's way to await it)."""
        self.shutdown()

    def __reduce__(self) -> tuple[Any, ...]:
        options = self.handle_options
        return (_rebuild_handle, (self.deployment_name, self.app_name, options.method_name,
                                  options.stream, options.multiplexed_model_id,
                                  options.session_id))


def _rebuild_handle(name: str, app: str, method: str, stream: bool, model_id: str,
                    session_id: str = "") -> DeploymentHandle:
    return DeploymentHandle(name, app, handle_options=HandleOptions(method, stream, model_id,
                                                                    session_id))
