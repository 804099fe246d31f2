"""The same echo app on Ray Serve 2.60 (run with the Ray virtualenv's Python).

`python ray_echo.py PORT MAX_ONGOING|-`; with RAY_SERVE_THROUGHPUT_OPTIMIZED=1 the URL
printed is the replica's direct-ingress port.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from typing import Any

from ray import serve
from until_sigterm import serve_until_sigterm


@serve.deployment
class Echo:
    async def __call__(self, request: Any) -> dict[str, str]:
        return {"echo": request.query_params.get("value", "")}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except Exception:
        return False


def main() -> None:
    port = int(sys.argv[1])
    options: dict[str, Any] = {}
    if len(sys.argv) > 2 and sys.argv[2] != "-":
        options["max_ongoing_requests"] = int(sys.argv[2])
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Echo.options(**options).bind(), name="echo", route_prefix="/echo")
    url = f"http://127.0.0.1:{port}/echo?value=x"
    if os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1":
        for candidate in range(30000, 30020):
            direct = f"http://127.0.0.1:{candidate}/echo?value=x"
            if _answers(direct):
                url = direct
                break
        else:
            raise SystemExit("no direct-ingress port answered")
    print(f"READY {url}", flush=True)

    serve_until_sigterm(serve.shutdown)


if __name__ == "__main__":
    main()
