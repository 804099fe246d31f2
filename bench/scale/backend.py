"""The backend of the scale bench: replicas are started inside replica-host processes.

It has the shape of every surge backend (surge/backends/base.py) and lives in the
controller process, where bench/scale/controller_main.py hands it to the controller.
Each replica host (bench/scale/replica_host.py, started by the bench before the
controller) listens on a Unix socket; this backend connects to each, sends it one JSON
line per start, TERM and KILL, and reads back `{"exited": id, "code": c}` when one of
its fake replicas ends. A replica's pid is its host's pid (signals go through the
host, never to a pid). Replicas are spread over the hosts, fewest first.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping

from surge.backends.base import LOCAL_PLACEMENT, Exit, Placement, ProxyLaunch, ReplicaLaunch

__all__ = ["HostBackend"]


class _Host:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buffer = b""
        hello = self._line_blocking()
        self.pid = int(json.loads(hello)["pid"])
        self.replicas = 0

    def _line_blocking(self) -> bytes:
        while b"\n" not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the replica host closed its socket")
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def send(self, message: dict[str, str]) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def lines(self) -> list[bytes]:
        while True:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not data:
                break
            self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line for line in lines if line.strip()]


class HostBackend:
    name = "scale-bench"
    head = LOCAL_PLACEMENT
    deaths_visible_at_once = True

    def __init__(self, sockets: list[str]) -> None:
        self.hosts = [_Host(path) for path in sockets]
        self.live: dict[str, _Host] = {}

    def __repr__(self) -> str:
        return f"<HostBackend hosts={len(self.hosts)} live={len(self.live)}>"

    def start_replica(self, launch: ReplicaLaunch) -> int:
        host = min(self.hosts, key=lambda h: h.replicas)
        host.send({"start": launch.replica_id, "app": launch.deployment.app,
                   "deployment": launch.deployment.name})
        host.replicas += 1
        self.live[launch.replica_id] = host
        return host.pid

    def start_proxy(self, launch: ProxyLaunch) -> int:
        raise NotImplementedError("the scale bench runs without proxies (routers are fakes)")

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0) -> None:
        pass  # the bench never restarts its controller

    def terminate(self, process_id: str) -> None:
        self._signal(process_id, "term")

    def kill(self, process_id: str) -> None:
        self._signal(process_id, "kill")

    def _signal(self, process_id: str, how: str) -> None:
        host = self.live.get(process_id)
        if host is not None:
            host.send({how: process_id})

    def poll_exits(self) -> list[Exit]:
        exits = []
        for host in self.hosts:
            for line in host.lines():
                message = json.loads(line)
                if self.live.pop(message["exited"], None) is not None:
                    host.replicas -= 1
                exits.append(Exit(message["exited"], int(message["code"])))
        return exits

    def alive(self) -> list[str]:
        return list(self.live)

    def placements(self) -> Mapping[str, Placement]:
        return {}

    def close(self) -> None:
        for host in self.hosts:
            host.sock.close()
