"""KubeRay 1.7's RayService controller as a Ray head sees it: the requests, the decisions.

Read (behaviour described, no code copied) at ray-project/kuberay tag v1.7.0, commit
59d663aeec13760646da3db9c1cf8cfe883e30b7, under ray-operator/controllers/ray/:

    rayservice_controller.go   Reconcile (the order below), reconcileServe,
                               getAndCheckServeStatus, checkIfNeedSubmitServeApplications,
                               updateServeDeployment, updateHeadPodServeLabel,
                               calculateConditions
    utils/dashboardclient/dashboard_httpclient.go   GetServeDetails, UpdateDeployments,
                               setAuthHeader
    utils/httpproxy_httpclient.go   CheckProxyActorHealth
    utils/types/serve_api_models.go   the fields of the answer it reads
    utils/util.go              GetRayDashboardClientFunc (2 s timeout, the token's secret)
    utils/constant.go, common/pod.go (initLivenessAndReadinessProbe)   paths and probes

One reconcile of an in-place RayService (one RayCluster, no pending one), in KubeRay's
order; every client has a 2 s timeout and any error ends the reconcile (KubeRay logs
it, requeues in 2 s and leaves the RayService's status as it was):

  1. GET http://<head pod>:8000/-/healthz: 200 labels the head pod ray.io/serve=true,
     anything else false (the label puts it in or out of the serve Service).
  2. GET <dashboard>/api/serve/applications/?api_type=declarative, with
     `x-ray-authorization: Bearer <token>` when the cluster has token auth: the
     applications' and deployments' status and message. isReady: at least one
     application, and every one RUNNING.
  3. PUT <dashboard>/api/serve/applications/ (Content-Type: application/json, the same
     auth header), serveConfigV2 turned from YAML into JSON, when nothing is cached for
     the cluster, or no application was found, or serveConfigV2 differs from the cache;
     a 2xx caches serveConfigV2, anything else is an error and the next reconcile
     PUTs again.
  4. Once isReady, the head and serve Services are created (pointing at this cluster)
     and stay. RayServiceReady is true while the serve Service has a ready endpoint:
     the head pod labelled serve=true and Ready (its readiness probe passes).

The pure functions below are those decisions, each naming the Go function it mirrors;
`RayServiceController` is the thin shell that makes the requests.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import yaml

__all__ = ["REQUEUE_S", "AppStatus", "Call", "RayServiceController", "Reconciled",
           "need_submit", "probe_passes", "rayservice_ready", "serve_config_json",
           "serve_status"]

CLIENT_TIMEOUT_S = 2.0  # utils.RayHTTPClientDirectTimeoutSeconds
REQUEUE_S = 2.0  # ServiceDefaultRequeueDuration: the next reconcile, after one that ended
DEFAULT_SERVE_APP_NAME = "default"  # utils.DefaultServeAppName, for an app named ""
DETAILS_PATH = "/api/serve/applications/?api_type=declarative"  # GetServeDetails
DEPLOY_PATH = "/api/serve/applications/"  # DeployPathV2
PROXY_HEALTH_PATH = "/-/healthz"  # utils.RayServeProxyHealthPath, on the serve port
GO_USER_AGENT = "Go-http-client/1.1"  # what Go's net/http sends when nobody sets one
# kubelet marks a pod unready after this many failed readiness probes in a row
# (utils.DefaultReadinessProbeFailureThreshold, which docs/kuberay.md's manifest keeps).
READINESS_FAILURE_THRESHOLD = 10


@dataclass(frozen=True)
class AppStatus:
    """rayv1.AppStatus: what KubeRay keeps of an application (status.applicationStatuses)."""

    status: str
    message: str
    deployments: Mapping[str, tuple[str, str]]  # name -> (status, message)


def _go_string(value: Any, where: str) -> str:
    """Go's json.Unmarshal into a string field: null leaves it empty, a non-string fails."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{where} is {value!r}: Go cannot unmarshal it into a string")
    return value


def serve_status(details: Mapping[str, Any]) -> tuple[bool, dict[str, AppStatus]]:
    """getAndCheckServeStatus: (isReady, the applications) from GET's ServeDetails body."""
    applications: dict[str, AppStatus] = {}
    for name, app in (details.get("applications") or {}).items():
        deployments = {
            dname: (_go_string(dep.get("status"), f"{dname}.status"),
                    _go_string(dep.get("message"), f"{dname}.message"))
            for dname, dep in (app.get("deployments") or {}).items()}
        applications[name or DEFAULT_SERVE_APP_NAME] = AppStatus(
            status=_go_string(app.get("status"), f"{name}.status"),
            message=_go_string(app.get("message"), f"{name}.message"),
            deployments=deployments)
    is_ready = bool(applications) and all(a.status == "RUNNING"
                                          for a in applications.values())
    return is_ready, applications


def need_submit(cached: str, serve_config_v2: str,
                applications: Mapping[str, AppStatus]) -> tuple[bool, str]:
    """checkIfNeedSubmitServeApplications: whether to PUT serveConfigV2, and why."""
    if not cached:
        return True, "Nothing has been cached for the cluster."
    if not applications:
        return True, "No Serve application found in the RayCluster."
    if cached != serve_config_v2:
        return True, "Current V2 Serve config doesn't match cached Serve config."
    return False, "Current V2 Serve config matches cached Serve config."


def serve_config_json(serve_config_v2: str) -> bytes:
    """updateServeDeployment's body: serveConfigV2's YAML as a map, marshalled to JSON
    (Go's encoder sorts map keys and adds no spaces)."""
    return json.dumps(yaml.safe_load(serve_config_v2), sort_keys=True,
                      separators=(",", ":")).encode()


