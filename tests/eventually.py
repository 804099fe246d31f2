"""The one way a test waits for something: poll a state probe until it holds.

    pids = eventually(lambda: running_pids() or None, 10, what="a replica RUNNING")

`eventually` calls the predicate until it returns a truthy value and returns that value.
A predicate that raises is retried. When time runs out it raises AssertionError saying
what was awaited, how long it waited, the predicate's last value and, if it ever
raised, its last exception. The predicate is always called once more at the deadline,
so a timeout means the state did not hold then either.

`eventually_async` is the same for asyncio tests; its predicate may be sync or return
an awaitable (which is bounded by the time left, so a probe that hangs cannot hang the
test).

Never `sleep` to let something happen before asserting it: wait for it with these.
"""

from __future__ import annotations

import asyncio
import inspect
import linecache
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["eventually", "eventually_async"]

T = TypeVar("T")

_NOTHING: Any = object()  # the predicate never returned
_REPR_LIMIT = 600


def _describe(predicate: Callable[..., Any], what: str) -> str:
    if what:
        return what
    name = getattr(predicate, "__qualname__", None) or repr(predicate)
    code = getattr(predicate, "__code__", None)
    if "<lambda>" in name and code is not None:
        line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
        where = code.co_filename
        if where.startswith(os.getcwd() + os.sep):
            where = os.path.relpath(where)
        return f"lambda at {where}:{code.co_firstlineno} ({line})"
    return name


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "...(truncated)"


class _Attempts:
    """What the predicate did so far: the raw material of the timeout message."""

    def __init__(self, predicate: Callable[..., Any], timeout_s: float, what: str) -> None:
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, not {timeout_s}")
        self.predicate = predicate
        self.timeout_s = timeout_s
        self.what = what
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.count = 0
        self.value: Any = _NOTHING
        self.error: BaseException | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def failure(self) -> AssertionError:
        waited = time.monotonic() - self.started
        parts = [f"timed out after {waited:.2f}s (timeout {self.timeout_s:g}s, "
                 f"{self.count} attempts) waiting for {_describe(self.predicate, self.what)}"]
        if self.value is _NOTHING:
            parts.append("the predicate never returned")
        else:
            parts.append(f"last value: {_short(self.value)}")
        if self.error is not None:
            detail = str(self.error) or "(no message)"
            parts.append(f"last exception: {type(self.error).__name__}: {detail}")
        return AssertionError("; ".join(parts))


def eventually(predicate: Callable[[], T], timeout_s: float, *, interval_s: float = 0.05,
               what: str = "") -> T:
    """The first truthy value of `predicate()` within `timeout_s`; else AssertionError."""
    attempts = _Attempts(predicate, timeout_s, what)
    while True:
        attempts.count += 1
        try:
            value = predicate()
        except Exception as exc:  # retried; shown if time runs out
            attempts.error = exc
        else:
            if value:
                return value
            attempts.value = value
        left = attempts.left()
        if left <= 0:
            raise attempts.failure() from attempts.error
        time.sleep(min(interval_s, left))


async def eventually_async(predicate: Callable[[], T | Awaitable[T]], timeout_s: float, *,
                           interval_s: float = 0.01, what: str = "") -> T:
    """`eventually` for asyncio tests: waits with asyncio.sleep, awaits an awaitable."""
    attempts = _Attempts(predicate, timeout_s, what)
    while True:
        attempts.count += 1
        try:
            value = predicate()
            if inspect.isawaitable(value):
                # bounded by the time left (at least one interval): a hung probe is a timeout
                value = await asyncio.wait_for(value, max(attempts.left(), interval_s))
        except Exception as exc:  # retried; shown if time runs out
            attempts.error = exc
        else:
            if value:
                return value  # type: ignore[return-value]
            attempts.value = value
        left = attempts.left()
        if left <= 0:
            raise attempts.failure() from attempts.error
        await asyncio.sleep(min(interval_s, left))
