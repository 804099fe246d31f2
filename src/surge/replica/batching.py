"""`@serve.batch`: gather concurrent calls into one call that takes a list per argument.

Each call's arguments are bound to the function's signature (so `f(x)` and `f(x=x)` are
the same call); a batch calls the function once with a list per argument, one entry per
call, in arrival order. Calls wait in groups that never share a batch: by which arguments
they passed (a call that leaves out an optional argument gets a batch of its own rather
than breaking its neighbours') and by `batch_group_key()` (the multiplexed model id). A
group's next batch is full at `max_batch_size` calls (with `batch_size_fn`: when the
next call would take the size past it) and ready when full or
`batch_wait_timeout_s` after its first call arrived. A ready batch leaves if a batch slot
is free (`max_concurrent_batches`); while every slot is busy, calls keep gathering and the
oldest ready batch leaves the moment a slot frees. (Ray Serve flushes on the timeout
anyway and queues tiny batches behind a slow one.)
These decisions are policy/batching.py's; this module holds the calls and runs batches.
A batch's arguments are replica/batch_arguments.py's.

A coroutine function returns one result per call; an async generator function yields
lists, and each caller streams its own element of each (`StopIteration` ends that
caller's stream). A batch's generator runs at most `STREAM_AHEAD_ITEMS` items ahead of
its slowest listening caller (replica/batch_stream.py); a caller that goes away leaves
the batch, and a batch with no caller left is closed, which frees its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from surge.errors import ConfigError
from surge.policy.batching import fill, next_deadline, oldest_ready
from surge.replica.batch_arguments import BatchSignature, per_call_results
from surge.replica.batch_stream import CallerStream
from surge.replica.context import RequestContext, request_context_var

__all__ = ["batch"]


def batch_group_key() -> str:
    """Which calls may share a batch, besides their arguments: those for one multiplexed
    model (`serve.get_multiplexed_model_id()`), so a batch never mixes models (Ray
    splits a formed batch by model id instead). Called in the caller's context when its
    call arrives."""
    return request_context_var.get().multiplexed_model_id


# -- options (Ray's checks and messages) --------------------------------------------------


def _check_max_batch_size(value: Any) -> int:
    if not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
        raise TypeError(f"max_batch_size must be integer >= 1, got {value}")
    if value < 1:
        raise ConfigError(f"max_batch_size must be an integer >= 1, got {int(value)}")
    return int(value)


def _check_timeout(value: Any) -> float:
    if not isinstance(value, float | int):
        raise TypeError(f"batch_wait_timeout_s must be a float >= 0, got {value}")
    if value < 0:
        raise ConfigError(f"batch_wait_timeout_s must be a float >= 0, got {value}")
    return float(value)


def _check_function(func: Any) -> None:
    if not callable(func):
        raise TypeError("@serve.batch can only be used to decorate functions or methods.")
    if not (inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)):
        raise TypeError("Functions decorated with @serve.batch must be 'async def'")


class BatchSettings:
    """One decorated function's options; the setters may run on any thread (a sync
    `reconfigure` runs on the replica's pool): queues read them at their next decision."""

    def __init__(self, max_batch_size: Any = 10, batch_wait_timeout_s: Any = 0.01,
                 max_concurrent_batches: Any = 1,
                 batch_size_fn: Callable[[list[Any]], int] | None = None) -> None:
        self.max_batch_size = _check_max_batch_size(max_batch_size)
        self.batch_wait_timeout_s = _check_timeout(batch_wait_timeout_s)
        if not isinstance(max_concurrent_batches, int) or max_concurrent_batches < 1:
            raise TypeError("max_concurrent_batches must be an integer >= 1, "
                            f"got {max_concurrent_batches}")
        self.max_concurrent_batches = max_concurrent_batches
        if batch_size_fn is not None and not callable(batch_size_fn):
            raise TypeError(f"batch_size_fn must be a callable or None, got {type(batch_size_fn)}")
        self.batch_size_fn = batch_size_fn

    def set_max_batch_size(self, new_max_batch_size: Any) -> None:
        self.max_batch_size = _check_max_batch_size(new_max_batch_size)

    def set_batch_wait_timeout_s(self, new_batch_wait_timeout_s: Any) -> None:
        self.batch_wait_timeout_s = _check_timeout(new_batch_wait_timeout_s)

    def __repr__(self) -> str:
        return (f"BatchSettings(max_batch_size={self.max_batch_size}, batch_wait_timeout_s="
                f"{self.batch_wait_timeout_s}, max_concurrent_batches="
                f"{self.max_concurrent_batches}, batch_size_fn={self.batch_size_fn!r})")


