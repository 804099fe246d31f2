"""Ray Serve's REST API on the dashboard port, so Ray's `serve` CLI and KubeRay drive surge.

    GET    /api/version, /api/ray/version   Ray's version handshake (the CLI checks it)
    GET    /api/serve/applications/         the instance (controller/details.py);
                                            ?api_type=declarative|imperative: those only
    PUT    /api/serve/applications/         deploy a ServeDeploySchema config, declaratively
    DELETE /api/serve/applications/         shut the instance down (as Ray's serve shutdown)
    GET    /api/gcs_healthz, /api/local_raylet_healthz   the probes KubeRay's pods run

A PUT is `surge deploy`: applications changed in place or rolled, those an earlier
config deployed and this one lacks deleted, and a bad config changes nothing (400 with
the reason). Building applications imports the user's code, which the controller never
does: a short-lived process builds and deploys them over the control API, one PUT at a
time, the newest winning (controller/rest_builds.py). A build that outlives KubeRay's
2 s client timeout is answered 200 at once; its failure then makes the application
DEPLOY_FAILED, as Ray reports it.

Authentication: none on loopback (the default host); bound elsewhere, every
/api/serve/ request needs the token (Ray's RAY_AUTH_TOKEN when set, else the instance's
control token) as `Authorization: Bearer ...` (or KubeRay's `X-Ray-Authorization`): 401
without one, 403 with a wrong one. The builder always gets the control token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import msgspec

from surge.clock import Clock
from surge.controller.details import RAY_VERSION, instance_details
from surge.controller.rest_builds import Builds
from surge.controller.state import ControllerState
from surge.launch import ApplySpec

__all__ = ["RestApi"]

log = logging.getLogger("surge.rest")

APPLICATIONS = "/api/serve/applications/"
HEALTH = ("/api/gcs_healthz", "/api/local_raylet_healthz", "/api/healthz")
API_TYPES = ("imperative", "declarative")  # Ray's APIType values a caller may ask for

Answer = tuple[int, str, bytes]


class RestApi:
    def __init__(self, state: ControllerState, *, clock: Clock,
                 controller_pid: int, token: str | None, control_token: str | None,
                 require_token: bool, shutdown: Callable[[], None]) -> None:
        self.state = state
        self.clock = clock
        self.controller_pid = controller_pid
        self.token = token  # what clients must show
        self.control_token = control_token  # what the builder process connects with
        self.require_token = require_token and token is not None
        self.shutdown = shutdown
        self.builds = Builds()

    def __repr__(self) -> str:
        return f"<RestApi token={'required' if self.require_token else 'off'}>"

    def handles(self, path: str) -> bool:
        return path.startswith("/api/") and path != "/api/timeline"

    async def handle(self, method: str, path: str, headers: Mapping[str, str],
                     body: bytes, query: str = "") -> Answer:
        if path in ("/api/version", "/api/ray/version") and method == "GET":
            return _json(200, {"version": "4", "ray_version": RAY_VERSION,
                               "ray_commit": "surge", "session_name": "surge"})
        if path in HEALTH and method == "GET":
            return 200, "text/plain", b"success"
        if path.rstrip("/") + "/" != APPLICATIONS:
            return 404, "text/plain", f"no API at {path}".encode()
        refused = self._check(headers)
        if refused is not None:
            return refused
        if method == "GET":
            return self._get(query)
        if method == "PUT":
            return await self._put(body)
        if method == "DELETE":
            asyncio.get_running_loop().call_soon(self.shutdown)  # after the answer
            return 200, "text/plain", b""
        return 405, "text/plain", b"GET, PUT or DELETE"

    def _check(self, headers: Mapping[str, str]) -> Answer | None:
        if not self.require_token:
            return None
        assert self.token is not None
        offered = headers.get("authorization") or headers.get("x-ray-authorization") or ""
        if not offered.startswith("Bearer "):
            return 401, "text/plain", b"this API needs the instance's token: Authorization: Bearer"
        if not hmac.compare_digest(offered[7:].strip().encode(), self.token.encode()):
            return 403, "text/plain", b"the token was refused"
        return None

    def _get(self, query: str) -> Answer:
        """KubeRay asks for `?api_type=declarative`: the applications a config deployed,
        not those a script's serve.run did (Ray filters the same way)."""
        asked = (parse_qs(query).get("api_type") or [""])[0]
        if asked and asked.lower() not in API_TYPES:
            return 400, "text/plain", (f"Invalid 'api_type' value: '{asked}'. Must be one "
                                       f"of: {', '.join(API_TYPES)}").encode()
        return _json(200, instance_details(self.state, self.clock, self.controller_pid,
                                           source=asked.lower() or None))

    async def _put(self, body: bytes) -> Answer:
        try:
            config = json.loads(body or b"{}")
        except ValueError as exc:
            return 400, "text/plain", f"the body is not JSON: {exc}".encode()
        if not isinstance(config, dict):
            return 400, "text/plain", b"the body must be a ServeDeploySchema object"
        spec = ApplySpec(controller=self.state.address, token=self.control_token,
                         config=msgspec.json.encode(config).decode())
        outcome = await self.builds.submit(spec)
        if not outcome.ok:
            log.warning("PUT %s refused: %s", APPLICATIONS, outcome.reason)
            return 400, "text/plain", outcome.reason.encode()
        return 200, "text/plain", b""


def _json(status: int, data: Any) -> Answer:
    return status, "application/json", json.dumps(data).encode()
