"""A deployment whose replicas take SLOW_DELETE_S seconds to go (their `__del__` waits),
so its application stays DELETING that long, as Ray's test_config_files/delete_blocked."""

from __future__ import annotations

import os
import time

from surge import serve


@serve.deployment
class SlowToGo:
    def __call__(self, request: object) -> str:
        return "going slowly"

    def __del__(self) -> None:
        time.sleep(float(os.environ.get("SLOW_DELETE_S", "0")))


app = SlowToGo.bind()
