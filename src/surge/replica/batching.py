"""`@serve.batch`: gather concurrent calls into one list call.

A batch flushes when it holds `max_batch_size` items or `batch_wait_timeout_s` after
its first item arrived, whichever comes first, if a batch slot is free
(`max_concurrent_batches`); while every slot is busy, items keep gathering and the
next batch leaves the moment a slot frees. (Ray Serve flushes on the timeout anyway and
queues tiny batches behind a slow one.) The wrapped method takes a list and returns a
list of the same length; each caller gets its own element (or the exception).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from surge.errors import ConfigError

__all__ = ["batch"]


class _Batcher:
    def __init__(self, func: Callable[..., Awaitable[list[Any]]], max_batch_size: int,
                 timeout_s: float, max_concurrent_batches: int) -> None:
        self.func = func
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self.items: list[tuple[Any, asyncio.Future[Any]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.max_concurrent = max_concurrent_batches
        self.running = 0
        self.owner: Any = None

    def add(self, owner: Any, item: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.owner = owner
        self.items.append((item, future))
        if len(self.items) >= self.max_batch_size:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.timeout_s, self._flush)
        return future

    def _flush(self) -> None:
        """Send a batch if a slot is free; otherwise the next finishing batch sends it."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.items or self.running >= self.max_concurrent:
            return
        items = self.items[: self.max_batch_size]
        del self.items[: self.max_batch_size]
        self.running += 1
        asyncio.get_running_loop().create_task(self._run(items))
        if self.items:  # more than one batch's worth waiting
            self._flush()

    def _slot_freed(self) -> None:
        self.running -= 1
        self._flush()

    async def _run(self, items: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        try:
            await self._call(items)
        finally:
            self._slot_freed()

    async def _call(self, items: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        inputs = [item for item, _ in items]
        try:
            args = (inputs,) if self.owner is None else (self.owner, inputs)
            results = await self.func(*args)
            if not isinstance(results, list) or len(results) != len(items):
                raise TypeError(
                    f"a @serve.batch method must return a list of {len(items)} results, "
                    f"got {type(results).__name__}"
                    + (f" of length {len(results)}" if isinstance(results, list) else ""))
        except Exception as exc:
            for _, future in items:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(items, results, strict=True):
            if not future.done():
                future.set_result(result)


def batch(_func: Callable[..., Any] | None = None, *, max_batch_size: int = 10,
          batch_wait_timeout_s: float = 0.01, max_concurrent_batches: int = 1) -> Any:
    """Ray Serve's `@serve.batch` (same defaults: 10 items, 10 ms)."""
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ConfigError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
    if batch_wait_timeout_s < 0:
        raise ConfigError("batch_wait_timeout_s must be >= 0")

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(func):
            raise ConfigError(f"@serve.batch needs an async function; {func.__qualname__} "
                              "is not `async def`")
        is_method = "self" in inspect.signature(func).parameters
        batchers: dict[int, _Batcher] = {}

        def batcher_for(owner: Any) -> _Batcher:
            key = id(owner)
            if key not in batchers:
                batchers[key] = _Batcher(func, max_batch_size, batch_wait_timeout_s,
                                         max_concurrent_batches)
            return batchers[key]

        if is_method:
            @functools.wraps(func)
            async def method_wrapper(self: Any, item: Any) -> Any:
                return await batcher_for(self).add(self, item)
            wrapper: Callable[..., Any] = method_wrapper
        else:
            @functools.wraps(func)
            async def function_wrapper(item: Any) -> Any:
                return await batcher_for(None).add(None, item)
            wrapper = function_wrapper
        wrapper.__surge_batch__ = {  # type: ignore[attr-defined]
            "max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s,
            "max_concurrent_batches": max_concurrent_batches}
        return wrapper

    return wrap(_func) if _func is not None else wrap
