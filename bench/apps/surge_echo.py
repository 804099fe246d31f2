"""The echo app on surge: `python surge_echo.py PORT [MAX_ONGOING] [MAX_QUEUED]`."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from surge import serve


@serve.deployment
class Echo:
    async def __call__(self, request: Any) -> dict[str, str]:
        return {"echo": request.query_params.get("value", "")}


def main() -> None:
    port = int(sys.argv[1])
    options: dict[str, Any] = {}
    if len(sys.argv) > 2 and sys.argv[2] != "-":
        options["max_ongoing_requests"] = int(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] != "-":
        options["max_queued_requests"] = int(sys.argv[3])
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    serve.start(http_options={"port": port})
    serve.run(Echo.options(**options).bind(), name="echo", route_prefix="/echo")
    print(f"READY http://127.0.0.1:{port}/echo?value=x", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
