"""Real processes: titles, kill -9 recovery, health checks, no orphans, second drivers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from surge import serve
from tests.e2e.procs import alive, surge_processes, title
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e


@serve.deployment(num_replicas=2, max_ongoing_requests=4)
class Sleeper:
    """Sleeps `s` seconds; with `mark=<file>`, first appends its pid there (the request
    has started at this replica: what a test waits for before it kills the replica)."""

    async def __call__(self, request: Any) -> dict[str, int]:
        import asyncio

        mark = request.query_params.get("mark")
        if mark:
            with open(mark, "a") as out:
                out.write(f"{os.getpid()}\n")
        await asyncio.sleep(float(request.query_params.get("s", "0")))
        return {"pid": os.getpid()}


def _replica_pids(app: str) -> list[int]:
    return [pid for pid, name in surge_processes(os.getpid()).items()
            if name.startswith(f"surge:replica:{app}:")]


def _started_at(mark: Path) -> list[int]:
    """The pids of the replicas at which a `mark`ed request started, in order."""
    try:
        return [int(line) for line in mark.read_text().split()]
    except FileNotFoundError:
        return []


def test_process_titles(surge_instance) -> None:  # type: ignore[no-untyped-def]
    serve.run(Sleeper.bind(), name="titles", route_prefix="/titles")
    names = sorted(surge_processes(os.getpid()).values())
    assert "surge:controller" in names
    assert names.count("surge:proxy") == 1  # the one started early, taken (backends/early.py)
    assert names.count("surge:replica:titles:Sleeper") == 2
    serve.delete("titles")


def test_kill_9_replica_is_replaced(surge_instance, client: httpx.Client,  # type: ignore[no-untyped-def]
                                    tmp_path: Path) -> None:
    serve.run(Sleeper.options(num_replicas=1).bind(), name="kill", route_prefix="/kill")
    [victim] = _replica_pids("kill")
    mark = tmp_path / "started"
    results: list[httpx.Response] = []
    in_flight = threading.Thread(
        target=lambda: results.append(client.get("/kill", params={"s": "30",
                                                                   "mark": str(mark)})))
    in_flight.start()
    eventually(lambda: _started_at(mark) == [victim], 10,
               what="the request in flight at the replica")
    os.kill(victim, signal.SIGKILL)
    in_flight.join(timeout=10)
    assert not in_flight.is_alive(), "the in-flight request hung after its replica died"
    assert results[0].status_code == 500
    assert "died" in results[0].text

    def served_by() -> int | None:
        response = client.get("/kill", params={"x-request-timeout-seconds": "2"},
                              headers={"x-request-timeout-seconds": "2"})
        return int(response.json()["pid"]) if response.status_code == 200 else None

    served = eventually(served_by, 20, interval_s=0.1, what="a 200 from a replacement")
    assert served != victim
    serve.delete("kill")


def test_queued_requests_survive_a_replica_death(surge_instance, client: httpx.Client,  # type: ignore[no-untyped-def]
                                                 tmp_path: Path) -> None:
    serve.run(Sleeper.options(num_replicas=2, max_ongoing_requests=1).bind(),
              name="queued", route_prefix="/queued")
    pids = _replica_pids("queued")
    assert len(pids) == 2
    mark = tmp_path / "started"
    statuses: list[int] = []
    lock = threading.Lock()

    def call() -> None:
        response = client.get("/queued", params={"s": "1", "mark": str(mark)})
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    # two in flight (one per replica, max_ongoing_requests=1), the other four queued
    eventually(lambda: set(_started_at(mark)) == set(pids), 10,
               what="one request in flight at each replica")
    os.kill(pids[0], signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(statuses).count(200) >= 5, statuses  # only the one in flight may fail
    assert all(s in (200, 500) for s in statuses), statuses
    serve.delete("queued")


@serve.deployment(health_check_period_s=0.2, health_check_timeout_s=1)
class Fragile:
    def __init__(self) -> None:
        self.broken = False

    def break_me(self) -> int:
        self.broken = True
        return os.getpid()

    def check_health(self) -> None:
        if self.broken:
            raise RuntimeError("broken on purpose")

    def __call__(self) -> int:
        return os.getpid()


def test_failing_health_check_replaces_replica(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Fragile.bind(), name="fragile", route_prefix=None)
    broken_pid = handle.break_me.remote().result(timeout_s=10)
    eventually(lambda: not alive(broken_pid), 15, interval_s=0.1,
               what="the unhealthy replica stopped")
    assert handle.remote().result(timeout_s=15) != broken_pid
    serve.delete("fragile")


DRIVER = textwrap.dedent("""
    import os, sys, time
    from surge import serve

    @serve.deployment(ray_actor_options={{"num_gpus": {gpus},
                                         "runtime_env": {{"env_vars": {{"MY_FLAG": "on"}}}}}})
    class Env:
        def __call__(self):
            return {{"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                     "flag": os.environ.get("MY_FLAG")}}

    serve.start(http_options={{"port": {http_port}}})
    handle = serve.run(Env.bind(), name="env", route_prefix="/env")
    print("RESULT", handle.remote().result(timeout_s=30), flush=True)
    print("READY", flush=True)
    {tail}
""")


def _finish(process: subprocess.Popen[str], timeout: float = 30) -> None:
    process.wait(timeout=timeout)
    if process.stdout is not None:
        process.stdout.close()


def _start_driver(tmp_path: Path, tail: str, env: dict[str, str] | None = None,
                  gpus: float = 0) -> tuple[subprocess.Popen[str], str, dict[str, str]]:
    script = tmp_path / "driver.py"
    http_port = free_port()
    script.write_text(DRIVER.format(http_port=http_port, tail=tail, gpus=gpus))
    full_env = dict(os.environ, SURGE_ADDRESS=f"127.0.0.1:{free_port()}", **(env or {}))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=full_env)
    assert process.stdout is not None
    result = ""
    for line in process.stdout:
        if line.startswith("RESULT"):
            result = line
        if line.startswith("READY"):
            break
    return process, result, full_env


@pytest.mark.parametrize("how", ["exit", "sigint", "sigterm", "sigkill"])
def test_no_orphans(tmp_path: Path, how: str) -> None:
    tail = "time.sleep(1.5)" if how == "exit" else "time.sleep(60)"
    process, _, _ = _start_driver(tmp_path, tail)
    wanted = {"surge:controller", "surge:proxy", "surge:replica:env:Env"}
    children = eventually(
        lambda: (found := list(surge_processes(process.pid)))
        and {title(pid) for pid in found} >= wanted and found, 10,
        what=f"the driver's children titled {sorted(wanted)}")
    sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
    if how != "exit":
        process.send_signal(sig[how])
    _finish(process)
    # how the driver ended: a normal exit; Ctrl-C's KeyboardInterrupt (Python re-raises
    # SIGINT); surge's SIGTERM handler exits 128 + 15 after shutting down; killed
    expected = {"exit": 0, "sigint": -signal.SIGINT, "sigterm": 128 + signal.SIGTERM,
                "sigkill": -signal.SIGKILL}
    assert process.returncode == expected[how]
    eventually(lambda: not [pid for pid in children if alive(pid)], 15,
               what="every child of the driver gone")


def test_gpus_and_env_vars_reach_the_replica(tmp_path: Path) -> None:
    process, result, _ = _start_driver(tmp_path, "", env={"CUDA_VISIBLE_DEVICES": "3,5"},
                                       gpus=1)
    _finish(process)
    assert "'flag': 'on'" in result
    assert "'cuda': '3'" in result


def test_second_process_uses_the_running_instance(tmp_path: Path) -> None:
    process, _, env = _start_driver(tmp_path, "time.sleep(60)")
    try:
        code = textwrap.dedent("""
            from surge import serve
            handle = serve.get_app_handle("env")
            print(handle.remote().result(timeout_s=10)["flag"])
            print(sorted(serve.status().applications))
        """)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["on", "['env']"]
        controllers = [p for p, t in surge_processes(process.pid).items()
                       if t == "surge:controller"]
        assert len(controllers) == 1
    finally:
        process.send_signal(signal.SIGTERM)
        _finish(process)
