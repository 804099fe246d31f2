"""Replica process entry point: `python -m surge.replica CONTROLLER REPLICA_ID APP DEPLOYMENT`.

Fetches its spec from the controller, builds the user object, listens on a loopback
port and reports ready. It drains on SIGTERM or when the controller asks, and exits
when the controller goes away (its replicas would otherwise be orphans).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
import traceback
from typing import Any

import cloudpickle

from surge.model import ImportedTarget, ReplicaSpec
from surge.process import die_with_parent, raise_fd_limit, set_title
from surge.replica.context import ReplicaContext, ReplicaID, set_replica_context
from surge.replica.server import ReplicaServer
from surge.replica.user_code import UserCode
from surge.router.runtime import RouterRuntime, set_runtime

log = logging.getLogger("surge.replica")


def resolve_target(target: Any) -> Any:
    """The user's class or function, importing it when it was sent by name."""
    if not isinstance(target, ImportedTarget):
        return target
    found: Any = importlib.import_module(target.module)
    for part in target.qualname.split("."):
        found = getattr(found, part)
    return getattr(found, "func_or_class", found)


class Replica:
    def __init__(self, controller: str, replica_id: str) -> None:
        self.replica_id = replica_id
        self.stop = asyncio.Event()
        self.server: ReplicaServer | None = None
        self.user: UserCode | None = None
        self.spec: ReplicaSpec | None = None
        self.runtime = RouterRuntime(
            controller, "replica", hello={"replica_id": replica_id},
            rpc_methods={"check_health": self.check_health, "reconfigure": self.reconfigure,
                         "drain": self.drain, "stats": self.stats})
        self.runtime.on_controller_lost = self.stop.set
        set_runtime(self.runtime)

    async def check_health(self) -> bool:
        assert self.user is not None
        await self.user.call_optional("check_health")
        return True

    async def reconfigure(self, user_config: Any) -> bool:
        assert self.user is not None
        await self.user.call_optional("reconfigure", user_config)
        return True

    async def drain(self, timeout_s: float) -> bool:
        finished = await self.server.drain(timeout_s) if self.server is not None else True
        self.stop.set()
        return finished

    async def stats(self) -> dict[str, Any]:
        server = self.server
        if server is None:
            return {"ongoing": 0, "served": 0}
        return {"ongoing": server.ongoing, "served": server.served}

    async def build(self) -> bool:
        self.spec = spec = await self.runtime.call("replica_spec", replica_id=self.replica_id)
        for entry in reversed(spec.sys_path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        try:
            target = resolve_target(cloudpickle.loads(spec.target_blob))
            args, kwargs = cloudpickle.loads(spec.init_blob)
            self.user = UserCode(target, args, kwargs, spec.max_ongoing_requests)
            replica = ReplicaID(self.replica_id, spec.deployment.name, spec.deployment.app)
            set_replica_context(ReplicaContext(replica, None))
            await self.user.construct()
            set_replica_context(ReplicaContext(replica, self.user.servable))
            if spec.user_config is not None:
                if not await self.user.call_optional("reconfigure", spec.user_config):
                    raise TypeError("user_config is set but the deployment has no "
                                    "reconfigure(self, config) method")
        except Exception:
            error = traceback.format_exc()
            log.error("replica %s failed to start:\n%s", self.replica_id, error)
            await self.runtime.call("replica_failed", replica_id=self.replica_id, error=error)
            return False
        return True

    async def serve(self) -> int:
        await self.runtime.connect()
        if not await self.build():
            return 1
        assert self.spec is not None and self.user is not None
        name = f"{self.spec.deployment.app}:{self.spec.deployment.name}"
        self.server = ReplicaServer(self.user, self.spec.max_ongoing_requests, name)
        loop = asyncio.get_running_loop()
        listener, address = await self._listen()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        await self.runtime.call("replica_ready", replica_id=self.replica_id,
                                address=address, pid=os.getpid())
        await self.stop.wait()
        if not self.server.draining:
            await self.server.drain(self.spec.graceful_shutdown_timeout_s)
        listener.close()
        if address.startswith("unix:"):
            with contextlib.suppress(OSError):
                os.unlink(address[5:])
        self.user.close()
        self.runtime.close()
        return 0

    async def _listen(self) -> tuple[asyncio.Server, str]:
        """A Unix socket when the backend gave us a directory (same host), else TCP."""
        assert self.server is not None
        loop = asyncio.get_running_loop()
        socket_dir = os.environ.get("SURGE_SOCKET_DIR")
        if socket_dir:
            path = os.path.join(socket_dir, f"{self.replica_id}.sock")
            with contextlib.suppress(OSError):
                os.unlink(path)
            listener = await loop.create_unix_server(self.server.protocol, path, backlog=4096)
            return listener, f"unix:{path}"
        listener = await loop.create_server(self.server.protocol, "127.0.0.1", 0, backlog=4096)
        return listener, f"127.0.0.1:{listener.sockets[0].getsockname()[1]}"

    def _on_sigterm(self) -> None:
        if self.server is not None and self.spec is not None:
            asyncio.get_running_loop().create_task(
                self.drain(self.spec.graceful_shutdown_timeout_s))
        else:
            self.stop.set()


def main(argv: list[str]) -> int:
    controller, replica_id, app, deployment = argv[:4]
    parent = int(os.environ.get("SURGE_PARENT_PID", "0"))
    set_title(f"surge:replica:{app}:{deployment}")
    raise_fd_limit()
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    logging.basicConfig(level=os.environ.get("SURGE_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s %(levelname)s replica {app}:{deployment} "
                               "%(name)s: %(message)s")
    import uvloop

    async def run() -> int:
        return await Replica(controller, replica_id).serve()

    code: int = uvloop.run(run())
    return code
