"""`surge run config.yaml`, `surge deploy` of a change under load, `surge status`, shutdown.

The CLI runs as real subprocesses against a real instance on free loopback ports.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.e2e.load import Load
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
http_options:
  port: {port}
  request_timeout_s: 30
applications:
- name: text_ml
  route_prefix: /summarize
  import_path: tests.config.apps.text_ml:app
  runtime_env:
    env_vars: {{TEXT_ML_MODE: e2e}}
  deployments:
  - name: Translator
    num_replicas: 2
    max_ongoing_requests: {translator_limit}
    user_config: {{language: {language}}}
  - name: Summarizer
    num_replicas: 2
    max_queued_requests: 1000
    user_config: {{min_length: {min_length}}}
"""


def _surge(*args: str, env: dict[str, str],
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "surge.cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _wait_for_line(process: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []

    def printed() -> bool:
        while not lines.empty():
            seen.append(lines.get_nowait())
        return any(needle in line for line in seen)

    # the line, or the process ended without it (then there is no point waiting on)
    eventually(lambda: printed() or process.poll() is not None, timeout,
               what=f"{needle!r} from surge run")
    if not printed():
        raise AssertionError(f"no {needle!r} from surge run; got:\n{''.join(seen)}")
    return seen


def test_run_deploy_under_load_status_shutdown(tmp_path: Path) -> None:
    http_port = free_port()
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    first = tmp_path / "config.yaml"
    first.write_text(CONFIG.format(port=http_port, language="german", min_length=1,
                                   translator_limit=8))
    process = subprocess.Popen([sys.executable, "-m", "surge.cli.main", "run", str(first)],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        _wait_for_line(process, "Ctrl-C to stop", timeout=30)
        url = f"http://127.0.0.1:{http_port}/summarize"
        assert httpx.get(url, params={"text": "a"}).json() == {
            "text": "german:a", "min_length": 1, "env": "e2e"}

        # user_config changes reconfigure in place; max_ongoing_requests rolls Translator.
        second = tmp_path / "second.yaml"
        second.write_text(CONFIG.format(port=http_port, language="italian", min_length=3,
                                        translator_limit=16))
        with Load(url, params={"text": "x"}, keep_bodies=True) as load:
            # the change is deployed under load: served before, during and after it
            eventually(lambda: load.outcomes["200"] >= 20, 10, what="the load served")
            deployed = _surge("deploy", str(second), env=env)
            after = len(load.bodies)
            eventually(lambda: len(load.bodies) >= after + 20, 10,
                       what="the load served after the deploy")
        assert deployed.returncode == 0, deployed.stderr
        assert "RUNNING" in deployed.stdout
        assert set(load.outcomes) == {"200"}, load.outcomes
        assert load.bodies[-1] == {"text": "italian:x", "min_length": 3, "env": "e2e"}

        status = _surge("status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        deployments = data["applications"]["text_ml"]["deployments"]
        assert deployments["Translator"]["replica_states"] == {"RUNNING": 2}
        assert deployments["Summarizer"]["replica_states"] == {"RUNNING": 2}

        # An application missing from the file is deleted.
        third = tmp_path / "third.yaml"
        third.write_text("""
applications:
- name: translate
  route_prefix: /translate
  import_path: tests.config.apps.text_ml:builder
  args: {language: french}
""")
        deployed = _surge("deploy", str(third), env=env)
        assert deployed.returncode == 0, deployed.stderr
        assert "application 'text_ml' deleted" in deployed.stdout
        data = json.loads(_surge("status", "--json", env=env).stdout)
        assert list(data["applications"]) == ["translate"]

        stopped = _surge("shutdown", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_deploy_with_a_bad_config_names_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n- name: a\n  import_path: x:y\n  deployments:\n"
                   "  - name: D\n    max_ongoing_request: 3\n")
    env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}")
    result = _surge("deploy", str(bad), env=env)
    assert result.returncode == 1
    assert (f"{bad}:6: applications[0].deployments[0].max_ongoing_request: unknown key. "
            "Did you mean 'max_ongoing_requests'?") in result.stderr
