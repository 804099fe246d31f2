"""This process's connection to a surge instance: find one, or start one.

`connect_or_start` first looks for a running instance at the control address
(SURGE_ADDRESS, or 127.0.0.1:52800); if none answers it starts the controller as a
child process (which starts the proxy) and waits for its `SURGE_READY` line. The
process that started an instance shuts it down at exit, on SIGTERM and on Ctrl-C.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any

from surge.config import DEFAULT_CONTROL_PORT, HTTPOptions
from surge.errors import ControllerUnavailableError, RayServeException
from surge.router.runtime import BackgroundLoop, RouterRuntime, set_runtime, set_runtime_factory

__all__ = ["Instance", "connect_or_start", "control_address", "current", "disconnect"]

log = logging.getLogger("surge")

START_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 60.0


def control_address() -> str:
    return os.environ.get("SURGE_ADDRESS") or f"127.0.0.1:{DEFAULT_CONTROL_PORT}"


class Instance:
    def __init__(self, address: str, loop: BackgroundLoop, runtime: RouterRuntime,
                 process: subprocess.Popen[bytes] | None, http_address: str) -> None:
        self.address = address
        self.loop = loop
        self.runtime = runtime
        self.process = process
        self.http_address = http_address

    def __repr__(self) -> str:
        owned = f" pid={self.process.pid}" if self.process else ""
        return f"<surge instance {self.address} http={self.http_address}{owned}>"

    def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any:
        return self.loop.run(self.runtime.call(method, **kwargs), timeout)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        return self.loop.run(coro, timeout)


_instance: Instance | None = None
_lock = threading.RLock()


def current() -> Instance | None:
    return _instance


def connect_or_start(http_options: HTTPOptions | None = None, *,
                     start: bool = True) -> Instance:
    global _instance
    with _lock:
        if _instance is not None:
            return _instance
        address = control_address()
        loop = BackgroundLoop("surge-driver")
        try:
            _instance = _connect(address, loop, None)
            if http_options is not None:
                log.info("connected to the running surge instance at %s; its HTTP options "
                         "stay as they are", address)
        except ControllerUnavailableError:
            if not start:
                loop.stop()
                raise
            try:
                process, ready = _start_controller(address, http_options or HTTPOptions())
                _instance = _connect(ready["address"], loop, process)
            except BaseException:
                loop.stop()
                raise
            _install_exit_hooks()
        return _instance


def _connect(address: str, loop: BackgroundLoop,
             process: subprocess.Popen[bytes] | None) -> Instance:
    async def make() -> tuple[RouterRuntime, dict[str, Any]]:
        runtime = RouterRuntime(address, "driver")
        await runtime.connect()
        assert runtime.peer is not None
        hello = await runtime.peer.call("hello", role="driver", pid=os.getpid())
        return runtime, hello

    runtime, hello = loop.run(make(), timeout=10)
    set_runtime(runtime)
    return Instance(address, loop, runtime, process, hello.get("http_address", ""))


def _start_controller(address: str,
                      http: HTTPOptions) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    options = {k: getattr(http, k) for k in http.__dataclass_fields__}
    env = dict(os.environ)
    paths = [p for p in (*user_sys_path(), env.get("PYTHONPATH", "")) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["SURGE_PARENT_PID"] = str(os.getpid())
    process = subprocess.Popen(
        [sys.executable, "-m", "surge.controller", address, json.dumps(options)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    assert process.stdout is not None
    line = _read_line(process, START_TIMEOUT_S)
    process.stdout.close()
    if line.startswith("SURGE_READY "):
        ready: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        return process, ready
    process.kill()
    process.wait()
    reason = line.split(" ", 1)[1] if line.startswith("SURGE_ERROR ") else (
        line or "the controller exited without saying why (see its log above)")
    raise RayServeException(f"could not start surge: {reason}")


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
        elif process.poll() is not None:
            break
    return data.decode(errors="replace").split("\n", 1)[0].strip()


def user_sys_path() -> tuple[str, ...]:
    """Where the user's modules live, so replicas can import them by reference."""
    main = sys.modules.get("__main__")
    entries = [os.getcwd()]
    main_file = getattr(main, "__file__", None)
    if main_file:
        entries.insert(0, os.path.dirname(os.path.abspath(main_file)))
    entries += [p for p in sys.path if p and os.path.isdir(p) and "site-packages" not in p
                and not p.startswith(sys.base_prefix)]
    return tuple(dict.fromkeys(entries))


_hooks_installed = False


def _install_exit_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_shutdown_at_exit)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _shutdown_at_exit() -> None:
    if _instance is not None and _instance.process is not None:
        disconnect(shutdown=True)


def disconnect(shutdown: bool) -> None:
    """Leave the instance; with `shutdown`, stop it and wait for its processes to exit."""
    global _instance
    with _lock:
        instance, _instance = _instance, None
        if instance is None:
            return
        if shutdown:
            instance.runtime.expect_disconnect()
            try:
                instance.call("shutdown", timeout=10)
            except Exception as exc:
                log.debug("shutdown call failed: %r", exc)
            _wait_gone(instance)
        instance.loop.run(_close(instance.runtime), timeout=5)
        instance.loop.stop()
        set_runtime(None)


async def _close(runtime: RouterRuntime) -> None:
    runtime.close()


def _wait_gone(instance: Instance) -> None:
    if instance.process is not None:
        try:
            instance.process.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(instance.process.pid, signal.SIGKILL)
            instance.process.wait()
        return
    deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
    peer = instance.runtime.peer
    while peer is not None and not peer.is_closed and time.monotonic() < deadline:
        time.sleep(0.05)


set_runtime_factory(lambda: connect_or_start(start=False).runtime)
