"""Many fake replicas in one process, each with its own control connection.

    python bench/scale/replica_host.py   (config: one JSON line on stdin, then commands)

A fake replica does what a real one (surge/replica/main.py) says on the control path:
it connects and proves the token (transport.rpc.connect_rpc, as the router runtime
does), says hello as a replica, fetches its spec, "builds" for `startup_s`, reports
ready with a Unix address (as a class without a check_health of its own, so its
telemetry stands for most health checks), answers check_health / reconfigure / drain /
stats, and
pushes its telemetry (surge.observability.Recorder's report, as an idle replica's:
every TELEMETRY_KEEPALIVE_S, checked every second or the `telemetry_interval` pushed,
as the runtime does). Its data path is not there: nobody
routes requests to it.

The backend (bench/scale/backend.py) connects to `socket` and asks for starts, TERMs
and KILLs; exits go back to it as `{"exited": id, "code": c}`. Events for the bench on
stdout: `start` (asked), `ready` (just before replica_started), `failed` (could not
connect: a real replica would exit 1), `crash`, `lost` (a ready replica's connection
ended, not by its own doing) and `killed` (a ready replica the backend KILLed: the
controller failed it). Commands on stdin: `crash` (one ready
replica's connection is cut, as a SIGKILL would: the backend sees exit -9).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench.scale.wire import emit, next_command, read_commands
from surge.observability.recorder import Recorder, TelemetryReport
from surge.policy.cadence import TELEMETRY_INTERVAL_S
from surge.router.runtime import (
    MEMBER_CONNECT_TIMEOUT_S,
    telemetry_quiet,
)
from surge.transport.rpc import RpcPeer, connect_rpc


class FakeReplica:
    def __init__(self, host: Host, replica_id: str, app: str, deployment: str) -> None:
        self.host = host
        self.replica_id = replica_id
        self.recorder = Recorder("replica", replica_id, app, deployment)
        self.peer: RpcPeer | None = None
        self.ready = False
        self.ended = False
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.sent: tuple[float, TelemetryReport] | None = None  # the last telemetry
        self.telemetry_interval_s = TELEMETRY_INTERVAL_S  # or what the controller says

    async def run(self) -> None:
        host = self.host
        try:
            self.peer = await connect_rpc(host.controller, self, token=host.token,
                                          timeout=MEMBER_CONNECT_TIMEOUT_S)
            await self.peer.call("hello", role="replica", pid=os.getpid(),
                                 replica_id=self.replica_id)
            await self.peer.call("replica_spec", replica_id=self.replica_id)
            await asyncio.sleep(host.startup_s)
            emit("ready", id=self.replica_id, t=time.monotonic())
            wanted = await self.peer.call(
                "replica_started", replica_id=self.replica_id, pid=os.getpid(),
                address=f"unix:{host.directory}/{self.replica_id}.sock", node_id="local",
                local_address="", own_health_check=False)  # as a class without one
        except Exception as exc:
            emit("failed", id=self.replica_id, t=time.monotonic(), why=repr(exc))
            self.end(1)
            return
        if not wanted:
            self.end(1)
            return
        self.ready = True
        self.timer = host.loop.call_later(self.telemetry_interval_s, self.telemetry)

    def telemetry(self) -> None:
        if self.ended or self.peer is None:
            return
        report, now = self.recorder.drain({"processing": 0}, user={}), time.monotonic()
        if not telemetry_quiet(report, self.sent, now):  # as surge.router.runtime
            self.peer.push("telemetry", report)
            self.sent = (now, report)
        self.timer = self.host.loop.call_later(self.telemetry_interval_s, self.telemetry)

    def end(self, code: int) -> None:
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        if self.peer is not None:
            transport = self.peer.transport
            if code == -9 and transport is not None:
                transport.abort()
            else:
                self.peer.close()
        self.host.exited(self.replica_id, code)

    # -- RpcHandler ------------------------------------------------------------------

    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any:
        if method == "drain":  # answer, then stop, as a real replica with nothing in flight
            self.host.loop.call_soon(self.end, 0)
            return True
        if method == "stats":
            return {"ongoing": 0, "served": 0}
        if method in ("check_health", "reconfigure"):
            return True
        raise ValueError(f"replica has no RPC method {method!r}")

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None:
        if topic == "telemetry_interval":  # as the runtime: many members report less often
            self.telemetry_interval_s = float(value)

    def on_disconnect(self, peer: RpcPeer) -> None:
        if self.ready and not self.ended:
            emit("lost", id=self.replica_id, t=time.monotonic())
        self.end(1 if not self.ended else 0)


class Host:
    def __init__(self, config: dict[str, Any]) -> None:
        self.loop = asyncio.get_running_loop()
        self.controller: str = config["controller"]
        self.token: str = config["token"]
        self.startup_s: float = config.get("startup_s", 0.2)
        self.directory = os.path.dirname(config["socket"])
        self.replicas: dict[str, FakeReplica] = {}
        self.backend: asyncio.StreamWriter | None = None
        self.socket_path: str = config["socket"]

    async def serve(self, commands: asyncio.StreamReader) -> None:
        server = await asyncio.start_unix_server(self._backend, self.socket_path)
        emit("listening", pid=os.getpid())
        while (command := await next_command(commands)) is not None:
            if command.get("cmd") == "crash":
                ready = [r for r in self.replicas.values() if r.ready and not r.ended]
                if ready:
                    victim = ready[len(ready) // 2]
                    emit("crash", id=victim.replica_id, t=time.monotonic())
                    victim.end(-9)
        server.close()

    async def _backend(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        self.backend = writer
        writer.write((json.dumps({"pid": os.getpid()}) + "\n").encode())
        while True:
            try:
                line = await reader.readline()
            except ConnectionError:  # the controller is gone: the bench ends
                return
            if not line:
                return
            message = json.loads(line)
            if "start" in message:
                replica = FakeReplica(self, message["start"], message["app"],
                                      message["deployment"])
                self.replicas[replica.replica_id] = replica
                emit("start", id=replica.replica_id, t=time.monotonic())
                replica.task = self.loop.create_task(replica.run())
            elif "term" in message or "kill" in message:
                replica_id = message.get("term") or message["kill"]
                target = self.replicas.get(replica_id)
                if target is not None:
                    if "kill" in message and target.ready:
                        emit("killed", id=replica_id, t=time.monotonic())
                    target.end(0 if "term" in message else -9)

    def exited(self, replica_id: str, code: int) -> None:
        self.replicas.pop(replica_id, None)
        if self.backend is not None and not self.backend.is_closing():
            self.backend.write((json.dumps({"exited": replica_id, "code": code}) + "\n").encode())


async def main() -> None:
    commands = await read_commands()
    config = await next_command(commands)
    assert config is not None
    await Host(config).serve(commands)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
