"""Ray 2.60's own `serve` CLI, from a Ray virtualenv, operates a surge instance.

`serve deploy`, `serve status`, `serve config` and `serve shutdown` speak Ray's REST API
(ray/dashboard/modules/serve/sdk.py: GET /api/version first, then
/api/serve/applications/); here they talk to surge's dashboard port. The Ray venv is
made by `make test` (bench.common.ray_python(): `ray[serve]==2.60.0` in a venv of its
own, since surge's venv has Ray without Serve's extras).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from bench.common import RAY_VENV

from tests.e2e.procs import alive, descendants, title
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SERVE = RAY_VENV / "bin" / "serve"
TOKEN = "a-token-for-ray-cli-tests-0123456789"

APP = {"name": "text_ml", "route_prefix": "/summarize",
       "import_path": "tests.config.apps.text_ml:app",
       "deployments": [{"name": "Translator", "user_config": {"language": "french"}},
                       {"name": "Summarizer", "user_config": {"min_length": 3}}]}


@pytest.fixture(scope="module")
def serve_cli() -> Path:
    if not SERVE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{SERVE} is missing: `make test` creates Ray Serve's venv first")
        pytest.skip(f"no Ray Serve venv at {RAY_VENV}; `make ray-venv` makes it")
    return SERVE


@dataclass
class Instance:
    folder: Path
    env: dict[str, str]
    http_port: int
    dashboard: str
    daemon: int

    def ray(self, *args: str, token: bool = True) -> subprocess.CompletedProcess[str]:
        """Ray's `serve` with this instance's dashboard as -a, from Ray's venv."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SURGE_", "RAY_"))}
        env["PATH"] = f"{RAY_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.pop("PYTHONPATH", None)  # Ray's venv imports nothing of surge's
        if token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
        return subprocess.run([str(SERVE), *args, "-a", self.dashboard], cwd=self.folder,
                              env=env, capture_output=True, text=True, timeout=120)

    def status(self) -> dict[str, object]:
        done = self.ray("status")
        assert done.returncode == 0, done.stderr
        data: dict[str, object] = yaml.safe_load(done.stdout)
        return data


