"""A one-deployment app for tests/e2e/test_rayservice.py, driven by its config alone.

Its environment (a deployment's `runtime_env.env_vars`) says which version it is and
whether its constructor fails, so a RayService config change can roll it to a new
version or make its new replicas fail to start, as a real model's would.
"""

from __future__ import annotations

import os
from typing import Any

from surge import serve


@serve.deployment(max_constructor_retry_count=1)
class Greeter:
    def __init__(self) -> None:
        if os.environ.get("GREETER_FAIL_INIT"):
            raise RuntimeError("GREETER_FAIL_INIT is set: the model cannot load")
        self.greeting = "hello"

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.greeting = str(config.get("greeting", "hello"))

    async def __call__(self, request: Any) -> dict[str, Any]:
        return {"greeting": self.greeting, "version": os.environ.get("GREETER_VERSION", "1"),
                "pid": os.getpid()}


app = Greeter.bind()
