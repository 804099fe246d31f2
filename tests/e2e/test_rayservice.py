"""KubeRay 1.7's RayService controller driving a detached surge instance, request for request.

KubeRay read at ray-project/kuberay tag v1.7.0 (commit 59d663ae):
ray-operator/controllers/ray/rayservice_controller.go (Reconcile, reconcileServe,
getAndCheckServeStatus, checkIfNeedSubmitServeApplications, calculateConditions) and
ray-operator/controllers/ray/utils/dashboardclient/dashboard_httpclient.go (GetServeDetails,
UpdateDeployments); tests/e2e/kuberay.py names the rest and mirrors the decisions. There is
no Kubernetes here: kuberay.py plays the operator, this machine plays the head pod.

The head is what docs/kuberay.md's RayService manifest starts: `surge start` with the REST
API on the dashboard port KubeRay talks to, and token auth as KubeRay's
`authOptions: {mode: token}` sets it up (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN). Then,
reconcile by reconcile: a first serveConfigV2 until KubeRay calls the RayService ready; a
user_config change (in place); an env change that rolls the replicas under steady load
through the proxy (no request fails); configs surge refuses (400: KubeRay retries every
reconcile and nothing changes); an application whose replicas cannot start
(DEPLOY_FAILED); the pods' probes throughout; and a shutdown that leaves no process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.kuberay import (
    DETAILS_PATH,
    PROXY_HEALTH_PATH,
    REQUEUE_S,
    RayServiceController,
    Reconciled,
    probe_passes,
    serve_config_json,
)
from tests.e2e.load import Load
from tests.e2e.procs import alive, descendants, title
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
# The first replicas of an instance can take a while on a busy machine; KubeRay itself
# would wait as long as it takes (or until its initializing timeout, off by default).
FIRST_DEPLOY_S = 180.0
CHANGE_S = 90.0


@dataclass
class Head:
    """The head pod: its dashboard (KubeRay's `dashboard` port), serve port and token."""

    dashboard_url: str
    serve_url: str
    token: str
    daemon_pid: int
    env: dict[str, str]

    def surge(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "surge.cli.main", *args], env=self.env,
                              cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture
def head() -> Iterator[Head]:
    token = secrets.token_hex(16)
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=token)
    http_port, dashboard_port = free_port(), free_port()
    started = subprocess.run(
        [sys.executable, "-m", "surge.cli.main", "start", "--http-port", str(http_port),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    found = re.search(r"daemon pid (\d+)", started.stdout)
    assert found, started.stdout
    instance = Head(f"http://127.0.0.1:{dashboard_port}", f"http://127.0.0.1:{http_port}",
                    token, int(found.group(1)), env)
    try:
        yield instance
    finally:
        if alive(instance.daemon_pid):  # the test failed before its own shutdown
            instance.surge("shutdown", "-y")


def serve_config_v2(*, greeting: str = "hello", version: str = "1",
                    language: str = "french", extra: str = "") -> str:
    """A RayService's serveConfigV2, as a user writes it in the manifest (Ray's schema)."""
    return f"""\
applications:
  - name: greeter
    route_prefix: /greet
    import_path: tests.config.apps.greeter:app
    deployments:
      - name: Greeter
        num_replicas: 2
        user_config:
          greeting: {greeting}
        ray_actor_options:
          runtime_env:
            env_vars:
              GREETER_VERSION: "{version}"
  - name: text_ml
    route_prefix: /text
    import_path: tests.config.apps.text_ml:app
    deployments:
      - name: Translator
        user_config:
          language: {language}
      - name: Summarizer
        user_config:
          min_length: 3
{extra}"""


BROKEN_APP = """\
  - name: broken
    route_prefix: /broken
    import_path: tests.config.apps.greeter:app
    deployments:
      - name: Greeter
        ray_actor_options:
          runtime_env:
            env_vars:
              GREETER_FAIL_INIT: "1"
"""


def reconcile_until(kuberay: RayServiceController, spec: str,
                    holds: Callable[[Reconciled], bool], timeout_s: float,
                    what: str) -> Reconciled:
    """Reconcile at KubeRay's pace until `holds`. The pace matters: surge answers a PUT
    only once its builder is done, so PUTs sent faster than that would queue up."""
    def attempt() -> Reconciled | None:
        outcome = kuberay.reconcile(spec)
        return outcome if holds(outcome) else None
    try:
        return eventually(attempt, timeout_s, interval_s=REQUEUE_S, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last reconcile: {kuberay.history[-1]!r}") from None


def details(head: Head, **params: str) -> dict[str, Any]:
    response = httpx.get(f"{head.dashboard_url}/api/serve/applications/", params=params,
                         headers={"Authorization": f"Bearer {head.token}"}, timeout=30)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def replica_pids(head: Head, app: str, deployment: str) -> set[int]:
    replicas = details(head)["applications"][app]["deployments"][deployment]["replicas"]
    return {r["pid"] for r in replicas if r["state"] == "RUNNING"}


def greet(head: Head) -> dict[str, Any]:
    response = httpx.get(f"{head.serve_url}/greet", timeout=30)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def statuses(history: list[Reconciled], app: str) -> list[str]:
    """The application's statuses KubeRay read, in order, repeats dropped."""
    seen: list[str] = []
    for outcome in history:
        status = outcome.app_status(app)
        if status is not None and (not seen or seen[-1] != status):
            seen.append(status)
    return seen


def check_probes(head: Head, routed: bool = True) -> None:
    """What the head and worker pods' probes ask; kubelet sends no token. The proxy's
    probe passes once an application has a route (before that 503, as Ray's proxy)."""
    for path in ("/api/healthz", "/api/local_raylet_healthz", "/api/gcs_healthz"):
        response = httpx.get(head.dashboard_url + path, timeout=10)
        assert probe_passes(response.status_code, response.content, exec_probe=True), path
    response = httpx.get(head.serve_url + PROXY_HEALTH_PATH, timeout=10)
    assert probe_passes(response.status_code, response.content, exec_probe=True) is routed


def first_deploy(head: Head, kuberay: RayServiceController, spec: str) -> None:
    first = kuberay.reconcile(spec)
    assert [(c.method, c.target) for c in first.calls] == [
        ("GET", PROXY_HEALTH_PATH), ("GET", DETAILS_PATH),
        ("PUT", "/api/serve/applications/")]
    assert first.applications == {} and not first.is_ready
    assert first.submit_reason == "Nothing has been cached for the cluster."
    put = first.put
    assert put is not None
    assert put.headers == {"Content-Type": "application/json",
                           "x-ray-authorization": f"Bearer {head.token}"}
    ready = reconcile_until(kuberay, spec, lambda r: r.ready, FIRST_DEPLOY_S,
                            "KubeRay to call the RayService ready")
    assert ready.is_ready and kuberay.cached == spec
    assert set(ready.applications) == {"greeter", "text_ml"}
    assert ready.applications["greeter"].deployments == {"Greeter": ("HEALTHY", "")}
    # Steady state: the config matches the cache, so no PUT, only the two GETs.
    steady = reconcile_until(kuberay, spec, lambda r: r.error is None and r.ready, 30,
                             "a clean reconcile")
    assert [c.method for c in steady.calls] == ["GET", "GET"]
    assert steady.submit_reason == ""
    deployed = details(head, api_type="declarative")["applications"]["greeter"]
    assert deployed["deployed_app_config"] == json.loads(serve_config_json(spec))[
        "applications"][0]
    assert greet(head)["greeting"] == "hello"


def update_in_place(head: Head, kuberay: RayServiceController, spec: str) -> None:
    before = replica_pids(head, "greeter", "Greeter")
    start = len(kuberay.history)
    reconcile_until(kuberay, spec, lambda r: r.put is not None and r.put.status == 200, 30,
                    "the user_config PUT")
    reconcile_until(kuberay, spec, lambda r: r.ready and r.is_ready, CHANGE_S,
                    "the user_config update to settle")
    assert set(statuses(kuberay.history[start:], "greeter")) <= {"RUNNING", "DEPLOYING"}
    # surge reports RUNNING while the new user_config is on its way to the replicas
    # (Ray says UPDATING until they have it): wait for the answer, not the status.
    eventually(lambda: greet(head)["greeting"] == "howdy", 30, what="the new greeting")
    assert replica_pids(head, "greeter", "Greeter") == before  # reconfigured, not replaced


def rolling_update_under_load(head: Head, kuberay: RayServiceController,
                              spec: str) -> Load:
    old = replica_pids(head, "greeter", "Greeter")
    start = len(kuberay.history)
    with Load(f"{head.serve_url}/greet", keep_bodies=True) as load:
        eventually(lambda: load.outcomes["200"] > 20, 30, what="load flowing before the PUT")
        reconcile_until(kuberay, spec, lambda r: r.put is not None and r.put.status == 200,
                        30, "the rolling update's PUT")

        def rolled(outcome: Reconciled) -> bool:
            pids = replica_pids(head, "greeter", "Greeter")
            return outcome.ready and outcome.is_ready and len(pids) == 2 and not pids & old
        reconcile_until(kuberay, spec, rolled, CHANGE_S, "new replicas to replace the old")
        served = load.outcomes["200"]
        eventually(lambda: load.outcomes["200"] > served + 20, 30,
                   what="load served by the new replicas")
    assert set(load.outcomes) == {"200"}, load.outcomes  # not one request failed
    assert {body["version"] for body in load.bodies} == {"1", "2"}
    assert greet(head)["version"] == "2"
    seen = statuses(kuberay.history[start:], "greeter")
    assert set(seen) <= {"RUNNING", "DEPLOYING"} and seen[-1] == "RUNNING", seen
    print(f"\nrolling update under load: {dict(load.outcomes)}; KubeRay read {seen}")
    return load


def refused_update(head: Head, kuberay: RayServiceController, good: str, bad: str,
                   reason: str) -> None:
    """A config surge refuses: 400 with the reason, KubeRay keeps its cache and PUTs
    again on the next reconcile, and the applications serve on, unchanged."""
    was_deployed = details(head)["applications"]["greeter"]["deployed_app_config"]
    for _ in range(2):  # KubeRay retries on every reconcile while the spec stays bad
        refused = reconcile_until(kuberay, bad,
                                  lambda r: r.put is not None and r.put.status == 400, 30,
                                  "the bad config's 400")
        assert refused.error is not None and reason in refused.error, refused.error
        assert kuberay.cached == good
        assert refused.ready and refused.is_ready  # RayServiceReady is untouched
    assert details(head)["applications"]["greeter"]["deployed_app_config"] == was_deployed
    assert greet(head)["version"] == "2"
    # Back to the good spec: it matches the cache, so KubeRay sends nothing.
    back = reconcile_until(kuberay, good, lambda r: r.error is None and r.ready, 30,
                           "a clean reconcile")
    assert back.put is None


def failed_build(head: Head, kuberay: RayServiceController, good: str, bad: str,
                 reason: str) -> None:
    """A config whose application does not import. Within the PUT's answer budget it is a
    400 (as `refused_update`); a build that outlives it (a loaded machine) is a 200 and
    then DEPLOY_FAILED with the reason, as Ray reports it. Either way the old version
    serves on, and the good spec afterwards makes it RUNNING again."""
    def outcome(r: Reconciled) -> bool:
        if r.put is not None and r.put.status == 400:
            return True
        app = r.applications.get("greeter")
        return app is not None and app.status == "DEPLOY_FAILED" and reason in app.message

    failed = reconcile_until(kuberay, bad, outcome, 60, "the bad import's 400 or DEPLOY_FAILED")
    if failed.put is not None and failed.put.status == 400:
        assert failed.error is not None and reason in failed.error, failed.error
        assert kuberay.cached == good
    else:
        assert kuberay.cached == bad  # accepted: KubeRay reads the failure in the status
    assert greet(head)["version"] == "2"
    back = reconcile_until(
        kuberay, good, lambda r: r.error is None and r.ready
        and r.app_status("greeter") == "RUNNING", 60, "the good spec running again")
    assert greet(head)["version"] == "2"
    assert back.error is None


def app_that_fails_to_start(head: Head, kuberay: RayServiceController, good: str) -> None:
    with_broken = serve_config_v2(greeting="howdy", version="2", language="german",
                                  extra=BROKEN_APP)
    failed = reconcile_until(
        kuberay, with_broken, lambda r: r.app_status("broken") == "DEPLOY_FAILED" and r.ready,
        CHANGE_S, "the broken application to be DEPLOY_FAILED")
    broken = failed.applications["broken"]
    assert "GREETER_FAIL_INIT is set" in broken.message + broken.deployments["Greeter"][1]
    assert broken.deployments["Greeter"][0] == "DEPLOY_FAILED"
    # KubeRay: not all applications RUNNING, so this cluster would not be switched to;
    # but the serve Service already points here, so the RayService stays ready.
    assert not failed.is_ready
    assert failed.app_status("greeter") == "RUNNING"
    assert greet(head)["version"] == "2"
    # Dropping it from serveConfigV2 deletes it.
    reconcile_until(kuberay, good, lambda r: r.is_ready and set(r.applications) == {
        "greeter", "text_ml"}, CHANGE_S, "the broken application to be deleted")


def declarative_only(head: Head, kuberay: RayServiceController, spec: str) -> None:
    """KubeRay asks for declarative applications: a script's serve.run is not among them."""
    script = ("from surge import serve\nfrom tests.config.apps.greeter import Greeter\n"
              "serve.run(Greeter.options(name='ByHand').bind(), name='by_hand', "
              "route_prefix='/by-hand')\n")
    ran = subprocess.run([sys.executable, "-c", script], env=head.env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    everything = details(head)["applications"]
    assert everything["by_hand"]["source"] == "imperative"
    assert "by_hand" not in details(head, api_type="declarative")["applications"]
    seen = reconcile_until(kuberay, spec, lambda r: r.error is None, 30, "a clean reconcile")
    assert "by_hand" not in seen.applications and seen.put is None and seen.is_ready
    bogus = httpx.get(f"{head.dashboard_url}/api/serve/applications/?api_type=bogus",
                      headers={"Authorization": f"Bearer {head.token}"}, timeout=30)
    assert bogus.status_code == 400 and "Invalid 'api_type' value" in bogus.text


def shutdown_leaves_nothing(head: Head) -> None:
    started = [head.daemon_pid, *descendants(head.daemon_pid)]
    titles = {title(pid) for pid in started}
    assert {"surge:daemon", "surge:controller", "surge:proxy",
            "surge:replica:greeter:Greeter"} <= titles, titles
    stopped = head.surge("shutdown", "-y")
    assert stopped.returncode == 0, stopped.stderr
    eventually(lambda: not [pid for pid in started if alive(pid)], 60,
               what="every process the instance started to be gone")


def test_kuberay_drives_a_rayservice_through_deploys_updates_and_failures(
        head: Head) -> None:
    check_probes(head, routed=False)  # no application yet
    # Without the token the dashboard refuses KubeRay's client (a misconfigured secret).
    assert httpx.get(head.dashboard_url + DETAILS_PATH, timeout=10).status_code == 401
    kuberay = RayServiceController(head.dashboard_url, head.serve_url, token=head.token)
    try:
        v1 = serve_config_v2()
        began = time.monotonic()
        first_deploy(head, kuberay, v1)
        took_s = time.monotonic() - began
        check_probes(head)
        update_in_place(head, kuberay, serve_config_v2(greeting="howdy", language="german"))
        v2 = serve_config_v2(greeting="howdy", version="2", language="german")
        rolling_update_under_load(head, kuberay, v2)
        refused_update(head, kuberay, v2, v2.replace("num_replicas: 2",
                                                     "num_replicas: 2\n        "
                                                     "max_ongoing_requests: 0"),
                       "max_ongoing_requests")
        failed_build(head, kuberay, v2, v2.replace("greeter:app", "greeter:no_such_app"),
                     "no_such_app")
        app_that_fails_to_start(head, kuberay, v2)
        declarative_only(head, kuberay, v2)
        check_probes(head)
        errors = Counter(f"{r.calls[-1].method} -> {r.calls[-1].status or 'no answer'}"
                         for r in kuberay.history if r.error)
        print(f"{len(kuberay.history)} reconciles; the first deploy took {took_s:.1f}s; "
              f"errors (KubeRay retries them): {dict(errors)}")
    finally:
        kuberay.close()
    shutdown_leaves_nothing(head)
