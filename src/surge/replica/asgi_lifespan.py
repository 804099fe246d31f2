"""The ASGI lifespan protocol for a replica's ingress app: startup, then shutdown.

FastAPI's `lifespan=` and `on_event("startup"|"shutdown")` (and any ASGI app's lifespan)
run as under a server: startup after the deployment's constructor and before the
replica reports ready (a failure fails the replica's start with the app's message, as
Ray reports it), shutdown when the replica stops gracefully. The state a lifespan
yields is copied into each request's scope (`request.state`). An app that does not
speak the protocol (it raises on the `lifespan` scope before answering) is served
without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["Lifespan", "LifespanError"]

log = logging.getLogger("surge.replica")

SHUTDOWN_TIMEOUT_S = 30.0


class LifespanError(RuntimeError):
    pass


class Lifespan:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self.supported = True
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._said: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._started = False

    def __repr__(self) -> str:
        return f"<Lifespan started={self._started} supported={self.supported}>"

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        message = await self._answer()
        if message is None:
            return
        if message["type"] == "lifespan.startup.failed":
            raise LifespanError(f"ASGI lifespan startup failed: {message.get('message', '')}"
                                .rstrip(": "))
        self._started = True

    async def shutdown(self) -> None:
        if not self._started or self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        try:
            message = await asyncio.wait_for(self._answer(), SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            log.warning("the ASGI lifespan shutdown did not finish within %.0f s",
                        SHUTDOWN_TIMEOUT_S)
            self._task.cancel()
            return
        if message is not None and message["type"] == "lifespan.shutdown.failed":
            log.error("ASGI lifespan shutdown failed: %s", message.get("message", ""))

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self.state}
        try:
            await self.app(scope, self._inbox.get, self._said.put)
        except Exception as exc:
            if self._started:
                log.exception("the ASGI app's lifespan raised")
            else:  # before answering anything: it does not speak the protocol
                self.supported = False
                log.debug("the ASGI app does not support the lifespan protocol (%r)", exc)

    async def _answer(self) -> MutableMapping[str, Any] | None:
        """The app's next message, or None when it returned (or raised) without one."""
        assert self._task is not None
        said = asyncio.ensure_future(self._said.get())
        await asyncio.wait({said, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if said.done():
            return said.result()
        said.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await said
        if not self._said.empty():
            return self._said.get_nowait()
        return None
