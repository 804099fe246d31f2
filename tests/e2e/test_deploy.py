"""Deploy failures and bad input give clear errors and leave the instance serving."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from surge import serve
from surge.model import ApplicationStatus
from surge.serve.exceptions import ConfigError, DeployFailedError, RayServeException
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@serve.deployment
class BrokenInit:
    def __init__(self) -> None:
        raise RuntimeError("model file missing")

    def __call__(self) -> str:
        return "never"


@serve.deployment
class Fine:
    def __call__(self, *args: Any) -> str:
        return "fine"


def test_constructor_failure_fails_the_deploy_with_the_reason(surge_instance) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DeployFailedError, match="model file missing"):
        serve.run(BrokenInit.bind(), name="broken", route_prefix="/broken")
    status = serve.status().applications["broken"]
    assert status.status is ApplicationStatus.DEPLOY_FAILED
    assert "RuntimeError: model file missing" in status.message
    # A fixed version deploys over it.
    handle = serve.run(Fine.bind(), name="broken", route_prefix="/broken")
    assert handle.remote().result(timeout_s=10) == "fine"
    serve.delete("broken")


@serve.deployment(max_constructor_retry_count=2)
class NeverHealthy:
    def check_health(self) -> None:
        raise RuntimeError("weights not loaded")

    def __call__(self) -> str:
        return "never"


def test_a_replica_whose_first_health_check_fails_never_serves(surge_instance) -> None:  # type: ignore[no-untyped-def]
    """As Ray: a replica serves only once its first health check passed, at start, before
    the first period; failing it is failing to start."""
    with pytest.raises(DeployFailedError, match="weights not loaded"):
        serve.run(NeverHealthy.bind(), name="unhealthy", route_prefix="/unhealthy")
    assert serve.status().applications["unhealthy"].status is ApplicationStatus.DEPLOY_FAILED
    serve.delete("unhealthy")


def test_bad_input_is_rejected_before_anything_runs(surge_instance) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"call \.bind"):
        serve.run(Fine, name="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Did you mean 'max_ongoing_requests'"):
        Fine.options(max_ongoing_request=3)
    with pytest.raises(ConfigError, match="max_ongoing_requests must be an integer >= 1"):
        Fine.options(max_ongoing_requests=0)
    with pytest.raises(ConfigError, match="Invalid route_prefix 'nope', must start with"):
        serve.run(Fine.bind(), name="x", route_prefix="nope")
    serve.run(Fine.bind(), name="first", route_prefix="/same")
    with pytest.raises(ConfigError, match="already used by application 'first'"):
        serve.run(Fine.bind(), name="second", route_prefix="/same")
    with pytest.raises(ConfigError, match=re.escape("Invalid route_prefix '/{x}', may not "
                                                    "contain wildcards.")):
        serve.run(Fine.bind(), name="third", route_prefix="/{x}")
    # Ray's words, and Ray's types: a missing deployment is a KeyError too.
    with pytest.raises(RayServeException, match=r"^Application 'nope' does not exist\.$"):
        serve.get_app_handle("nope")
    with pytest.raises(KeyError, match=re.escape("Deployment 'Nope' does not exist in "
                                                 "application 'first'.")):
        serve.get_deployment_handle("Nope", "first")
    # One handle per deployment, as Ray caches them.
    assert serve.get_app_handle("first") is serve.get_app_handle("first")
    assert serve.get_deployment_handle("Fine", "first") is serve.get_app_handle("first")
    with pytest.raises(RayServeException, match=r"Tried to call a method 'nope' that does "
                       r"not exist. Available methods: \[\]\."):
        serve.get_app_handle("first").nope.remote().result(timeout_s=10)
    serve.delete("first")


def test_a_script_that_joins_a_running_instance_says_where_and_whose(surge_instance) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ, SURGE_ADDRESS=surge_instance.control_address)
    script = "from surge import serve; serve.start(); print(len(serve.status().applications))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    # The instance was started by this (pytest) process: the joining script is told so.
    assert (f"joined the surge instance already running at {surge_instance.control_address}"
            in out.stderr), out.stderr
    assert f"by {getpass.getuser()} (pid {os.getpid()}: " in out.stderr, out.stderr


def test_cli_status_and_shutdown_reach_the_running_instance(surge_instance) -> None:  # type: ignore[no-untyped-def]
    serve.run(Fine.bind(), name="cli", route_prefix="/cli")
    env = dict(os.environ, SURGE_ADDRESS=surge_instance.control_address)
    out = subprocess.run([sys.executable, "-m", "surge.cli.main", "status", "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["applications"]["cli"]["status"] == "RUNNING"
    assert data["applications"]["cli"]["deployments"]["Fine"]["replica_states"] == {
        "RUNNING": 1}
    assert any(r["deployment"] == "Fine" and r["state"] == "RUNNING" for r in data["replicas"])
    rates = data["applications"]["cli"]["deployments"]["Fine"]["rates"]
    # node_cpu once the controller has read its node's CPU (a second after it started)
    assert set(rates) - {"node_cpu"} == {
        "offered_per_s", "completed_per_s", "rejected_per_s", "queued", "ongoing"}
    assert 0.0 <= rates.get("node_cpu", 0.0) <= 1.0
    text = subprocess.run([sys.executable, "-m", "surge.cli.main", "status"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert "cli" in text.stdout and "RUNNING" in text.stdout
    serve.delete("cli")


def test_cli_reports_a_missing_instance() -> None:
    env = dict(os.environ, SURGE_ADDRESS="127.0.0.1:1")
    out = subprocess.run([sys.executable, "-m", "surge.cli.main", "status"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert "no surge instance answers at 127.0.0.1:1" in out.stderr


def test_cli_run_serves_until_cli_shutdown(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.ports import free_port

    port = free_port()
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}", SURGE_LOG_LEVEL="WARNING")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.Popen([sys.executable, "-m", "surge.cli.main", "run", "examples.echo:app",
                            "--route-prefix", "/echo", "--port", str(port)],
                           cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None
    try:
        assert "running" in run.stdout.readline()
        response = httpx.get(f"http://127.0.0.1:{port}/echo", params={"value": "cli"})
        assert response.json() == {"echo": "cli"}
        out = subprocess.run([sys.executable, "-m", "surge.cli.main", "shutdown"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert run.wait(timeout=30) == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stdout.close()


@serve.deployment(graceful_shutdown_timeout_s=0.01)
class HangingStart:
    async def __init__(self, marks: str) -> None:
        self.marks = marks
        with open(os.path.join(marks, "init"), "w"):
            pass
        await asyncio.sleep(10_000)

    async def __del__(self) -> None:
        await asyncio.sleep(0)
        with open(os.path.join(self.marks, "del"), "a") as file:
            file.write("x")


def test_delete_while_the_constructor_runs_still_runs_del_once(  # type: ignore[no-untyped-def]
        surge_instance, tmp_path) -> None:
    # As Ray: serve._run(_blocking=False) returns before the app runs; a delete then
    # cancels the async __init__ and the replica's __del__ runs, once.
    serve._run(HangingStart.bind(str(tmp_path)), name="hanging", route_prefix=None,
               _blocking=False)
    eventually(lambda: (tmp_path / "init").exists(), 60, what="the constructor started")
    serve.delete("hanging")
    assert eventually(lambda: (tmp_path / "del").exists(), 10, what="__del__ ran")
    assert (tmp_path / "del").read_text() == "x"