@pytest.fixture
def instance(tmp_path: Path, serve_cli: Path) -> Iterator[Instance]:
    dashboard_port = free_port()
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}",
               SURGE_LOG_LEVEL="WARNING", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN,
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    http_port = free_port()
    started = subprocess.run([sys.executable, "-m", "surge.cli.main", "start", "--http-port",
                              str(http_port), "--dashboard-port", str(dashboard_port)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    daemon = int(started.stdout.split("daemon pid ", 1)[1].split(")", 1)[0])
    running = Instance(tmp_path, env, http_port, f"http://127.0.0.1:{dashboard_port}", daemon)
    try:
        yield running
    finally:  # whatever the test did, nothing of the instance stays
        left = [daemon, *descendants(daemon)]
        if alive(daemon):
            subprocess.run([sys.executable, "-m", "surge.cli.main", "shutdown", "-y"],
                           cwd=ROOT, env=env, capture_output=True, timeout=120)
        for pid in left:
            if alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _write(folder: Path, apps: list[dict[str, object]]) -> Path:
    path = folder / "serve_config.yaml"
    path.write_text(yaml.safe_dump({"applications": apps}))
    return path


def _app(data: dict[str, object]) -> dict[str, object]:
    applications = data["applications"]
    assert isinstance(applications, dict)
    app: dict[str, object] = applications["text_ml"]
    return app


def _replica_ids(instance: Instance) -> set[str]:
    details = httpx.get(f"{instance.dashboard}/api/serve/applications/",
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    deployments = details["applications"]["text_ml"]["deployments"]
    return {r["replica_id"] for d in deployments.values() for r in d["replicas"]
            if r["state"] == "RUNNING"}


def test_rays_serve_cli_deploys_reports_updates_and_shuts_down_surge(
        instance: Instance) -> None:
    url = f"http://127.0.0.1:{instance.http_port}/summarize?text=hi"
    deployed = instance.ray("deploy", str(_write(instance.folder, [APP])))
    assert deployed.returncode == 0, deployed.stderr
    assert "Sent deploy request successfully" in deployed.stderr + deployed.stdout

    eventually(lambda: _app(instance.status())["status"] == "RUNNING", 90,
               what="serve status: text_ml RUNNING")
    app = _app(instance.status())
    deployments = app["deployments"]
    assert isinstance(deployments, dict)
    assert set(deployments) == {"Translator", "Summarizer"}
    assert all(d["status"] == "HEALTHY" for d in deployments.values())
    assert httpx.get(url, timeout=10).json()["text"] == "french:hi"

    shown = instance.ray("config")
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout) == APP

    # A user_config change is applied in place: the same replicas answer differently.
    before = _replica_ids(instance)
    changed = {**APP, "deployments": [
        {"name": "Translator", "user_config": {"language": "german"}},
        {"name": "Summarizer", "user_config": {"min_length": 3}}]}
    updated = instance.ray("deploy", str(_write(instance.folder, [changed])))
    assert updated.returncode == 0, updated.stderr
    eventually(lambda: httpx.get(url, timeout=10).json()["text"] == "german:hi", 60,
               what="the new user_config answering")
    assert _replica_ids(instance) == before

    # A config whose code cannot be imported: refused with the reason when the build
    # fails within the PUT's answer budget (nothing changes), else accepted and reported
    # DEPLOY_FAILED with the reason, as Ray does; the running version serves on.
    broken = {**changed, "import_path": "tests.config.apps.no_such_module:app"}
    sent = instance.ray("deploy", str(_write(instance.folder, [broken])))
    if sent.returncode != 0:
        assert "no_such_module" in sent.stderr + sent.stdout
        assert yaml.safe_load(instance.ray("config").stdout)["import_path"] == \
            APP["import_path"]
    else:
        eventually(lambda: _app(instance.status())["status"] == "DEPLOY_FAILED", 60,
                   what="serve status: text_ml DEPLOY_FAILED")
        assert "no_such_module" in str(_app(instance.status())["message"])
    assert httpx.get(url, timeout=10).json()["text"] == "german:hi"

    # Without the token, Ray's CLI is refused (the instance runs with RAY_AUTH_MODE=token).
    anonymous = instance.ray("status", token=False)
    assert anonymous.returncode != 0
    assert "401" in anonymous.stderr + anonymous.stdout or \
        "uthentication" in anonymous.stderr + anonymous.stdout

    processes = [instance.daemon, *descendants(instance.daemon)]
    assert any(title(pid).startswith("surge:replica") for pid in processes)
    stopped = instance.ray("shutdown", "-y")
    assert stopped.returncode == 0, stopped.stderr
    # Ray's shutdown is asynchronous: the applications are deleted after the answer.
    eventually(lambda: not any(alive(pid) for pid in processes), 60,
               what="every process of the instance gone")
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=5)


def _surge(instance: Instance, *args: str) -> subprocess.CompletedProcess[str]:
    """surge's own CLI, reaching the instance at its control address."""
    return subprocess.run([sys.executable, "-m", "surge.cli.main", *args], cwd=ROOT,
                          env=instance.env, capture_output=True, text=True, timeout=120)


FAILING = {"name": "greeter", "route_prefix": "/greeter",
           "import_path": "tests.config.apps.greeter:app",
           "deployments": [{"name": "Greeter", "ray_actor_options": {
               "runtime_env": {"env_vars": {"GREETER_FAIL_INIT": "1"}}}}]}


def test_surge_status_and_config_print_what_rays_cli_prints(instance: Instance) -> None:
    # A script that reads `serve status` or `serve config` (yaml.safe_load) reads
    # `surge status` and `surge config` the same: the same document, byte for byte,
    # a failed deployment's traceback (a literal block) included.
    sent = instance.ray("deploy", str(_write(instance.folder, [APP, FAILING])))
    assert sent.returncode == 0, sent.stderr

    def settled() -> bool:
        apps = instance.status()["applications"]
        assert isinstance(apps, dict)
        return apps["text_ml"]["status"] == "RUNNING" and \
            apps["greeter"]["status"] == "DEPLOY_FAILED"

    eventually(settled, 90, what="text_ml RUNNING and greeter DEPLOY_FAILED")
    for args in (("status",), ("status", "-n", "greeter"), ("config",),
                 ("config", "-n", "text_ml"), ("config", "-n", "nope")):
        ours, rays = _surge(instance, *args), instance.ray(*args)
        assert ours.returncode == rays.returncode == 0, ours.stderr + rays.stderr
        assert ours.stdout == rays.stdout, args
    status = yaml.safe_load(_surge(instance, "status").stdout)
    assert set(status) == {"proxies", "applications", "target_capacity"}
    failed = status["applications"]["greeter"]["deployments"]["Greeter"]
    assert failed["status_trigger"] == "REPLICA_STARTUP_FAILED"
    assert "GREETER_FAIL_INIT is set" in failed["message"]
    table = _surge(instance, "status", "--table")
    assert "text_ml" in table.stdout and "req/s offered" in table.stdout


def test_surge_build_writes_the_config_rays_build_writes(tmp_path: Path,
                                                          serve_cli: Path) -> None:
    # The same application, imported once as Ray's and once as surge's: the two files
    # load to the same config (gRPC's default options included, as Ray writes them).
    source = ("from PACKAGE import serve\n\n"
              "@serve.deployment\ndef hello(request):\n    return 'hi'\n\n"
              "small = hello.bind()\n"
              "big = hello.options(name='big', num_replicas=2, user_config={'a': 1},\n"
              "                    ray_actor_options={'num_cpus': 2}).bind()\n")
    (tmp_path / "ray_side.py").write_text(source.replace("PACKAGE", "ray"))
    (tmp_path / "surge_side.py").write_text(source.replace("PACKAGE", "surge"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SURGE_", "RAY_"))}
    env.pop("PYTHONPATH", None)
    rays = subprocess.run([str(serve_cli), "build", "ray_side:small", "ray_side:big", "-o",
                           "ray.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert rays.returncode == 0, rays.stderr
    ours = subprocess.run([sys.executable, "-m", "surge.cli.main", "build", "surge_side:small",
                           "surge_side:big", "-d", str(tmp_path), "-o",
                           str(tmp_path / "surge.yaml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert ours.returncode == 0, ours.stderr
    rays_text = (tmp_path / "ray.yaml").read_text()
    expected = yaml.safe_load(rays_text.replace("ray_side:", "surge_side:"))
    assert yaml.safe_load((tmp_path / "surge.yaml").read_text()) == expected
    assert expected["grpc_options"] == {"port": 9000, "grpc_servicer_functions": [],
                                        "enable_reflection": True}
