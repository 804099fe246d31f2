"""A bench-only timing hook (bench/llm_router_cpu.py --choose-times puts this directory on
PYTHONPATH): in every process that imports surge's router, the time routing holds each
request, from its body (`Router._start`: the prompt read into chunk names, then the
choice) to the moment its send begins (`Router._go`), is timed on the wall clock and in
the thread's CPU time (the wall clock also counts the proxy's waits for a core, which on
a shared host are the host's, not routing's). A
request that queues is held for each attempt (`_start`, then each drain's `_choose`)
but not for its wait in the queue between them, which is capacity, not routing. Each is
written with whether the router reads prompts and the body's size, appended to
`$SURGE_BENCH_CHOOSE_TIMES/<pid>.jsonl` (a line of the last 256 at a time, so writing
stays O(1) a request). The router's lock is held through all three calls and the proxy
routes on one thread, so one attempt is timed at a time."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from typing import Any

_OUT = os.environ.get("SURGE_BENCH_CHOOSE_TIMES", "")
_TARGET = "surge.router.router"
_samples: list[tuple[bool, int, int, int]] = []
_held: dict[int, tuple[int, int]] = {}  # id(pending) -> (wall, CPU) ns of attempts not sent
_attempt = [0, 0, 0]  # [this attempt's start: wall ns, CPU ns; 1 while inside _start]


def _record(self: Any, pending: Any) -> None:
    """`pending`'s send begins: its routing time is this attempt's plus the earlier."""
    wall, cpu = _held.pop(id(pending), (0, 0))
    wall += time.perf_counter_ns() - _attempt[0]
    cpu += time.thread_time_ns() - _attempt[1]
    body = getattr(pending.message, "body", b"") or b""
    _samples.append((bool(self._prefix_routing), len(body), wall, cpu))
    if len(_samples) >= 256:
        with open(os.path.join(_OUT, f"{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps(_samples) + "\n")
        _samples.clear()


def _not_sent(pending: Any) -> None:
    wall, cpu = _held.get(id(pending), (0, 0))
    _held[id(pending)] = (wall + time.perf_counter_ns() - _attempt[0],
                          cpu + time.thread_time_ns() - _attempt[1])


def _patch(module: Any) -> None:
    router = module.Router
    start, choose, go = router._start, router._choose, router._go

    def _start(self: Any, pending: Any, thread: Any = None) -> bool:
        _attempt[:] = [time.perf_counter_ns(), time.thread_time_ns(), 1]
        try:
            sent = start(self, pending, thread)
        finally:
            _attempt[2] = 0
        if not sent:
            _not_sent(pending)
        return sent

    def _choose(self: Any, pending: Any, fallback: Any = None) -> int:
        if _attempt[2]:  # inside _start: its attempt is timed already
            return choose(self, pending, fallback)
        _attempt[:2] = [time.perf_counter_ns(), time.thread_time_ns()]  # a drain's attempt
        index = choose(self, pending, fallback)
        if index < 0:
            _not_sent(pending)
        return index

    def _go(self: Any, pending: Any, index: int, thread: Any = None) -> None:
        _record(self, pending)
        go(self, pending, index, thread)

    router._start, router._choose, router._go = _start, _choose, _go


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _OUT:
    sys.meta_path.insert(0, _Finder())
