"""A detached instance's supervisor: `python -m surge.api.daemon`, its DaemonSpec on stdin.

`surge start` and `serve.start(detached=True)` start this small process in a session of
its own; it supervises the controller (api/supervisor.py: restarts, leftovers, the token
and the state directory) instead of the calling script, so scripts and the CLI connect,
deploy and exit while the applications keep serving. It prints the controller's ready
line (with its own pid and log file) for the process that started it, then writes only
to its log file, which the controller and every member share. It leaves when the
instance is shut down (`surge shutdown`, serve.shutdown(), Ray's `serve shutdown`), or,
on SIGTERM, shuts the instance down first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from surge.api.start_options import StartOptions, user_sys_path
from surge.api.supervisor import START_TIMEOUT_S, Supervisor
from surge.backends.choice import BackendChoice
from surge.control_auth import user_dir
from surge.errors import RayServeException
from surge.launch import (
    CONTROLLER_ERROR,
    CONTROLLER_READY,
    DaemonSpec,
    await_ready,
    encode,
    read_spec,
    start_process,
)
from surge.process import set_title

__all__ = ["log_path", "start_detached"]


def log_path(address: str, options: StartOptions) -> str:
    """Where a detached instance's processes write: logs_dir, else the user's surge dir."""
    port = address.rpartition(":")[2] or "unix"
    directory = options.logging.resolved().logs_dir or user_dir()
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"surge-instance-{port}.log")


def start_detached(address: str, options: StartOptions) -> dict[str, Any]:
    """Start a detached instance on `address` and return its ready details (address,
    http_address, daemon_pid, log); the daemon runs in a session of its own, so neither
    the caller's exit nor its terminal's Ctrl-C stops it."""
    spec = DaemonSpec(address=address, http=options.http, grpc=options.grpc,
                      backend=options.backend.name,
                      ray_address=options.backend.ray_address, logging=options.logging,
                      dashboard=options.dashboard, weights=options.weights,
                      sys_path=user_sys_path())
    path = log_path(address, options)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*spec.sys_path,
                                                    env.get("PYTHONPATH", "")) if p)
    with open(path, "ab") as log_file:
        process = start_process([sys.executable, "-m", "surge.api.daemon"], encode(spec), env,
                                stdout=subprocess.PIPE, stderr=log_file,
                                start_new_session=True, cwd=os.getcwd())
    try:
        ready = await_ready(process, START_TIMEOUT_S + 5.0)
    except RayServeException as exc:
        raise RayServeException(f"{exc} (log: {path})") from None
    ready["log"] = path
    return ready


def main() -> int:
    set_title("surge:daemon")
    try:
        spec = read_spec(DaemonSpec)
        options = StartOptions(http=spec.http, grpc=spec.grpc,
                               backend=BackendChoice(spec.backend, spec.ray_address),
                               logging=spec.logging, dashboard=spec.dashboard,
                               weights=spec.weights)
        supervisor = Supervisor(spec.address, options, sys_path=spec.sys_path, detached=True)
    except Exception as exc:  # said to the starting process, which raises it
        reason = str(exc).removeprefix("could not start surge: ")  # it says that itself
        print(f"{CONTROLLER_ERROR} {reason}", flush=True)
        return 1
    ready = {**supervisor.ready, "address": supervisor.address, "daemon_pid": os.getpid()}
    print(f"{CONTROLLER_READY} {json.dumps(ready)}", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nobody reads our stdout any more; stderr is the log file

    def stop(signum: int, frame: object) -> None:
        supervisor.stopping = True
        supervisor.process.terminate()  # the controller shuts the instance down

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    supervisor.ended.wait()
    supervisor.process.wait()
    supervisor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
