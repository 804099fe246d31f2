"""This process's connection to a surge instance: find one, or start one.

`connect_or_start` first looks for a running instance at the control address
(SURGE_ADDRESS, or 127.0.0.1:52800); if none answers it starts the controller as a
child process (which starts the proxy) under a `Supervisor` that restarts it if it
dies. The process that started an instance shuts it down at exit, on SIGTERM and on
Ctrl-C. A detached instance (`surge start`, serve.start(detached=True)) is supervised
by a daemon of its own instead (api/daemon.py): this process only connects to it, and
leaving does not stop it. docs/operations.md tells the whole lifecycle.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from surge.api.start_options import StartOptions, user_sys_path
from surge.clock import SYSTEM
from surge.config import DEFAULT_CONTROL_PORT
from surge.errors import ControllerUnavailableError
from surge.router.runtime import BackgroundLoop, RouterRuntime, set_runtime, set_runtime_factory

if TYPE_CHECKING:
    from surge.api.supervisor import Supervisor

__all__ = ["Instance", "StartOptions", "connect_or_start", "control_address", "current",
           "disconnect", "user_sys_path"]

log = logging.getLogger("surge")

SHUTDOWN_TIMEOUT_S = 60.0
DAEMON_EXIT_TIMEOUT_S = 10.0  # its controller is gone: it only cleans up and exits


def control_address() -> str:
    return os.environ.get("SURGE_ADDRESS") or f"127.0.0.1:{DEFAULT_CONTROL_PORT}"


class Instance:
    def __init__(self, address: str, loop: BackgroundLoop, runtime: RouterRuntime,
                 supervisor: Supervisor | None, hello: dict[str, Any]) -> None:
        self.address = address
        self.loop = loop
        self.runtime = runtime
        self.supervisor = supervisor  # set when this process started the instance
        self.http_address: str = hello.get("http_address", "")
        self.daemon_pid: int = hello.get("daemon_pid") or 0  # a detached instance's
        self.log_file = ""  # where a detached instance started here writes
        self.hello = hello  # what the controller told us when we joined

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The controller process, when this process started the instance."""
        return self.supervisor.process if self.supervisor is not None else None

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


def connect_or_start(options: StartOptions | None = None, *, start: bool = True,
                     detached: bool = False) -> Instance:
    """The running instance at the control address, or (with `start`) a new one: owned by
    this process, or `detached` (it outlives this process; `surge shutdown` stops it)."""
    global _instance
    with _lock:
        if _instance is not None:
            return _instance
        address = control_address()
        loop = BackgroundLoop("surge-driver")
        try:
            _instance = _connect(address, loop, None)
            _install_exit_hooks()
            # Said where a script sees it (a warning) when it asked to start or run: it may
            # be deploying into, and its serve.shutdown() stopping, someone else's instance.
            log.log(logging.WARNING if start else logging.INFO, "%s",
                    joined_message(address, _instance.hello, options is not None))
        except ControllerUnavailableError:
            if not start:
                loop.stop()
                raise
            if detached:
                from surge.api.daemon import start_detached  # runs as __main__ too

                try:
                    ready = start_detached(address, options or StartOptions())
                    _instance = _connect(ready["address"], loop, None)
                    _instance.log_file = ready["log"]
                except BaseException:
                    loop.stop()
                    raise
                log.info("started a detached surge instance at %s (daemon pid %d, log %s); "
                         "`surge shutdown` stops it", ready["address"], ready["daemon_pid"],
                         ready["log"])
                _install_exit_hooks()
                return _instance
            from surge.api.supervisor import Supervisor  # only a process that starts one

            supervisor: Supervisor | None = None
            try:
                supervisor = Supervisor(address, options)
                _instance = _connect(supervisor.address, loop, supervisor)
            except BaseException:
                loop.stop()
                if supervisor is not None:
                    supervisor.close()
                raise
            _install_exit_hooks()
        return _instance


def joined_message(address: str, hello: dict[str, Any], options_given: bool) -> str:
    """What a driver that joined an instance it did not start logs: where, and whose."""
    by = hello.get("started_by") or {}
    age = time.time() - hello.get("started_at", time.time())
    who = (f"; started {age:.0f} s ago by {by.get('user', '?')} (pid {by.get('pid', '?')}: "
           f"{by.get('command') or '?'})" if by else "")
    note = "; its options stay as they are (serve.shutdown() stops it)" if options_given else ""
    return (f"joined the surge instance already running at {address} (controller pid "
            f"{hello.get('controller_pid', '?')}{who}){note}; set SURGE_ADDRESS to start or "
            "join another")


def _connect(address: str, loop: BackgroundLoop, supervisor: Supervisor | None) -> Instance:
    async def make() -> tuple[RouterRuntime, dict[str, Any]]:
        runtime = RouterRuntime(address, "driver")
        await runtime.connect()
        assert runtime.peer is not None
        hello = await runtime.peer.call("hello", role="driver", pid=os.getpid())
        return runtime, hello

    runtime, hello = loop.run(make(), timeout=10)
    set_runtime(runtime)
    return Instance(address, loop, runtime, supervisor, hello)


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
    """An instance this process owns stops with it; from any other, it only disconnects
    (its event loop thread stops before the interpreter tears down under it)."""
    if _instance is not None:
        disconnect(shutdown=_instance.process is not None)


def disconnect(shutdown: bool) -> None:
    """Leave the instance; with `shutdown`, stop it and wait for its processes to exit."""
    global _instance
    with _lock:
        instance, _instance = _instance, None
        if instance is None:
            return
        if shutdown:
            if instance.supervisor is not None:
                instance.supervisor.stopping = True
            instance.runtime.expect_disconnect()
            try:
                instance.call("shutdown", timeout=10)
            except Exception as exc:
                log.debug("shutdown call failed: %r", exc)
            _wait_gone(instance)
            if instance.supervisor is not None:
                instance.supervisor.close()
        instance.loop.run(_close(instance.runtime), timeout=5)
        instance.loop.stop()
        set_runtime(None)


async def _close(runtime: RouterRuntime) -> None:
    runtime.close()


def _wait_gone(instance: Instance) -> None:
    process = instance.process
    if process is not None:
        try:
            process.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return
    peer = instance.runtime.peer
    if peer is not None:  # another process's instance: its controller is gone when the
        instance.loop.run(_closed(peer), timeout=SHUTDOWN_TIMEOUT_S + 1.0)  # link closes
    if instance.daemon_pid and instance.daemon_pid != os.getpid():
        _wait_pid_gone(instance.daemon_pid, DAEMON_EXIT_TIMEOUT_S)


def _wait_pid_gone(pid: int, timeout: float) -> None:
    """Until process `pid` (a detached instance's daemon, which leaves last) is gone."""
    deadline = SYSTEM.monotonic() + timeout
    while SYSTEM.monotonic() < deadline:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)  # our child: started here, detached
            if reaped:
                return
        except ChildProcessError:  # not ours: it is gone when signal 0 finds nobody
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.05)
    log.warning("the detached instance's daemon (pid %d) is still running after %.0f s",
                pid, timeout)


async def _closed(peer: Any) -> None:
    try:
        await asyncio.wait_for(peer.disconnected.wait(), SHUTDOWN_TIMEOUT_S)
    except TimeoutError:
        log.warning("the surge instance did not close its connection within %.0f s",
                    SHUTDOWN_TIMEOUT_S)


set_runtime_factory(lambda: connect_or_start(start=False).runtime)
