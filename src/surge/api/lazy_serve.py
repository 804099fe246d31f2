"""What `surge.serve` loads on first use (PEP 562): `batch`, the multiplexing pair and
the `metrics` module. A driver that uses none of them does not import them (~30 ms of
its start); replicas get them from the fork server's template (replica/forkserver.py).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["serve_attribute", "serve_names"]

_LAZY = {"batch": "surge.replica.batching", "multiplexed": "surge.replica.multiplex",
         "get_multiplexed_model_id": "surge.replica.multiplex"}


def serve_attribute(name: str) -> Any:
    """`surge.serve.__getattr__`: the module's attributes that are not imported with it."""
    if name == "metrics":
        return importlib.import_module("surge.serve.metrics")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'surge.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(sys.modules["surge.serve"], name, value)  # later lookups are plain reads
    return value


def serve_names() -> list[str]:
    """`surge.serve.__dir__`: what it holds, and what it loads on first use."""
    return sorted({*vars(sys.modules["surge.serve"]), *_LAZY, "metrics"})
