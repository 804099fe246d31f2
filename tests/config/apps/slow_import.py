"""An application whose module takes SLOW_IMPORT_S seconds to import (a framework, a
model's code), and raises when SLOW_IMPORT_FAIL is set: for REST builds that outlive
the PUT's answer (tests/e2e/test_rest_api.py). Both come from the app's runtime_env."""

from __future__ import annotations

import os
import time
from typing import Any

from surge import serve

time.sleep(float(os.environ.get("SLOW_IMPORT_S", "0")))
if os.environ.get("SLOW_IMPORT_FAIL"):
    raise RuntimeError("the feature store is unreachable from the build")


@serve.deployment
def slow(request: Any) -> str:
    return "slow but here"


app = slow.bind()
