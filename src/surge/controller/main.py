"""Controller process entry point: `python -m surge.controller ADDRESS OPTIONS_JSON`.

Binds the control address, starts the proxy, and prints one line on stdout for the
process that started it: `SURGE_READY {json}` once HTTP is served, or
`SURGE_ERROR message` (then exits 1). SIGTERM shuts everything down cleanly.
Connections must present SURGE_CONTROL_TOKEN first when it is set. With SURGE_RECOVER=1
it is a restart: it reloads the checkpoint in SURGE_STATE_DIR and re-attaches to the
previous controller's proxies and replicas before it starts any.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

from surge.backends.choice import BackendChoice, build_backend
from surge.config import HTTPOptions
from surge.control_auth import TOKEN_ENV
from surge.controller.checkpoint import Checkpoint
from surge.controller.controller import Controller
from surge.controller.recovery import RECOVERY_TIMEOUT_S
from surge.controller.web import DashboardServer, start_dashboard
from surge.errors import ConfigError
from surge.observability.config import DashboardOptions
from surge.observability.logs import configure_logging
from surge.process import STATE_DIR_ENV, die_with_parent, raise_fd_limit, set_title
from surge.transport.rpc import RpcPeer, split_address

log = logging.getLogger("surge.controller")

PROXY_START_TIMEOUT_S = 60.0


def announce(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def serve(address: str, http: HTTPOptions) -> int:
    loop = asyncio.get_running_loop()
    host, port = split_address(address)
    holder: list[Controller] = []
    token = os.environ.get(TOKEN_ENV) or None
    try:
        server = await loop.create_server(lambda: RpcPeer(holder[0], token), host, port,
                                          reuse_address=True)
    except OSError as exc:
        announce(f"SURGE_ERROR cannot listen on control address {address}: "
                 f"{exc.strerror or exc}; set SURGE_ADDRESS to a free host:port")
        return 1
    bound = f"{host}:{server.sockets[0].getsockname()[1]}"
    try:  # SURGE_BACKEND: set by the process that started the instance (backends/choice.py)
        backend = build_backend(BackendChoice.from_env(os.environ), bound, http)
    except ConfigError as exc:
        announce(f"SURGE_ERROR {exc}")
        server.close()
        return 1
    controller = Controller(bound, http, backend,
                            Checkpoint(os.environ.get(STATE_DIR_ENV)))
    holder.append(controller)
    if os.environ.get("SURGE_RECOVER") == "1":
        controller.recovery.restore()
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(controller.shutdown()))
    runner = loop.create_task(controller.run())
    dashboard = await _dashboard(controller)
    if controller.recovery.active:
        await asyncio.wait_for(controller.recovery.done.wait(), RECOVERY_TIMEOUT_S + 5.0)
    if controller.stopping:  # shut down while it recovered
        await controller.stopped.wait()
        if dashboard is not None:
            dashboard.close()
        server.close()
        return 0
    if http.location not in ("Disabled", "NoServer"):
        controller.start_proxies()
        try:
            await asyncio.wait_for(controller.proxy_ready.wait(), PROXY_START_TIMEOUT_S)
        except TimeoutError:
            controller.proxy_error = "the proxy did not start within 60 s"
        if controller.proxy_error:
            announce(f"SURGE_ERROR {controller.proxy_error}")
            await controller.shutdown()
            return 1
    announce("SURGE_READY " + json.dumps({"address": bound,
                                          "http_address": controller.proxy_address,
                                          "dashboard_address": controller.observer.url,
                                          "pid": os.getpid()}))
    await controller.stopped.wait()
    runner.cancel()
    if dashboard is not None:
        dashboard.close()
    server.close()
    return 0


async def _dashboard(controller: Controller) -> DashboardServer | None:
    try:
        options = DashboardOptions.from_env()
    except ConfigError as exc:
        log.warning("%s; the dashboard is off", exc)
        return None
    return await start_dashboard(controller, options)


def main(argv: list[str]) -> int:
    address, options = argv[0], json.loads(argv[1])
    set_title("surge:controller")
    raise_fd_limit()
    die_with_parent(int(os.environ.get("SURGE_PARENT_PID", "0")))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver owns Ctrl-C
    configure_logging("controller")
    import uvloop

    code: int = uvloop.run(serve(address, HTTPOptions(**options)))
    return code
