"""The handle calls a request made, so that cancelling the request cancels them too.

Ray Serve cancels recursively: when a request is cancelled (its client went away, its
`request_timeout_s` passed, or its caller called `response.cancel()`), so is every
handle call its handler made and that has not finished, queued at a router or running
on a replica, and so on down the call tree. The replica gives each request it serves a
`ChildCalls` in `child_calls_var`; a `DeploymentResponse` or
`DeploymentResponseGenerator` made in that context (the request's task, tasks it starts,
the worker running a sync method) joins it, and leaves once it has finished. When a
Cancel for the request comes (or its router's connection closes), the replica calls
`ChildCalls.cancel`, which cancels each member through the handle's own cancel: a
queued call leaves its router's queue, a running one gets a Cancel frame of its own,
and its replica does the same in turn. Calls made after that (a handler's clean-up in
`except asyncio.CancelledError`) are not cancelled, so that clean-up may still call
other deployments. A call made outside any request (in a constructor, in a task it
started) belongs to none and is left alone, as is a call still running when its
request ends normally (a fire-and-forget call goes on).
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

__all__ = ["ChildCalls", "child_calls_var"]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# Makes a ChildCalls' state at its first join (once per request that calls another).
_STARTING = threading.Lock()


class ChildCalls:
    """The unfinished handle calls of one request. Members join from any thread (a sync
    method's worker) and leave from whichever thread finishes them, hence the lock.

    Its lock, calls and keys are made when the first call joins: every request the
    replica serves gets one and most make no handle call, so until one does it is an
    empty object (no __init__ to run, no lock to allocate)."""

    # (lock, unfinished calls by key, keys), made at the first join
    _state: tuple[threading.Lock, dict[int, Cancellable], Iterator[int]] | None = None

    def __repr__(self) -> str:
        return f"<ChildCalls unfinished={len(self)}>"

    def __len__(self) -> int:
        state = self._state
        return 0 if state is None else len(state[1])

    def _start(self) -> tuple[threading.Lock, dict[int, Cancellable], Iterator[int]]:
        with _STARTING:  # two threads' first joins make one state
            if self._state is None:
                self._state = (threading.Lock(), {}, itertools.count())
            return self._state

    def join(self, call: Cancellable) -> Callable[[object], None]:
        """Add `call`; returns the done-callback that takes it out once it has finished
        (it holds a key, not the call: no cycle through the call's own future)."""
        lock, calls, keys = self._state or self._start()
        key = next(keys)
        with lock:
            calls[key] = call

        def leave(_done: object) -> None:
            with lock:
                calls.pop(key, None)

        return leave

    def cancel(self) -> None:
        """Cancel every unfinished call (none if none joined: one joining meanwhile
        joins after the cancel, and is left alone)."""
        state = self._state
        if state is None:
            return
        lock, calls, _ = state
        with lock:
            unfinished = list(calls.values())
            calls.clear()
        for call in unfinished:  # outside the lock: a cancel may finish a call, which leaves
            call.cancel()


child_calls_var: contextvars.ContextVar[ChildCalls | None] = contextvars.ContextVar(
    "surge_child_calls", default=None)
