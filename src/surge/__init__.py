"""surge: Ray Serve's API on a data path built for cliff-shaped traffic pulses.

    from surge import serve

`surge.serve` is imported on first use, not with the package: surge's own processes
(controller, proxy, weight store) import only what they run, which keeps their start
and their memory small.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surge import serve

__all__ = ["__version__", "serve"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "serve":
        return importlib.import_module("surge.serve")
    raise AttributeError(f"module 'surge' has no attribute {name!r}")