def probe_passes(status: int | None, body: bytes, *, exec_probe: bool) -> bool:
    """A pod probe's verdict. The httpGet probe (Ray >= 2.53): 200-399. The exec probe
    (`wget -q -O- URL | grep success`, older Ray): wget fails on a non-2xx, then the
    body must say "success"."""
    if status is None:
        return False
    if exec_probe:
        return 200 <= status < 300 and b"success" in body
    return 200 <= status < 400


def rayservice_ready(services_exist: bool, head_serving: bool, head_pod_ready: bool) -> bool:
    """calculateConditions: RayServiceReady is "the serve Service has a ready endpoint";
    with the head as the only serving pod, that is the Service existing, the head's
    ray.io/serve label true and the pod Ready."""
    return services_exist and head_serving and head_pod_ready


@dataclass(frozen=True)
class Call:
    """One request KubeRay made and what came back (status None: no answer in time)."""

    method: str
    target: str  # path and query
    headers: Mapping[str, str]
    status: int | None
    body: bytes = b""

    def __repr__(self) -> str:
        return f"<Call {self.method} {self.target} -> {self.status}>"


@dataclass(frozen=True)
class Reconciled:
    """What one reconcile did and concluded."""

    calls: tuple[Call, ...]
    error: str | None
    head_serving: bool
    is_ready: bool = False
    applications: Mapping[str, AppStatus] = field(default_factory=dict)
    submit_reason: str = ""
    ready: bool = False  # the RayServiceReady condition afterwards

    @property
    def put(self) -> Call | None:
        return next((c for c in self.calls if c.method == "PUT"), None)

    def app_status(self, name: str) -> str | None:
        app = self.applications.get(name)
        return app.status if app else None


class RayServiceController:
    """The RayService controller for one RayCluster whose head is `dashboard_url` (the
    head Service's `dashboard` port) and `serve_url` (the head pod's `serve` port)."""

    def __init__(self, dashboard_url: str, serve_url: str, *, token: str | None = None,
                 readiness_url: str | None = None,
                 timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.dashboard_url = dashboard_url.rstrip("/")
        self.serve_url = serve_url.rstrip("/")
        self.token = token
        self.readiness_url = readiness_url or f"{self.dashboard_url}/api/healthz"
        self.http = httpx.Client(timeout=timeout_s, headers={"User-Agent": GO_USER_AGENT})
        self.cached = ""  # r.ServeConfigs for this cluster
        self.services_exist = False
        self.head_serving = False
        self.head_pod_ready = False  # a pod starts unready, until a probe passes
        self.probe_failures = 0
        self.ready = False
        self.history: list[Reconciled] = []

    def __repr__(self) -> str:
        return (f"<RayServiceController cached={bool(self.cached)} "
                f"services={self.services_exist} ready={self.ready}>")

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, url: str, target: str, headers: dict[str, str],
                 body: bytes | None = None) -> Call:
        try:
            response = self.http.request(method, url + target, headers=headers,
                                         content=body)
        except httpx.HTTPError as exc:
            return Call(method, target, headers, None, repr(exc).encode())
        return Call(method, target, headers, response.status_code, response.content)

    def _auth(self) -> dict[str, str]:
        return {"x-ray-authorization": f"Bearer {self.token}"} if self.token else {}

    def kubelet_readiness(self) -> bool:
        """The head container's readiness probe, as the documented manifest sets it, and
        kubelet's verdict: Ready after a pass, unready after the threshold of failures."""
        try:
            response = self.http.get(self.readiness_url)
            passed = probe_passes(response.status_code, response.content, exec_probe=False)
        except httpx.HTTPError:
            passed = False
        self.probe_failures = 0 if passed else self.probe_failures + 1
        if passed:
            self.head_pod_ready = True
        elif self.probe_failures >= READINESS_FAILURE_THRESHOLD:
            self.head_pod_ready = False
        return self.head_pod_ready

    def reconcile(self, serve_config_v2: str) -> Reconciled:
        calls: list[Call] = []
        health = self._request("GET", self.serve_url, PROXY_HEALTH_PATH, {})
        calls.append(health)
        self.head_serving = health.status == 200  # updateHeadPodServeLabel
        details = self._request("GET", self.dashboard_url, DETAILS_PATH, self._auth())
        calls.append(details)
        if details.status is None or not 200 <= details.status < 300:
            return self._done(Reconciled(tuple(calls), f"GetServeDetails fail: "
                                         f"{details.status} {details.body[:300]!r}",
                                         self.head_serving))
        is_ready, applications = serve_status(json.loads(details.body))
        submit, reason = need_submit(self.cached, serve_config_v2, applications)
        outcome = Reconciled(tuple(calls), None, self.head_serving, is_ready, applications,
                             reason if submit else "")
        if submit:
            headers = {"Content-Type": "application/json", **self._auth()}
            put = self._request("PUT", self.dashboard_url, DEPLOY_PATH, headers,
                                serve_config_json(serve_config_v2))
            calls.append(put)
            outcome = dataclasses.replace(outcome, calls=tuple(calls))
            if put.status is None or not 200 <= put.status < 300:
                return self._done(dataclasses.replace(
                    outcome, error=f"UpdateDeployments fail: {put.status} "
                                   f"{put.body[:2000].decode(errors='replace')}"))
            self.cached = serve_config_v2
        if is_ready:
            self.services_exist = True  # reconcileServicesToReadyCluster
        self.ready = rayservice_ready(self.services_exist, self.head_serving,
                                      self.kubelet_readiness())
        return self._done(dataclasses.replace(outcome, ready=self.ready))

    def _done(self, outcome: Reconciled) -> Reconciled:
        if outcome.error is not None:  # the status is not recalculated: it stays
            outcome = dataclasses.replace(outcome, ready=self.ready)
        self.history.append(outcome)
        return outcome
