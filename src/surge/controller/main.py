"""Controller process entry point: `python -m surge.controller ADDRESS OPTIONS_JSON`.

Binds the control address, starts the proxy, and prints one line on stdout for the
process that started it: `SURGE_READY {json}` once HTTP is served, or
`SURGE_ERROR message` (then exits 1). SIGTERM shuts everything down cleanly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

from surge.backends.local import LocalBackend
from surge.config import HTTPOptions
from surge.controller.controller import Controller
from surge.process import die_with_parent, raise_fd_limit, set_title
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
    try:
        server = await loop.create_server(lambda: RpcPeer(holder[0]), host, port,
                                          reuse_address=True)
    except OSError as exc:
        announce(f"SURGE_ERROR cannot listen on control address {address}: "
                 f"{exc.strerror or exc}; set SURGE_ADDRESS to a free host:port")
        return 1
    bound = f"{host}:{server.sockets[0].getsockname()[1]}"
    controller = Controller(bound, http, LocalBackend(bound))
    holder.append(controller)
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(controller.shutdown()))
    runner = loop.create_task(controller.run())
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
                                          "pid": os.getpid()}))
    await controller.stopped.wait()
    runner.cancel()
    server.close()
    return 0


def main(argv: list[str]) -> int:
    address, options = argv[0], json.loads(argv[1])
    set_title("surge:controller")
    raise_fd_limit()
    die_with_parent(int(os.environ.get("SURGE_PARENT_PID", "0")))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver owns Ctrl-C
    logging.basicConfig(level=os.environ.get("SURGE_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s controller %(name)s: %(message)s")
    import uvloop

    code: int = uvloop.run(serve(address, HTTPOptions(**options)))
    return code
