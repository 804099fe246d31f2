"""Choose a replica first, send to it later: `handle.method.choose_replica()` and
`handle.method.dispatch(selection, ...)`, as Ray Serve 2.60 has them.

`choose_replica` is an async context manager. Entering it hands the router a
`Reservation` (replica_link.py) in the request's place: the router routes it as it
would the call (power of two choices, the model or session affinity the handle's
options ask for), queues it when every replica is full, or refuses it at once with
BackPressureError / DeploymentUnavailableError. Once a slot is held on a replica, the
context yields a `ReplicaSelection` that names the replica; the slot counts against
`max_ongoing_requests` like a request in flight. `dispatch` sends the request in that
slot, to that replica only (a replica that rejects it, full with other routers'
requests, is tried again; one that has gone raises ReplicaUnavailableError). Leaving
the context without dispatching frees the slot. The method, `stream` and the other
options are those of the handle that chose; the dispatching handle's are not read, as
in Ray. The arguments given to `choose_replica` do not steer surge's routing.

The router lives on the runtime's loop; the caller may be on another loop (a driver's
`asyncio.run`), so reserving and releasing go to the runtime's loop and the caller
awaits a concurrent future.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from surge.model import DeploymentId, ReplicaInfo
from surge.router.replica_link import ReplicaLink, Reservation
from surge.router.router import Router
from surge.router.runtime import RouterRuntime
from surge.transport.messages import Call
from surge.transport.rpc import split_address

if TYPE_CHECKING:
    from surge.router.handle import HandleOptions

__all__ = ["ReplicaSelection", "choose_replica"]

# A replica reached over a Unix socket runs on this machine.
LOCAL_IP = "127.0.0.1"


@dataclass(eq=False)
class ReplicaSelection:
    """The replica `choose_replica` holds a slot on (Ray's fields; `node_id` is surge's
    node name, `availability_zone` None and `replica_metadata` empty: surge has neither).
    """

    replica_id: str  # as the replica's `get_replica_context().replica_id.unique_id`
    node_ip: str
    port: int | None
    node_id: str
    availability_zone: str | None = None
    replica_metadata: dict[str, Any] = field(default_factory=dict)
    _deployment_id: DeploymentId = field(default=DeploymentId("", ""), repr=False)
    _options: HandleOptions | None = field(default=None, repr=False)  # the chooser's
    _reservation: Reservation | None = field(default=None, repr=False)
    _dispatched: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.node_ip}:{self.port}" if self.port else self.node_ip

    def to_dict(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "node_ip": self.node_ip, "port": self.port,
                "node_id": self.node_id, "availability_zone": self.availability_zone,
                "replica_metadata": self.replica_metadata}


def _where(info: ReplicaInfo) -> tuple[str, int | None]:
    """(node_ip, port) of a replica's frame server."""
    if info.address.startswith("unix:"):
        return LOCAL_IP, None
    host, port = split_address(info.address)
    return host, port


def _reserve(runtime: RouterRuntime, deployment: DeploymentId,
             reservation: Reservation) -> None:
    """(The runtime's loop.) Hand the reservation to the router, once it has replicas."""
    router = runtime.router(deployment)

    def submit() -> None:
        if reservation.granted.done():  # given up while the router waited for replicas
            return
        try:
            router.submit(reservation)
        except Exception as exc:
            reservation.fail(exc)

    if router.ready.is_set():
        submit()
    else:
        task = runtime.loop.create_task(router.ready.wait())
        task.add_done_callback(lambda _: submit())
        def stop_waiting(_: object) -> None:  # (maybe given up on the caller's thread)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits
                runtime.loop.call_soon_threadsafe(task.cancel)

        reservation.granted.add_done_callback(stop_waiting)


def _release(runtime: RouterRuntime, deployment: DeploymentId,
             reservation: Reservation) -> None:
    """Free the reservation's slot, from any thread."""
    router = runtime.routers.get(deployment)
    if router is None:
        return
    if asyncio._get_running_loop() is runtime.loop:
        router.release(reservation)
    else:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to free
            runtime.loop.call_soon_threadsafe(router.release, reservation)


def _selection(router: Router, link: ReplicaLink, deployment: DeploymentId,
               options: HandleOptions, reservation: Reservation) -> ReplicaSelection:
    info = router.replica_info(link.replica_id)  # None: gone already (dispatch will say)
    node_ip, port = _where(info) if info is not None else (LOCAL_IP, None)
    node_id = info.node_id if info is not None else ""
    return ReplicaSelection(link.replica_id, node_ip, port, node_id,
                            _deployment_id=deployment, _options=options,
                            _reservation=reservation)


@contextlib.asynccontextmanager
async def choose_replica(runtime: RouterRuntime, deployment: DeploymentId,
                         options: HandleOptions) -> AsyncIterator[ReplicaSelection]:
    """Hold a slot on the replica the router picks for a call with these options,
    and yield it; free the slot on exit unless dispatched."""
    reservation = Reservation(Call(
        id=0, method=options.method_name, payload=b"", stream=options.stream,
        model_id=options.multiplexed_model_id, session_id=options.session_id))
    runtime.loop.call_soon_threadsafe(_reserve, runtime, deployment, reservation)
    selection: ReplicaSelection | None = None
    try:
        link = await asyncio.wrap_future(reservation.granted)
        selection = _selection(runtime.routers[deployment], link, deployment, options,
                               reservation)
        yield selection
    finally:
        if selection is None or not selection._dispatched:
            with contextlib.suppress(concurrent.futures.CancelledError):
                reservation.granted.cancel()  # not held yet: the router skips it
            _release(runtime, deployment, reservation)
