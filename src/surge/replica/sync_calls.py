"""Handle calls to a replica's plain `def` methods: run on the thread pool, answered there.

A sync method always runs on the user code's thread pool, never on the event loop: it
may block, call other deployments with `.result()`, run its own event loop, and run
beside other requests. What changes is the way back. Through `run_in_executor` the
answer went worker -> `call_soon_threadsafe` -> future -> task -> loop -> socket: two
more wake-ups and about twice the CPU of the call itself. Here the worker that ran the
call answers it: it frees the slot (ReplicaServer's counts are locked), writes the
answer on the connection itself (transport/threadsafe.py) and leaves its latency for
the loop to pick up with the next telemetry report. The loop never waits for it and is
not woken for it.

A `Baton` decides, once, who ends a call: its worker, when the call has run, or the
loop, when a Cancel comes or the connection closes first (then the loop answers
"cancelled" and frees the slot at once, as for a task, and the worker's outcome is
dropped). A method that returns an awaitable hands it back to the loop, which awaits it
in a task as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from surge.clock import Clock
from surge.observability.logs import request_id_var
from surge.replica.context import RequestContext, request_context_var
from surge.replica.user_code import UserCode
from surge.router.children import ChildCalls, child_calls_var
from surge.transport.messages import Call as CallFrame

__all__ = ["Baton", "Ran", "SyncCalls"]

log = logging.getLogger("surge.replica")


class Ran(NamedTuple):
    """How one run of a method on its worker ended."""

    value: Any
    error: BaseException | None
    finished: float  # the clock's monotonic time when it ended


Call = tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs)


class Baton:
    """Who ends one call: its worker (`claim`) or the loop (`take`), whoever is first."""

    __slots__ = ("_lock", "holder")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holder = ""  # "", then "worker" or "loop"

    def __repr__(self) -> str:
        return f"<Baton {self.holder or 'running'}>"

    def claim(self) -> bool:
        """(The worker, its call run.) True: the worker answers."""
        return self._move("worker")

    def take(self) -> bool:
        """(The loop: a Cancel, a closed connection.) True: the loop ends the call."""
        return self._move("loop")

    def _move(self, holder: str) -> bool:
        with self._lock:
            if self.holder:
                return False
            self.holder = holder
            return True


class SyncCalls:
    def __init__(self, user: UserCode, clock: Clock, app: str = "") -> None:
        self.user = user
        self.app = app  # for each call's request context
        self.clock = clock
        self._loop = asyncio.get_running_loop()
        self._plain: dict[str, Callable[..., Any] | None] = {}  # methods the user has

    def __repr__(self) -> str:
        return f"<SyncCalls plain={sorted(k for k, v in self._plain.items() if v)}>"

    def method(self, name: str) -> Callable[..., Any] | None:
        """The plain `def` method `name` (not async, not a generator), else None."""
        try:
            return self._plain[name]
        except KeyError:
            pass
        method = self.user.plain_method(name)
        if method is not None or self.user.has_method(name):
            self._plain[name] = method  # only real names: callers choose them
        return method

    def run(self, method: Callable[..., Any], call: Call, frame: CallFrame, baton: Baton,
            children: ChildCalls, answer: Callable[[Ran], None],
            hand_back: Callable[[Ran], None]) -> None:
        """Submit the call to the pool (in a context of its own that carries the request
        id, so the user's log lines do, the request's context: its multiplexed model
        id, and the handle calls it makes, cancelled with it). Its worker then calls
        `answer` if it claims the baton, or has the loop call `hand_back` with an
        awaitable the method returned."""
        context = contextvars.copy_context()
        context.run(request_id_var.set, frame.request_id)
        context.run(child_calls_var.set, children)
        context.run(request_context_var.set, RequestContext(
            "", frame.request_id, self.app, frame.model_id, session_id=frame.session_id))
        self.user.pool.submit(context.run, self._run, method, call, baton, answer, hand_back)

    def _run(self, method: Callable[..., Any], call: Call, baton: Baton,
             answer: Callable[[Ran], None], hand_back: Callable[[Ran], None]) -> None:
        """On the worker: run the call, then end it if nobody else has."""
        args, kwargs = call
        try:
            ran = Ran(method(*args, **kwargs), None, self.clock.monotonic())
        except BaseException as exc:  # SystemExit too: answered, then reraised on the loop
            ran = Ran(None, exc, self.clock.monotonic())
        if inspect.isawaitable(ran.value):
            self._loop.call_soon_threadsafe(hand_back, ran)  # needs the loop to await it
        elif baton.claim():
            try:
                answer(ran)
            except Exception:  # never lose the loop's view of the slot over a bug here
                log.exception("answering a call on its worker failed")
        if ran.error is not None and not isinstance(ran.error, Exception):
            self._loop.call_soon_threadsafe(_reraise, ran.error)  # as a task would


def _reraise(error: BaseException) -> None:
    raise error