# -- one caller -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Call:
    arguments: dict[str, Any]
    item: Any  # what batch_size_fn measures
    arrived: float
    future: asyncio.Future[Any]  # a coroutine batch's result for this caller
    stream: CallerStream | None  # a streaming batch's elements for this caller

    def abandoned(self) -> bool:
        return self.stream.gone if self.stream is not None else self.future.cancelled()

    def succeed(self, result: Any) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def fail(self, error: BaseException) -> None:
        if self.stream is not None:
            self.stream.finish(error)
        elif not self.future.done():
            self.future.set_exception(error)

    def abort(self) -> None:
        """The batch was cancelled (the replica is stopping): nobody waits forever."""
        if self.stream is not None:
            self.stream.finish(asyncio.CancelledError())
        elif not self.future.done():
            self.future.cancel()


# -- one queue per instance (or per function) -----------------------------------------------


class _Group:
    """Calls that may share a batch, and how many of them the next batch takes."""

    def __init__(self, key: tuple[Hashable, Hashable]) -> None:
        self.key = key
        self.model_id = key[0]  # the group key's part (batch_group_key)
        self.calls: list[_Call] = []
        self.head = 0  # calls in the next batch, as last measured
        self.full = False
        self.limit = 0  # the max_batch_size it was measured with

    def measure(self, limit: int, size_fn: Callable[[list[Any]], int] | None) -> bool:
        """Whether the next batch is full; `head` says how many calls it takes
        (policy/batching.py)."""
        if limit != self.limit:
            self.head, self.full, self.limit = 0, False, limit
        calls = self.calls
        size_of = None if size_fn is None else (
            lambda n: size_fn([c.item for c in calls[:n]]))
        self.head, self.full = fill(len(calls), limit, size_of, self.head, self.full)
        return self.full

    def take(self) -> list[_Call]:
        calls = self.calls[: self.head]
        del self.calls[: self.head]
        self.head, self.full, self.limit = 0, False, 0
        return calls


