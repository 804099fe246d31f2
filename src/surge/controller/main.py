"""Controller process entry point: `python -m surge.controller`, its spec on stdin.

It reads its `ControllerProcessSpec` (surge.launch), binds the control address, starts
the proxy, and prints one line on stdout for the process that started it:
`surge-controller ready {json}` once HTTP is served, or `surge-controller error MESSAGE`
(then exits 1). SIGTERM shuts everything down cleanly. Connections must prove they know
the spec's token before anything they send is unpickled. With `recover`, it is a restart:
it reloads the checkpoint in the state directory and re-attaches to the previous
controller's proxies and replicas before it starts any.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import ipaddress
import json
import os
import signal
import sys
from collections.abc import Callable

from surge.backends.base import Backend
from surge.backends.choice import BackendChoice, build_backend
from surge.controller.checkpoint import Checkpoint
from surge.controller.controller import Controller
from surge.controller.node_cpu import ProcStatCpu
from surge.controller.recovery import RECOVERY_TIMEOUT_S
from surge.controller.rest import RestApi
from surge.controller.web import start_dashboard
from surge.errors import ConfigError
from surge.launch import (
    CONTROLLER_ERROR,
    CONTROLLER_READY,
    ControllerProcessSpec,
    Membership,
    read_spec,
)
from surge.observability.logs import configure_logging
from surge.process import die_with_parent, raise_fd_limit, set_title
from surge.transport.gate import HandshakeGate
from surge.transport.rpc import RpcPeer, split_address

PROXY_START_TIMEOUT_S = 60.0
# Connections the kernel holds for the controller before it accepts them: a herd of
# members connecting at once must not have SYNs dropped (retried after 1 s, 3 s, ...).
CONTROL_BACKLOG = 4096
READY, ERROR = CONTROLLER_READY, CONTROLLER_ERROR

# Builds the backend from the spec and what members are told; the default is the
# spec's choice (`bench/control_scale.py` passes its own, whose members are fakes).
BackendFactory = Callable[[ControllerProcessSpec, Membership], Backend]


def spec_backend(spec: ControllerProcessSpec, membership: Membership) -> Backend:
    return build_backend(BackendChoice(spec.backend, spec.ray_address), membership,
                         spec.state_dir, spec.weights)


def announce(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def serve(spec: ControllerProcessSpec,
                backend_factory: BackendFactory = spec_backend) -> int:
    loop = asyncio.get_running_loop()
    host, port = split_address(spec.address)
    holder: list[Controller] = []
    try:
        gate = HandshakeGate()  # a herd's handshakes, a few at a time, in order
        server = await loop.create_server(lambda: RpcPeer(holder[0], spec.token, gate), host,
                                          port, reuse_address=True, backlog=CONTROL_BACKLOG)
    except OSError as exc:
        announce(f"{ERROR} cannot listen on control address {spec.address}: "
                 f"{exc.strerror or exc}; set SURGE_ADDRESS to a free host:port")
        return 1
    bound = f"{host}:{server.sockets[0].getsockname()[1]}"
    try:
        backend = backend_factory(spec, spec.membership(bound))
    except ConfigError as exc:
        announce(f"{ERROR} {exc}")
        server.close()
        return 1
    # The controller runs on the head node: it reads that node's CPU (node_cpu.py).
    controller = Controller(bound, spec.http, backend, Checkpoint(spec.state_dir),
                            grpc=spec.grpc, node_cpu=ProcStatCpu())
    holder.append(controller)
    if spec.lifetime.detached:
        controller.state.daemon_pid = spec.lifetime.supervisor_pid
    if spec.recover:
        controller.restore()
    loop.add_signal_handler(signal.SIGTERM, lambda: controller.spawn(controller.shutdown()))
    runner = loop.create_task(controller.run())
    try:
        # A restart serves on without it rather than not at all.
        options = dataclasses.replace(spec.dashboard, required=False) if spec.recover \
            else spec.dashboard
        dashboard = await start_dashboard(controller.observer, options,
                                          _rest_api(controller, spec))
    except OSError as exc:  # a dashboard (and REST API) address asked for is taken
        announce(f"{ERROR} cannot serve the dashboard on {spec.dashboard.host}:"
                 f"{spec.dashboard.port}: {exc.strerror or exc}; choose another "
                 "dashboard port")
        runner.cancel()
        await controller.shutdown()
        server.close()
        return 1
    await asyncio.wait_for(controller.recovery.done.wait(), RECOVERY_TIMEOUT_S + 5.0)
    code = 0
    if not controller.state.stopping:  # not shut down while it recovered
        code = await _start_proxies(controller, spec, bound)
    if code == 0:
        await controller.stopped.wait()
    runner.cancel()
    if dashboard is not None:
        dashboard.close()
    server.close()
    return code


def _rest_api(controller: Controller, spec: ControllerProcessSpec) -> RestApi:
    """Ray's REST API; its token is Ray's RAY_AUTH_TOKEN when set (Ray's CLI and KubeRay
    send it), else the instance's control token. It is required off loopback, and
    everywhere with RAY_AUTH_MODE=token, as Ray's token authentication."""
    try:
        loopback = ipaddress.ip_address(spec.dashboard.host).is_loopback
    except ValueError:
        loopback = spec.dashboard.host == "localhost"
    forced = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    return RestApi(controller.state, clock=controller.clock, controller_pid=os.getpid(),
                   token=os.environ.get("RAY_AUTH_TOKEN") or spec.token,
                   control_token=spec.token,
                   require_token=forced or not loopback,
                   shutdown=lambda: controller.spawn(controller.shutdown()))


async def _start_proxies(controller: Controller, spec: ControllerProcessSpec,
                         bound: str) -> int:
    """Start serving HTTP (unless proxies are disabled); announce ready or the error."""
    state = controller.state
    if spec.http.location not in ("Disabled", "NoServer"):
        controller.serve_http()
        try:
            await asyncio.wait_for(controller.proxy_ready.wait(), PROXY_START_TIMEOUT_S)
        except TimeoutError:
            state.proxy_error = "the proxy did not start within 60 s"
        if state.proxy_error:
            announce(f"{ERROR} {state.proxy_error}")
            await controller.shutdown()
            return 1
    announce(f"{READY} " + json.dumps({"address": bound, "http_address": state.proxy_address,
                                       "dashboard_address": controller.observer.url,
                                       "pid": os.getpid()}))
    return 0


def main(backend_factory: BackendFactory = spec_backend, spec_line: bytes | None = None
         ) -> int:
    """The controller process; `spec_line`: its spec's line, if its caller read it."""
    set_title("surge:controller")
    try:
        spec = read_spec(ControllerProcessSpec,
                         None if spec_line is None else io.BytesIO(spec_line))
    except ConfigError as exc:
        announce(f"{ERROR} {exc}")
        return 2
    raise_fd_limit()
    die_with_parent(spec.lifetime.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver owns Ctrl-C
    configure_logging("controller", config=spec.logging)
    import uvloop

    code: int = uvloop.run(serve(spec, backend_factory))
    return code
