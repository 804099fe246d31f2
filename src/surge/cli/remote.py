"""Which instance a command talks to, and how: `-a/--address`.

A `host:port` is a control address (as SURGE_ADDRESS): the command connects to the
instance there with the user's control token (same user, same machine). An `http://`
or `https://` URL is a dashboard, as Ray's CLI takes one (`serve status -a
http://localhost:8265`): the command speaks Ray's REST API to it (controller/rest.py),
with RAY_AUTH_TOKEN as its bearer token when set, so it reaches instances elsewhere.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from surge.errors import ControllerUnavailableError, RayServeException

__all__ = ["Dashboard", "details", "is_dashboard_url", "status_from_details"]

APPLICATIONS = "/api/serve/applications/"
REQUEST_TIMEOUT_S = 60.0  # a PUT answers within seconds (controller/rest_builds.py)


def is_dashboard_url(address: str | None) -> bool:
    return bool(address) and str(address).startswith(("http://", "https://"))


class Dashboard:
    """Ray's REST API of the instance whose dashboard is at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.token = os.environ.get("RAY_AUTH_TOKEN")

    def __repr__(self) -> str:
        return f"<Dashboard {self.url}>"

    def details(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self._request("GET", APPLICATIONS) or b"{}")
        return data

    def deploy(self, config: dict[str, Any]) -> None:
        self._request("PUT", APPLICATIONS, json.dumps(config).encode())

    def shutdown(self) -> None:
        self._request("DELETE", APPLICATIONS)

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                answer: bytes = response.read()
                return answer
        except urllib.error.HTTPError as exc:
            reason = exc.read().decode(errors="replace").strip() or exc.reason
            hint = (" (set RAY_AUTH_TOKEN to the instance's token)"
                    if exc.code in (401, 403) else "")
            raise RayServeException(f"{method} {self.url}{path} answered {exc.code}: "
                                    f"{reason}{hint}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = str(exc.reason if isinstance(exc, urllib.error.URLError) else exc)
            raise ControllerUnavailableError(f"no surge dashboard answers at {self.url}: "
                                             f"{reason}") from None


def details(address: str | None) -> dict[str, Any]:
    """The instance's `ServeInstanceDetails` (Ray's REST shape), by either route."""
    if is_dashboard_url(address):
        return Dashboard(str(address)).details()
    from surge.api.instance import connect_or_start

    result: dict[str, Any] = connect_or_start(start=False).call("details", timeout=10)
    return result


def status_from_details(data: dict[str, Any], url: str) -> dict[str, Any]:
    """What `surge status` prints, from the REST details (no rates: Ray has none)."""
    http = data.get("http_options") or {}
    applications = {}
    for name, app in (data.get("applications") or {}).items():
        deployments = {}
        for dname, dep in (app.get("deployments") or {}).items():
            states: dict[str, int] = {}
            for replica in dep.get("replicas") or ():
                states[replica["state"]] = states.get(replica["state"], 0) + 1
            deployments[dname] = {"status": dep["status"], "replica_states": states,
                                  "target_replicas": dep.get("target_num_replicas", 0),
                                  "message": dep.get("message", "")}
        applications[name] = {"status": app["status"], "message": app.get("message", ""),
                              "route_prefix": app.get("route_prefix"),
                              "deployments": deployments}
    return {"control_address": "-", "dashboard_address": url,
            "http_address": f"{http.get('host', '')}:{http.get('port', '')}" if http else "",
            "proxy_addresses": {}, "applications": applications}
