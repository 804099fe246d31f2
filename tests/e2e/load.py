"""A closed loop of GETs on a thread, every outcome counted: load during a change."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx


class Load:
    """`with Load(url) as load: ...`; then `load.outcomes` counts status codes (as text)
    and client-side errors (by exception name); `bodies` keeps the JSON of each 200."""

    def __init__(self, url: str, params: dict[str, str] | None = None,
                 keep_bodies: bool = False) -> None:
        self.url = url
        self.params = params
        self.keep_bodies = keep_bodies
        self.outcomes: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    response = client.get(self.url, params=self.params)
                    self.outcomes[str(response.status_code)] += 1
                    if self.keep_bodies and response.status_code == 200:
                        self.bodies.append(response.json())
                except httpx.HTTPError as exc:
                    self.outcomes[type(exc).__name__] += 1

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
