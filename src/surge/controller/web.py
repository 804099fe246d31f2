"""The controller's small web server: /metrics, the dashboard, its JSON, Ray's REST API.

    GET /                 the live dashboard page (assets in controller/dashboard/)
    GET /static/NAME      its script and style sheet
    GET /metrics          Prometheus text of the aggregated metrics (controller/metrics.py)
    GET /api/timeline     JSON: status, timeline points (?since=UNIX_TIME: newer only),
                          autoscaling decisions
    GET /-/healthz        "success"
    /api/...              Ray Serve's REST API (controller/rest.py)

One request per connection (`Connection: close`), read with size and time limits; the
page polls, Prometheus scrapes every few seconds, Ray's CLI makes a request or two:
nothing here needs keep-alive. It also runs the observer's once-a-second sampling. It
listens on loopback by default; there the pages and the REST API need no credentials
(bound elsewhere, the REST API requires the instance's token, and the pages and
/metrics have none: keep them behind a proxy that has).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from surge.controller.observer import SAMPLE_INTERVAL_S, Observer
from surge.controller.rest import RestApi
from surge.observability.config import DashboardOptions

__all__ = ["DashboardServer", "start_dashboard"]

log = logging.getLogger("surge.dashboard")

# A request line and headers larger than this, or slower than this, are dropped.
MAX_REQUEST_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 10.0
# A REST body (a ServeDeploySchema config) is a few KiB; this is plenty.
MAX_BODY_BYTES = 4 * 1024 * 1024
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}


def asset(name: str) -> bytes:
    return resources.files("surge.controller").joinpath("dashboard", name).read_bytes()


class DashboardServer:
    def __init__(self, observer: Observer, rest: RestApi | None = None) -> None:
        self.observer = observer
        self.rest = rest
        self.server: asyncio.Server | None = None
        self.url = ""
        self._sampler: asyncio.Task[None] | None = None
        self._files = {name: asset(name) for name in ("index.html", *ASSETS)}

    def __repr__(self) -> str:
        return f"<DashboardServer {self.url or 'not listening'}>"

    async def start(self, options: DashboardOptions) -> str:
        """Listen (a busy default port falls back to a free one, with a warning; a port
        asked for explicitly does not); return the URL."""
        try:
            self.server = await asyncio.start_server(self._serve, options.host, options.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or options.port == 0 or options.required:
                raise
            self.server = await asyncio.start_server(self._serve, options.host, 0)
            log.warning("dashboard port %d is in use; serving the dashboard and /metrics on "
                        "port %d instead (set dashboard_port to choose)", options.port,
                        self.server.sockets[0].getsockname()[1])
        port = self.server.sockets[0].getsockname()[1]
        host = options.host if ":" not in options.host else f"[{options.host}]"
        self.url = self.observer.url = f"http://{host}:{port}"
        self._sampler = asyncio.get_running_loop().create_task(self._sample())
        log.info("dashboard at %s/ (metrics at %s/metrics)", self.url, self.url)
        return self.url

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            try:
                self.observer.sample()
            except Exception:
                log.exception("dashboard sampling failed")

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.server is not None:
            self.server.close()

    # -- HTTP ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            status, content_type, body = await self._answer(reader, head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            writer.close()
            return
        except Exception:
            log.exception("dashboard request failed")
            status, content_type, body = 500, "text/plain", b"internal error"
        reason = _REASONS.get(status, "Error")
        writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
                     f"content-length: {len(body)}\r\ncache-control: no-store\r\n"
                     "connection: close\r\n\r\n".encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def _answer(self, reader: asyncio.StreamReader,
                      head: bytes) -> tuple[int, str, bytes]:
        if len(head) > MAX_REQUEST_BYTES:
            return 400, "text/plain", b"request too large"
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3:
            return 400, "text/plain", b"malformed request line"
        method, target = parts[0], urlsplit(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if self.rest is not None and self.rest.handles(target.path):
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                return 413, "text/plain", b"the body is too large (or its length unreadable)"
            body = await asyncio.wait_for(reader.readexactly(int(length)), REQUEST_TIMEOUT_S)
            return await self.rest.handle(method, target.path, headers, body, target.query)
        if method != "GET":
            return 405, "text/plain", b"only GET"
        return self.respond_get(target.path, target.query)

    def respond_get(self, path: str, query: str) -> tuple[int, str, bytes]:
        if path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", self._files["index.html"]
        if path.startswith("/static/") and path[8:] in ASSETS:
            return 200, ASSETS[path[8:]], self._files[path[8:]]
        if path == "/metrics":
            # prometheus_client with it: ~50 ms of the controller's start otherwise, paid
            # by the first scrape instead.
            from surge.controller.metrics import CONTENT_TYPE, render

            return 200, CONTENT_TYPE, render(self.observer.snapshot())
        if path == "/api/timeline":
            return 200, "application/json", self._timeline(query)
        if path == "/-/healthz":
            return 200, "text/plain", b"success"
        return 404, "text/plain", f"no page at {path}; try / or /metrics".encode()

    def _timeline(self, query: str) -> bytes:
        since: float | None = None
        values = parse_qs(query).get("since")
        if values:
            with contextlib.suppress(ValueError):
                since = float(values[0])
        data: dict[str, Any] = self.observer.timeline_since(since)
        return json.dumps(data, separators=(",", ":")).encode()


async def start_dashboard(observer: Observer, options: DashboardOptions,
                          rest: RestApi | None = None) -> DashboardServer | None:
    """Serve the dashboard of `observer` and the REST API (None when disabled or the
    address is bad)."""
    if not options.enabled:
        return None
    try:
        server = DashboardServer(observer, rest)
        await server.start(options)
    except OSError as exc:  # unless asked for, not the controller's end: it serves on
        if options.required:
            raise
        log.warning("cannot serve the dashboard on %s:%d: %s; metrics and the dashboard are "
                    "off", options.host, options.port, exc.strerror or exc)
        return None
    return server
