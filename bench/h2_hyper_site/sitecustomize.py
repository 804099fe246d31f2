"""On PYTHONPATH (bench/grpc_echo.py's `hyper` system), every process that imports
surge's gRPC core gets python-hyper's h2 behind it instead of surge's own HTTP/2
(bench/h2_hyper.py): the B side of the A/B, without a switch in surge itself."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

TARGET = "surge.proxy.grpc_core"


class _Swap(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
            from bench.h2_hyper import install

            install(module)
            marks = os.environ.get("SURGE_BENCH_H2_MARKS")
            if marks:  # for the bench to check that its proxy runs h2
                with open(marks, "a") as file:
                    file.write(f"{os.getpid()}\n")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Swap())
