"""The process that starts an instance supervises its controller.

`Supervisor` makes the instance's control token and private state directory, starts
`python -m surge.controller` with its spec (surge.launch) on stdin, and waits for its
ready line. A thread then waits on the controller: if it dies (any exit but a clean
shutdown's 0), the supervisor starts a new one on the same address with `recover`
set; it reloads the checkpoint from the state directory and re-attaches to the proxies
and replicas, which kept serving from their last routes meanwhile. Restarts are
bounded (MAX_RESTARTS within RESTART_WINDOW_S) so a controller that cannot start does
not loop forever.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

from surge.api.start_options import StartOptions, user_sys_path
from surge.clock import SYSTEM
from surge.control_auth import TOKEN_ENV, new_token, publish, user_dir, withdraw
from surge.controller.checkpoint import Checkpoint
from surge.errors import RayServeException
from surge.launch import ControllerProcessSpec, Lifetime, await_ready, encode, start_process

__all__ = ["START_TIMEOUT_S", "Supervisor"]

log = logging.getLogger("surge")

START_TIMEOUT_S = 60.0
# A restart re-imports no user code up front: if it is not ready by then, it is stuck.
RESTART_TIMEOUT_S = 20.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
RESTART_BACKOFF_S = 0.5


class Supervisor:
    def __init__(self, address: str, options: StartOptions | None = None,
                 sys_path: tuple[str, ...] | None = None, detached: bool = False) -> None:
        self.options = options or StartOptions()  # restarts come back with the same
        self.detached = detached  # this process is a detached instance's daemon
        # Where the user's modules are (the caller's, also for a detached instance).
        self.sys_path = user_sys_path() if sys_path is None else sys_path
        self.environment = dict(os.environ)  # as the caller set it up: restarts keep it
        self.token = new_token()
        self.state_dir = tempfile.mkdtemp(prefix="instance-", dir=user_dir())
        self.stopping = False
        self.restarts: collections.deque[float] = collections.deque()
        self.ended = threading.Event()  # the instance is gone for good
        self._closed = threading.Event()
        try:
            self.process, self.ready = self._launch(address, recover=False)
        except BaseException:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            raise
        self.address: str = self.ready["address"]
        publish(self.address, self.token)
        self._thread = threading.Thread(target=self._watch, name="surge-supervisor",
                                        daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return (f"<Supervisor controller pid={self.process.pid} restarts={len(self.restarts)} "
                f"stopping={self.stopping}>")

    def spec(self, address: str, recover: bool) -> ControllerProcessSpec:
        options = self.options
        return ControllerProcessSpec(
            address=address, http=options.http, grpc=options.grpc,
            backend=options.backend.name,
            ray_address=options.backend.ray_address, token=self.token,
            state_dir=self.state_dir, recover=recover,
            lifetime=Lifetime(supervisor_pid=os.getpid(), parent_pid=os.getpid(),
                              detached=self.detached),
            logging=options.logging.resolved(), dashboard=options.dashboard,
            weights=options.weights)

    def _launch(self, address: str,
                recover: bool) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        env = {k: v for k, v in self.environment.items() if k != TOKEN_ENV}  # in the spec
        paths = [p for p in (*self.sys_path, env.get("PYTHONPATH", "")) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        process = start_process([sys.executable, "-m", "surge.controller"],
                                encode(self.spec(address, recover)), env,
                                stdout=subprocess.PIPE, start_new_session=True)
        return process, await_ready(process, RESTART_TIMEOUT_S if recover else START_TIMEOUT_S)

    def _watch(self) -> None:
        try:
            while True:
                code = self.process.wait()
                if self.stopping or code == 0:  # shut down on purpose (here or elsewhere)
                    return
                if not self._may_restart():
                    log.error("the surge controller keeps dying (%d restarts in %.0f s); not "
                              "restarting it again. Proxies and replicas serve from their last "
                              "routes; call serve.shutdown() and start again",
                              MAX_RESTARTS, RESTART_WINDOW_S)
                    return
                log.warning("the surge controller (pid %d) exited with code %s; restarting it",
                            self.process.pid, code)
                try:
                    self.process, _ = self._launch(self.address, recover=True)
                    log.warning("the surge controller is back (pid %d)", self.process.pid)
                except RayServeException as exc:
                    log.error("%s", exc)
                    self._closed.wait(RESTART_BACKOFF_S)
        finally:
            self.ended.set()

    def _may_restart(self) -> bool:
        now = SYSTEM.monotonic()
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW_S:
            self.restarts.popleft()
        self.restarts.append(now)
        return len(self.restarts) <= MAX_RESTARTS

    def close(self) -> None:
        """After the instance shut down: stop what is left of it, forget token and state."""
        self.stopping = True
        self._closed.set()
        self._stop_leftovers()
        withdraw(self.address, self.token)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop_leftovers(self) -> None:
        """Members still running after a shutdown (their controller was down, so nobody
        stopped them) get SIGTERM: they drain and exit."""
        _, members = Checkpoint(self.state_dir).load()
        pids = [int(m["pid"]) for m in members.replicas.values()] + [
            int(pid) for pid in members.proxies.values()]
        for pid in pids:
            if members.is_member(pid):
                log.warning("stopping pid %d, left running by a controller that died", pid)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
