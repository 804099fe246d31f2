"""Ray's REST API on surge, where it must behave as Ray's does beyond the happy path.

A build that outlives the PUT's answer (KubeRay gives up after 2 s) is answered 200 and
its failure reported as Ray reports it, DEPLOY_FAILED with the reason; a fast failure is
a 400 that changes nothing; a PUT deletes only what configs deployed, never what a
script's serve.run did; the builder never sees Ray's token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

SLOW = "tests.config.apps.slow_import:app"


@pytest.fixture(scope="module")
def instance() -> Iterator[tuple[Running, str]]:
    port = free_port()
    with running_instance({"dashboard_port": port}) as running:
        yield running, f"http://127.0.0.1:{port}/api/serve/applications/"


def _app(name: str, prefix: str, env: dict[str, str] | None = None,
         import_path: str = SLOW) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "route_prefix": prefix, "import_path": import_path}
    if env:
        entry["runtime_env"] = {"env_vars": env}
    return entry


def _status(url: str, name: str) -> tuple[str, str]:
    app = httpx.get(url, timeout=10).json()["applications"].get(name)
    return (app["status"], app["message"]) if app else ("", "")


@serve.deployment
def scripted(request: Any) -> str:
    return "from a script"


def test_a_slow_build_is_answered_at_once_and_its_failure_reported(  # type: ignore[no-untyped-def]
        instance) -> None:
    running, url = instance
    serve.run(scripted.bind(), name="script", route_prefix="/script")

    put = httpx.put(url, json={"applications": [_app("slow", "/slow", {
        "SLOW_IMPORT_S": "6", "SLOW_IMPORT_FAIL": "1"})]}, timeout=30)
    assert put.status_code == 200, put.text
    assert _status(url, "slow")[0] == ""  # answered while the build was still importing
    eventually(lambda: _status(url, "slow")[0] == "DEPLOY_FAILED", 60,
               what="the slow, failing build reported")
    assert "the feature store is unreachable" in _status(url, "slow")[1]
    config = httpx.get(url, timeout=10).json()["applications"]["slow"]["deployed_app_config"]
    assert config["import_path"] == SLOW

    # The next config fixes it; the script's application was never the config's to delete.
    put = httpx.put(url, json={"applications": [_app("slow", "/slow",
                                                     {"SLOW_IMPORT_S": "0"})]}, timeout=30)
    assert put.status_code == 200, put.text
    eventually(lambda: _status(url, "slow")[0] == "RUNNING", 60, what="the fixed build")
    assert httpx.get(f"{running.url}/slow", timeout=10).text == "slow but here"
    assert httpx.get(f"{running.url}/script", timeout=10).text == "from a script"

    # A config without "slow" deletes it (a config deployed it), and only it.
    put = httpx.put(url, json={"applications": []}, timeout=30)
    assert put.status_code == 200, put.text
    eventually(lambda: _status(url, "slow")[0] == "", 60, what="slow deleted")
    assert httpx.get(f"{running.url}/script", timeout=10).text == "from a script"
    serve.delete("script")


def test_a_fast_failure_is_a_400_that_changes_nothing(instance) -> None:  # type: ignore[no-untyped-def]
    _, url = instance
    good = {"applications": [_app("fast", "/fast")]}
    assert httpx.put(url, json=good, timeout=30).status_code == 200
    eventually(lambda: _status(url, "fast")[0] == "RUNNING", 60, what="fast running")
    bad = {"applications": [_app("fast", "/fast", import_path="tests.config.apps.nope:app")]}
    refused = httpx.put(url, json=bad, timeout=30)
    assert refused.status_code == 400
    assert "tests.config.apps.nope" in refused.text
    assert _status(url, "fast")[0] == "RUNNING"
    schema = httpx.put(url, json={"applications": [{"name": "x"}]}, timeout=30)
    assert schema.status_code == 400 and "import_path" in schema.text
    assert httpx.put(url, json={"applications": []}, timeout=30).status_code == 200


def test_the_newest_config_wins_over_waiting_ones(instance) -> None:  # type: ignore[no-untyped-def]
    _, url = instance

    def config(which: str, seconds: str) -> dict[str, Any]:
        return {"applications": [_app("latest", "/latest", {"SLOW_IMPORT_S": seconds,
                                                            "WHICH": which})]}

    # "one" builds for a while; "two" and "three" arrive meanwhile and wait: when "one"
    # is done, "two" is dropped (a newer config exists) and "three" runs.
    assert httpx.put(url, json=config("one", "4"), timeout=30).status_code == 200
    assert httpx.put(url, json=config("two", "0"), timeout=30).status_code == 200
    assert httpx.put(url, json=config("three", "0"), timeout=30).status_code == 200

    def running_env() -> str:
        app = httpx.get(url, timeout=10).json()["applications"].get("latest")
        if not app or app["status"] != "RUNNING":
            return ""
        return str(app["deployed_app_config"]["runtime_env"]["env_vars"]["WHICH"])

    eventually(lambda: running_env() == "three", 60, what="the last PUT's config running")
    assert httpx.put(url, json={"applications": []}, timeout=30).status_code == 200