class BatchQueue:
    """The calls waiting for one batched method of one instance, and its running batches.

    Decides on three events: a group filled up (at a call), a deadline passed (a timer),
    a batch ended (its slot frees)."""

    def __init__(self, func: Callable[..., Any], signature: BatchSignature,
                 settings: BatchSettings, owner: Any, group_key: Callable[[], Hashable],
                 on_idle: Callable[[BatchQueue], None]) -> None:
        self.func = func
        self.signature = signature
        self.settings = settings
        self.owner = owner  # None for a plain function
        self.group_key = group_key
        self.on_idle = on_idle
        self.streaming = inspect.isasyncgenfunction(func)
        self.loop = asyncio.get_running_loop()
        self.groups: dict[Hashable, _Group] = {}
        self.running = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: float | None = None

    def __repr__(self) -> str:
        waiting = sum(len(g.calls) for g in self.groups.values())
        return (f"<BatchQueue {self.func.__qualname__}: {waiting} waiting in "
                f"{len(self.groups)} groups, {self.running}/"
                f"{self.settings.max_concurrent_batches} batches running>")

    def submit(self, arguments: dict[str, Any], item: Any, shape: Hashable,
               stream: CallerStream | None) -> _Call:
        call = _Call(arguments, item, self.loop.time(), self.loop.create_future(), stream)
        key = (self.group_key(), shape)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(key)
        group.calls.append(call)
        if self._measure(group):
            self._pump(call.arrived)
        else:  # wait for company until the deadline
            self._arm_timer(call.arrived)
        return call

    def _measure(self, group: _Group) -> bool:
        """`group.measure`; a batch_size_fn that raises fails the group's calls."""
        try:
            return group.measure(self.settings.max_batch_size, self.settings.batch_size_fn)
        except Exception as exc:
            self.groups.pop(group.key, None)
            for call in group.calls:
                call.fail(exc)
            return False

    def _next_ready(self, now: float) -> _Group | None:
        """The ready group (full, or past its deadline) whose first call is oldest."""
        groups, full = [], []
        for group in list(self.groups.values()):
            measured = self._measure(group)
            if group.key in self.groups:  # (not failed by its batch_size_fn)
                groups.append(group)
                full.append(measured)
        index = oldest_ready([(g.calls[0].arrived, f) for g, f in zip(groups, full, strict=True)],
                             self.settings.batch_wait_timeout_s, now)
        return None if index is None else groups[index]

    def _pump(self, now: float) -> None:
        """Start ready batches while slots are free; then wait for the next deadline."""
        while self.running < self.settings.max_concurrent_batches:
            group = self._next_ready(now)
            if group is None:
                break
            calls = [c for c in group.take() if not c.abandoned()]  # as Ray: drop cancelled
            if not group.calls:
                del self.groups[group.key]
            if calls:
                self._start(calls, group.model_id)
        self._arm_timer(now)
        if not self.groups and not self.running:
            self.on_idle(self)

    def _arm_timer(self, now: float) -> None:
        """Wake at the next deadline; one already past matters only while a slot is free
        (a 0 s timeout: the calls of this loop iteration go together on the next)."""
        when = next_deadline([g.calls[0].arrived for g in self.groups.values()],
                             self.settings.batch_wait_timeout_s, now,
                             self.running < self.settings.max_concurrent_batches)
        if when == self.timer_at:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = when
        self.timer = None if when is None else self.loop.call_at(when, self._deadline, when)

    def _deadline(self, when: float) -> None:
        self.timer = self.timer_at = None
        # call_at may fire within the clock's resolution before `when`: it is due
        self._pump(max(self.loop.time(), when))

    def _start(self, calls: list[_Call], group: Hashable) -> None:  # group: model id
        self.running += 1
        # A batch is no one request's: its log lines carry no request id (Ray unsets its
        # request context for batches too); its calls' model id is the batch's.
        context = contextvars.Context()
        if isinstance(group, str) and group:
            context.run(request_context_var.set, RequestContext(multiplexed_model_id=group))
        task = self.loop.create_task(self._run(calls), context=context)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, calls: list[_Call]) -> None:
        try:
            args, kwargs = self.signature.batched(self.owner, [c.arguments for c in calls])
            if self.streaming:
                await self._stream(calls, args, kwargs)
            else:
                await self._once(calls, args, kwargs)
        finally:
            for call in calls:
                call.abort()  # does nothing to calls already answered
            self.running -= 1
            self._pump(self.loop.time())

    async def _once(self, calls: list[_Call], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> None:
        try:
            results = per_call_results(await self.func(*args, **kwargs), len(calls))
        except Exception as exc:
            for call in calls:
                call.fail(exc)
            return
        for call, result in zip(calls, results, strict=True):
            call.succeed(result)

    async def _stream(self, calls: list[_Call], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
        streams = [c.stream for c in calls if c.stream is not None]
        room = asyncio.Event()
        for stream in streams:
            stream.room = room
        error: BaseException | None = asyncio.CancelledError()  # unless it ends or raises
        try:
            generator: AsyncGenerator[Any, None] = self.func(*args, **kwargs)
            async with contextlib.aclosing(generator):
                async for yielded in generator:
                    for stream, item in zip(streams, per_call_results(yielded, len(streams)),
                                            strict=True):
                        stream.put(item)
                    if not any(s.open for s in streams):
                        break  # nobody listens any more: close it, free the slot
                    while any(s.full() for s in streams):  # bounded: wait for the slowest
                        room.clear()
                        await room.wait()
            error = None
        except Exception as exc:
            error = exc
        finally:
            for stream in streams:
                stream.finish(error)


# -- the decorator ------------------------------------------------------------------------


class _Queues:
    """A decorated function's queues, one per instance with calls waiting or running."""

    def __init__(self, func: Callable[..., Any], settings: BatchSettings,
                 group_key: Callable[[], Hashable]) -> None:
        self.func = func
        self.settings = settings
        self.group_key = group_key
        self.signature = BatchSignature(func)
        self.wrapper: Callable[..., Any] | None = None
        # A queue holds its owner while it has calls, so its id is not reused meanwhile.
        self.queues: dict[int, BatchQueue] = {}

    def owner(self, args: tuple[Any, ...]) -> Any:
        """The instance when this is a method call (the wrapper is on its class), else None."""
        if args:
            name = self.func.__name__
            if any(vars(klass).get(name) is self.wrapper for klass in type(args[0]).__mro__):
                return args[0]
        return None

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any],
               stream: CallerStream | None) -> _Call:
        owner = self.owner(args)
        arguments, shape = self.signature.bind(args, kwargs, owner is not None)
        item = self.signature.first_item(arguments)
        settings = self.settings
        if (settings.batch_size_fn is not None
                and settings.batch_size_fn([item]) > settings.max_batch_size):
            raise RuntimeError("Size of item is greater than max_batch_size. Please increase "
                               "the max_batch_size or check the implementation of the "
                               "batch_size_fn.")
        queue = self.queues.get(id(owner))
        if queue is None:
            queue = self.queues[id(owner)] = BatchQueue(
                self.func, self.signature, settings, owner, self.group_key, self._idle)
        return queue.submit(arguments, item, shape, stream)

    def __repr__(self) -> str:
        return f"[{', '.join(map(repr, self.queues.values()))}]"

    def _idle(self, queue: BatchQueue) -> None:
        if self.queues.get(id(queue.owner)) is queue:
            del self.queues[id(queue.owner)]


