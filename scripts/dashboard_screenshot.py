"""Regenerate docs/dashboard.png: a short pulse on a real instance, then a screenshot.

    python scripts/dashboard_screenshot.py [OUT.png]      (or: make dashboard-png)

Starts surge on free loopback ports with the dashboard on a free port, deploys an
autoscaling deployment (a 50 ms handler, 1-4 replicas, a small queue), drives it with
closed-loop clients: 2 for 10 s, 32 for 20 s (it scales up and sheds load with 503s),
2 for 15 s; then headless Chromium screenshots the page's last minute.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.dashboard_tools import Load, instance, screenshot  # noqa: E402

from surge import serve  # noqa: E402

PHASES = ((2, 10.0), (32, 20.0), (2, 15.0))  # (clients, seconds)


@serve.deployment(max_ongoing_requests=4, max_queued_requests=8, autoscaling_config={
    "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2,
    "upscale_delay_s": 0, "downscale_delay_s": 5})
class Model:
    async def __call__(self, request: Any) -> dict[str, str]:
        await asyncio.sleep(0.05)
        return {"label": "cat"}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png")
    with instance() as (url, dashboard):
        serve.run(Model.bind(), name="vision", route_prefix="/classify")
        print(f"dashboard {dashboard}/  (pulse: {PHASES})", flush=True)
        for clients, seconds in PHASES:
            with Load(f"{url}/classify", clients) as load:
                time.sleep(seconds)
            print(f"  {clients} clients for {seconds:g}s: {dict(load.statuses)}", flush=True)
        screenshot(f"{dashboard}/?window=60", out, width=1400, height=1000)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
