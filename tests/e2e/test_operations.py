"""Instances that outlive their scripts, and the `surge` CLI as Ray's `serve` is used.

Real subprocesses on free loopback ports: a deploy script that exits leaves its app
serving on a detached instance; `surge shutdown` then leaves no process behind (the
process table is read from /proc, starting at the daemon); the CLI's Ray flags
(builder key=value arguments, status -n, config, --non-blocking, --reload, build -o).
"""

from __future__ import annotations

import contextlib
import json
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

from tests.e2e.procs import alive, descendants, title
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

APP = '''
from pydantic import BaseModel

from surge import serve


class Greeting(BaseModel):
    word: str = "hello"
    times: int = 1


@serve.deployment
class Greeter:
    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, request) -> str:
        return self.text


def builder(args: Greeting):
    return Greeter.bind(args.word * args.times)


app = Greeter.bind("{text}")
'''

DEPLOY_SCRIPT = '''
from surge import serve
from greeter import app

serve.start(detached={detached}, http_options={{"port": {port}}})
serve.run(app, name="{name}", route_prefix="/{name}")
print("deployed", flush=True)
'''


@dataclass
class Place:
    """A folder with the app, and the environment that points the CLI at one instance."""

    folder: Path
    env: dict[str, str]
    http_port: int
    dashboard_port: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def surge(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "surge.cli.main", *args], cwd=self.folder,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def python(self, script: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        path = self.folder / "deploy.py"
        path.write_text(script)
        return subprocess.run([sys.executable, str(path)], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def _daemon_pid(place: Place) -> int | None:
    """The daemon of the instance this test started: it runs in the test's folder."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and title(int(entry)).startswith("surge:daemon"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/cwd") == str(place.folder):
                    return int(entry)
    return None


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    (tmp_path / "greeter.py").write_text(APP.format(text="first"))
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}",
               SURGE_DASHBOARD=f"127.0.0.1:{free_port()}", SURGE_LOG_LEVEL="WARNING",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get(
                   "PYTHONPATH", "")) if p))
    dashboard_port = int(env["SURGE_DASHBOARD"].rpartition(":")[2])
    spot = Place(tmp_path, env, free_port(), dashboard_port)
    try:
        yield spot
    finally:  # a failed test must not leave its instance running
        daemon = _daemon_pid(spot)
        if daemon is not None:
            left = [daemon, *descendants(daemon)]
            spot.surge("shutdown", "-y", timeout=90)
            for pid in left:
                if alive(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)


def _instance_processes(daemon: int) -> list[int]:
    return [daemon, *descendants(daemon)]


def test_a_deploy_script_that_exits_leaves_its_app_serving(place: Place) -> None:
    done = place.python(DEPLOY_SCRIPT.format(detached=True, port=place.http_port,
                                             name="first"))
    assert done.returncode == 0, done.stderr
    assert "deployed" in done.stdout
    assert httpx.get(place.url("/first"), timeout=10).text == "first"  # the script is gone

    # A plain script (not detached) deploys to the running instance and exits: the
    # instance, which it did not start, keeps running, with both applications.
    (place.folder / "greeter.py").write_text(APP.format(text="second"))
    done = place.python(DEPLOY_SCRIPT.format(detached=False, port=place.http_port,
                                             name="second"))
    assert done.returncode == 0, done.stderr
    assert httpx.get(place.url("/second"), timeout=10).text == "second"
    assert httpx.get(place.url("/first"), timeout=10).text == "first"

    daemon = _daemon_pid(place)
    assert daemon is not None
    members = _instance_processes(daemon)
    titles = {title(pid).split(":")[1] for pid in members if title(pid).startswith("surge:")}
    assert {"daemon", "controller", "proxy", "replica"} <= titles, titles

    stopped = place.surge("shutdown", "-y")
    assert stopped.returncode == 0, stopped.stderr
    # `surge shutdown` returns once the daemon, which leaves last, is gone.
    assert [pid for pid in members if alive(pid)] == []
    with pytest.raises(httpx.TransportError):
        httpx.get(place.url("/first"), timeout=5)


def test_a_plain_script_stops_the_instance_it_started(place: Place) -> None:
    script = DEPLOY_SCRIPT.format(detached=False, port=place.http_port, name="mine") + (
        "import os, sys\nprint('pid', os.getpid(), flush=True)\n")
    done = place.python(script)
    assert done.returncode == 0, done.stderr
    assert _daemon_pid(place) is None
    with pytest.raises(httpx.TransportError):
        httpx.get(place.url("/mine"), timeout=5)


def test_cli_start_deploy_builder_status_config_shutdown(place: Place) -> None:
    started = place.surge("start", "--http-port", str(place.http_port))
    assert started.returncode == 0, started.stderr
    assert "started a detached instance" in started.stdout
    again = place.surge("start")
    assert again.returncode == 0 and "already runs" in again.stdout

    deployed = place.surge("deploy", "greeter:builder", "word=yo", "times=3", "--name", "g")
    assert deployed.returncode == 0, deployed.stderr
    assert httpx.get(place.url("/"), timeout=10).text == "yoyoyo"

    refused = place.surge("deploy", "greeter:builder", "times=many", "--name", "g")
    assert refused.returncode == 1
    assert "do not fit Greeting" in refused.stderr and "times" in refused.stderr
    assert httpx.get(place.url("/"), timeout=10).text == "yoyoyo"  # nothing changed

    ran = place.surge("run", "greeter.app", "--non-blocking", "--name", "plain",
                      "--route-prefix", "/plain")
    assert ran.returncode == 0, ran.stderr
    assert httpx.get(place.url("/plain"), timeout=10).text == "first"

    status = place.surge("status", "-n", "g", "--json")
    assert status.returncode == 0, status.stderr
    assert list(json.loads(status.stdout)["applications"]) == ["g"]
    missing = place.surge("status", "-n", "nope")
    assert missing.returncode == 1 and "'nope' does not exist" in missing.stderr

    config = place.surge("config", "-n", "g")
    assert yaml.safe_load(config.stdout) == {  # what Ray's `serve deploy` sends
        "name": "g", "import_path": "greeter:builder", "runtime_env": {},
        "args": {"word": "yo", "times": "3"}}
    over_rest = place.surge("config", "-a", f"http://127.0.0.1:{place.dashboard_port}",
                            "-n", "g")
    assert over_rest.stdout == config.stdout

    daemon = _daemon_pid(place)
    assert daemon is not None
    members = _instance_processes(daemon)
    stopped = place.surge("shutdown", "-y")
    assert stopped.returncode == 0, stopped.stderr
    assert [pid for pid in members if alive(pid)] == []
    nothing = place.surge("shutdown", "-y")
    assert nothing.returncode == 0 and "nothing to shut down" in nothing.stderr


def test_cli_deploy_of_an_import_path_takes_its_runtime_env(place: Place) -> None:
    # As Ray's `serve deploy main:app --runtime-env-json ...`: the application's
    # runtime_env, so its env_vars reach the replicas; a config file keeps its own.
    (place.folder / "detector.py").write_text(
        "import os\nfrom surge import serve\n\n@serve.deployment\n"
        "def find(request):\n    return os.environ.get('BURIED_ITEM', 'no dice')\n\n"
        "app = find.bind()\n")
    assert place.surge("start", "--http-port", str(place.http_port)).returncode == 0
    env = json.dumps({"env_vars": {"BURIED_ITEM": "lucky coin"}})
    deployed = place.surge("deploy", "detector:app", "--runtime-env-json", env)
    assert deployed.returncode == 0, deployed.stderr
    assert httpx.get(place.url("/"), timeout=10).text == "lucky coin"
    shown = yaml.safe_load(place.surge("config").stdout)
    assert shown == {"import_path": "detector:app",
                     "runtime_env": {"env_vars": {"BURIED_ITEM": "lucky coin"}}, "args": {}}
    config = place.folder / "config.yaml"
    config.write_text(yaml.safe_dump({"applications": [{"import_path": "detector:app"}]}))
    again = place.surge("deploy", str(config), "--runtime-env-json", env)
    assert again.returncode == 0, again.stderr
    assert "the runtime_env is ignored with a config file" in again.stderr
    assert httpx.get(place.url("/"), timeout=10).text == "no dice"


FAILING = """
from surge import serve


@serve.deployment(max_constructor_retry_count=1)
class ConstructorFailure:
    def __init__(self) -> None:
        raise RuntimeError("Intentionally failing.")


app = ConstructorFailure.bind()
"""


def test_cli_deploy_and_run_wait_and_exit_1_when_an_application_fails(place: Place) -> None:
    # Ray's `serve deploy` answers 0 once the request is sent and `serve run` exits 0
    # after printing the traceback; surge's wait for the outcome and exit 1 with it.
    (place.folder / "failing.py").write_text(FAILING)
    (place.folder / "broken.py").write_text("x = (1 + 2\n")
    ran = place.surge("run", "failing:app", "--port", str(place.http_port))
    assert ran.returncode == 1
    assert "Intentionally failing." in ran.stdout + ran.stderr
    assert _daemon_pid(place) is None  # the instance it started went with it

    assert place.surge("start", "--http-port", str(place.http_port)).returncode == 0
    config = place.folder / "config.yaml"
    config.write_text(yaml.safe_dump({"applications": [
        {"name": "bad", "route_prefix": "/bad", "import_path": "failing:app"}]}))
    deployed = place.surge("deploy", str(config))
    assert deployed.returncode == 1
    assert "Intentionally failing." in deployed.stderr
    status = yaml.safe_load(place.surge("status").stdout)
    assert status["applications"]["bad"]["status"] == "DEPLOY_FAILED"

    # A file with an application that cannot be imported changes nothing at all.
    config.write_text(yaml.safe_dump({"applications": [
        {"name": "good", "route_prefix": "/good", "import_path": "greeter:app"},
        {"name": "syntax", "route_prefix": "/syntax", "import_path": "broken:app"}]}))
    refused = place.surge("deploy", str(config))
    assert refused.returncode == 1
    assert "x = (1 + 2" in refused.stderr
    assert set(yaml.safe_load(place.surge("status").stdout)["applications"]) == {"bad"}


def test_cli_config_leaves_out_an_application_being_deleted(place: Place) -> None:
    # As Ray's test_config_with_deleting_app: once a config drops an application, `serve
    # config` shows only what is still deployed, while `serve status` says DELETING.
    started = place.surge("start", "--http-port", str(place.http_port))
    assert started.returncode == 0, started.stderr
    first = {"name": "first", "route_prefix": "/first", "import_path": "greeter:app"}
    slow = {"name": "slow", "route_prefix": "/slow",
            "import_path": "tests.config.apps.slow_delete:app",
            "runtime_env": {"env_vars": {"SLOW_DELETE_S": "10"}}}
    config = place.folder / "config.yaml"
    config.write_text(yaml.safe_dump({"applications": [first, slow]}))
    assert place.surge("deploy", str(config)).returncode == 0
    config.write_text(yaml.safe_dump({"applications": [first]}))
    dashboard = f"http://127.0.0.1:{place.dashboard_port}"
    sent = place.surge("deploy", str(config), "-a", dashboard)  # answers before it is gone
    assert sent.returncode == 0, sent.stderr
    status = yaml.safe_load(place.surge("status").stdout)
    assert status["applications"]["slow"]["status"] == "DELETING"
    assert list(yaml.safe_load_all(place.surge("config").stdout)) == [first]


def test_cli_run_refuses_a_remote_working_dir(place: Place) -> None:
    # Ray downloads a working_dir URI for the job; surge runs the code it has here.
    remote = "https://github.com/ray-project/test_dag/archive/HEAD.zip"
    for flags in (("--working-dir", remote),
                  ("--runtime-env-json", json.dumps({"working_dir": remote}))):
        ran = place.surge("run", "greeter:app", *flags)
        assert ran.returncode == 1
        assert f"working_dir '{remote}' is a remote URI" in ran.stderr
    assert _daemon_pid(place) is None


def test_cli_refuses_unknown_flags_with_the_closest_one(place: Place) -> None:
    typo = place.surge("run", "greeter:app", "--non-blockng")
    assert typo.returncode == 2
    assert "unknown flag: --non-blockng (did you mean --non-blocking?)" in typo.stderr
    conflict = place.surge("run", "greeter:app", "--non-blocking", "--reload")
    assert conflict.returncode == 1 and "conflicts with the --reload" in conflict.stderr
    bad_arg = place.surge("run", "greeter:builder", "times")
    assert bad_arg.returncode == 1 and "key=value" in bad_arg.stderr
    assert _daemon_pid(place) is None  # nothing was started for them


def test_cli_build_writes_what_ray_writes(place: Place) -> None:
    out = place.folder / "built.yaml"
    built = place.surge("build", "greeter:app", "-d", str(place.folder), "--output-path",
                        str(out))
    assert built.returncode == 0, built.stderr
    data = yaml.safe_load(out.read_text())
    assert data["proxy_location"] == "EveryNode"
    assert data["http_options"] == {"host": "0.0.0.0", "port": 8000}
    assert data["grpc_options"] == {"port": 9000, "grpc_servicer_functions": [],
                                    "enable_reflection": True}
    assert data["logging_config"]["encoding"] == "TEXT"
    assert data["applications"][0]["import_path"] == "greeter:app"
    assert data["applications"][0]["deployments"] == [{"name": "Greeter"}]


def test_cli_run_reload_redeploys_an_edited_file(place: Place) -> None:
    run = subprocess.Popen([sys.executable, "-m", "surge.cli.main", "run", "greeter:app",
                            "--reload", "--port", str(place.http_port)], cwd=place.folder,
                           env=place.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        def answers(text: str) -> bool:
            try:
                return httpx.get(place.url("/"), timeout=5).text == text
            except httpx.TransportError:
                return False

        eventually(lambda: answers("first") or run.poll() is not None, 90,
                   what="the first version serving")
        assert run.poll() is None
        (place.folder / "greeter.py").write_text(APP.format(text="edited"))
        eventually(lambda: answers("edited") or run.poll() is not None, 90,
                   what="the edited version serving")
        assert run.poll() is None
    finally:
        run.send_signal(signal.SIGINT)  # Ctrl-C: it shuts its instance down
        try:
            output, _ = run.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            output, _ = run.communicate()
    assert "redeploying" in output, output
    assert "shutting down" in output, output


def test_start_refuses_a_dashboard_port_that_is_taken(place: Place) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = place.surge("start", "--dashboard-port", str(port))
    assert refused.returncode == 1
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in refused.stderr
    assert "could not start surge: could not" not in refused.stderr
    assert _daemon_pid(place) is None  # nothing left behind