def wrap(func: Callable[..., Any], settings: BatchSettings, *,
         group_key: Callable[[], Hashable] = batch_group_key) -> Callable[..., Any]:
    """`func` batched with `settings`; `group_key` keeps calls apart (see batch_group_key)."""
    _check_function(func)
    queues = _Queues(func, settings, group_key)
    wrapper: Callable[..., Any]
    if inspect.isasyncgenfunction(func):
        @functools.wraps(func)
        async def stream_wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            stream = CallerStream()
            queues.submit(args, kwargs, stream)
            try:
                async for item in stream:
                    yield item
            finally:
                stream.leave()
        wrapper = stream_wrapper
    else:
        @functools.wraps(func)
        async def call_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await queues.submit(args, kwargs, None).future
        wrapper = call_wrapper
    queues.wrapper = wrapper
    vars(wrapper).update(
        set_max_batch_size=settings.set_max_batch_size,
        set_batch_wait_timeout_s=settings.set_batch_wait_timeout_s,
        _get_max_batch_size=lambda: settings.max_batch_size,
        _get_batch_wait_timeout_s=lambda: settings.batch_wait_timeout_s,
        __surge_batch_queues__=queues,  # live state, for tests and debugging
        __surge_batch__={"max_batch_size": settings.max_batch_size,  # for `surge config lint`
                         "batch_wait_timeout_s": settings.batch_wait_timeout_s,
                         "max_concurrent_batches": settings.max_concurrent_batches})
    return wrapper


def batch(_func: Callable[..., Any] | None = None, /, max_batch_size: int = 10,
          batch_wait_timeout_s: float = 0.01, max_concurrent_batches: int = 1,
          batch_size_fn: Callable[[list[Any]], int] | None = None) -> Any:
    """Ray Serve's `@serve.batch`, with its defaults (10 calls, 10 ms, one batch at a time).

    Bare (`@serve.batch`) or with options; on `async def` methods and functions, coroutine
    or async generator. The decorated function gets `set_max_batch_size()` and
    `set_batch_wait_timeout_s()` (e.g. for `reconfigure`)."""
    if _func is not None:
        _check_function(_func)
    options = (max_batch_size, batch_wait_timeout_s, max_concurrent_batches, batch_size_fn)
    BatchSettings(*options)  # checked now, as Ray does, not when a function is decorated

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        return wrap(func, BatchSettings(*options))  # each function its own settings

    return decorate(_func) if _func is not None else decorate
