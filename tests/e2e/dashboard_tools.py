"""Tools for the dashboard and metrics tests: headless Chromium, a load thread, a scraper.

Chromium comes from the distribution's packages (scripts/ensure-chromium.sh installs it);
it runs with --virtual-time-budget so the page's once-a-second polling runs a few
rounds, then --dump-dom prints the DOM it rendered (or --screenshot writes a PNG).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from surge import serve
from tests.e2e.conftest import running_instance

BROWSER_TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _browser(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    binary = find_chromium()
    if binary is None:
        raise RuntimeError("no chromium: run scripts/ensure-chromium.sh")
    with tempfile.TemporaryDirectory(prefix="surge-chromium-") as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args, url],
            capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)


def dump_dom(url: str, budget_ms: int = 2500) -> str:
    """The page's DOM after `budget_ms` of (virtual) time."""
    done = _browser(url, f"--virtual-time-budget={budget_ms}", "--dump-dom")
    if done.returncode != 0 or "<html" not in done.stdout:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def screenshot(url: str, path: Path, width: int = 1400, height: int = 1100,
               budget_ms: int = 2500) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _browser(url, f"--virtual-time-budget={budget_ms}", f"--screenshot={path}",
                    f"--window-size={width},{height}", "--hide-scrollbars")
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    return path


class Load:
    """Closed-loop HTTP load on a thread: `concurrency` clients loop until stopped."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url, self.concurrency = url, concurrency
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            async def worker() -> None:
                while not self._stop.is_set():
                    try:
                        response = await client.get(self.url)
                        self.statuses[response.status_code] += 1
                    except httpx.HTTPError:
                        self.statuses[0] += 1
                        await asyncio.sleep(0.01)  # the load's pacing: back off after an error

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """/metrics as {sample name: [(labels, value)]}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(value for found, value in samples.get(name, [])
               if all(found.get(k) == v for k, v in labels.items()))


def at_replicas(app: str) -> int:
    """The requests of `app` at its replicas now, as /metrics has them from the routers'
    reports (every tick): the probe for "the call is at its replica"."""
    address = serve.status().dashboard_address
    assert address is not None, "this instance has no dashboard"
    return int(total(scrape(address), "serve_num_ongoing_requests_at_replicas",
                     application=app))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def instance(**options: Any) -> Iterator[tuple[str, str]]:
    """(http URL, dashboard URL) of an instance started with these serve.start options."""
    with running_instance({"dashboard_port": 0, **options}, proxy_workers=1) as running:
        yield running.url, serve.status().dashboard_address
