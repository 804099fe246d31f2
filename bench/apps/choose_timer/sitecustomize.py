"""A bench-only timing hook (bench/llm_router_cpu.py --choose-times puts this directory on
PYTHONPATH): in every process that imports surge's router, each `Router._choose` (the
replica choice: with prefix routing, the prompt read into chunk names, the index and the
scores) is timed on the wall clock and written, with whether the router reads prompts
and the body's size, appended to `$SURGE_BENCH_CHOOSE_TIMES/<pid>.jsonl` (a line of the
last 256 choices at a time, so writing stays O(1) a choice). It is the time routing holds
a request (and the proxy's loop) between its body and its send."""

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
_samples: list[tuple[bool, int, int]] = []


def _patch(module: Any) -> None:
    original = module.Router._choose

    def _choose(self: Any, pending: Any, fallback: bool) -> int:
        started = time.perf_counter_ns()
        try:
            return original(self, pending, fallback)
        finally:
            body = getattr(pending.message, "body", b"") or b""
            _samples.append((bool(self._prefix_routing), len(body),
                             time.perf_counter_ns() - started))
            if len(_samples) >= 256:
                with open(os.path.join(_OUT, f"{os.getpid()}.jsonl"), "a") as out:
                    out.write(json.dumps(_samples) + "\n")
                _samples.clear()

    module.Router._choose = _choose


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
