"""A backend's handle on its node's weight store process: start, adopt, restart, stop.

`NodeStore.start_or_adopt` first asks the socket at `socket_path` (in the instance's
state directory, which outlives a crashed controller): a store that answers is adopted
(watched by pidfd). Otherwise it binds a fresh socket there itself and hands it to a new
`python -m surge.weights` (its spec on stdin, the listening socket as an inherited
descriptor), so replicas can connect the moment this returns: their connections wait in
the backlog until the store accepts. With `defer`, the socket is bound at once but the
process starts only at `spawn_pending` (the local backend calls it once its fork server
is ready, so the store's start does not take the CPU the first proxy and replica need:
a connection made meanwhile waits in the backlog). `poll` restarts a store that died
(its guardian has unlinked its files; at most MAX_RESTARTS in RESTART_WINDOW_S);
`close` stops it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys

from surge.clock import SYSTEM, Clock
from surge.config.weights import WeightStoreOptions
from surge.errors import WeightStoreError
from surge.launch import LOCAL_NODE, Lifetime, WeightStoreProcessSpec, encode, start_process
from surge.observability.config import LoggingConfig
from surge.process import open_pidfd, pid_gone
from surge.weights.client import StoreClient

__all__ = ["NodeStore", "bind_store_socket"]

log = logging.getLogger("surge.backend")

LISTEN_BACKLOG = 1024
STOP_TIMEOUT_S = 5.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def bind_store_socket(path: str) -> socket.socket:
    """A listening Unix socket at `path` (a stale one there is replaced), to hand down."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(LISTEN_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


class NodeStore:
    def __init__(self, options: WeightStoreOptions, socket_path: str, lifetime: Lifetime,
                 logging_config: LoggingConfig, env: dict[str, str],
                 node_id: str = LOCAL_NODE, clock: Clock = SYSTEM) -> None:
        self.options = options
        self.socket_path = socket_path
        self.lifetime = lifetime
        self.logging = logging_config
        self.env = env
        self.node_id = node_id
        self.clock = clock
        self.process: subprocess.Popen[bytes] | None = None
        self.adopted: tuple[int, int | None] | None = None  # (pid, pidfd) of a found store
        self.restarts: collections.deque[float] = collections.deque()
        self.gave_up = False
        self._pending: socket.socket | None = None  # bound, its process not started yet

    def __repr__(self) -> str:
        return f"<NodeStore {self.socket_path} pid={self.pid} alive={self.alive}>"

    @property
    def pid(self) -> int:
        if self.process is not None:
            return self.process.pid
        return self.adopted[0] if self.adopted is not None else 0

    @property
    def address(self) -> str | None:
        """What replicas are told (None once restarts gave up: they load privately)."""
        return None if self.gave_up else self.socket_path

    @property
    def pending(self) -> bool:
        """Its socket is bound and its process is still to start (`spawn_pending`)."""
        return self._pending is not None

    @property
    def alive(self) -> bool:
        if self._pending is not None:
            return True  # it will be: connections wait in the backlog
        if self.process is not None:
            return self.process.poll() is None
        if self.adopted is not None:
            return not pid_gone(*self.adopted)
        return False

    def start_or_adopt(self, defer: bool = False) -> None:
        found = self._answering()
        if found:
            self.adopted = (found, open_pidfd(found))
            log.info("weight store at %s (pid %d) adopted", self.socket_path, found)
            return
        if defer:
            self._pending = bind_store_socket(self.socket_path)
            return
        self._start()

    def spawn_pending(self) -> None:
        """Start the process of a deferred store (nothing when none is pending)."""
        listener, self._pending = self._pending, None
        if listener is not None:
            self._start(listener)

    def _answering(self) -> int:
        """The pid of a store answering at the socket, or 0."""
        if not os.path.exists(self.socket_path):
            return 0
        client = StoreClient(self.socket_path)
        try:
            return client.stats().pid
        except WeightStoreError:
            return 0
        finally:
            client.close()

    def _start(self, listener: socket.socket | None = None) -> None:
        listener = listener if listener is not None else bind_store_socket(self.socket_path)
        try:
            spec = WeightStoreProcessSpec(options=self.options, socket_path=self.socket_path,
                                          listen_fd=listener.fileno(), node_id=self.node_id,
                                          lifetime=self.lifetime, logging=self.logging)
            self.process = start_process([sys.executable, "-m", "surge.weights"], encode(spec),
                                         self.env, pass_fds=(listener.fileno(),))
        finally:
            listener.close()  # the store has its own copy
        self.adopted = None

    def poll(self) -> None:
        """Restart the store if it died (bounded)."""
        if self.gave_up or self.alive:
            return
        code = self.process.poll() if self.process is not None else None
        now = self.clock.monotonic()
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW_S:
            self.restarts.popleft()
        if len(self.restarts) >= MAX_RESTARTS:
            log.error("the weight store died %d times within %.0f s; replicas on this node "
                      "load weights privately until the instance restarts", MAX_RESTARTS,
                      RESTART_WINDOW_S)
            self.gave_up = True
            return
        self.restarts.append(now)
        log.warning("the weight store (pid %d) exited (code %s); starting a new one",
                    self.pid, code)
        self._forget()
        self._start()

    def _forget(self) -> None:
        if self.adopted is not None and self.adopted[1] is not None:
            os.close(self.adopted[1])
        self.adopted = None
        if self.process is not None:
            self.process.wait()
            self.process = None

    def close(self) -> None:
        """Stop the store (it unlinks its entries and its socket)."""
        if self._pending is not None:  # never started: nothing but the socket to remove
            self._pending.close()
            self._pending = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            return
        pid = self.pid
        if pid and self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if self.process is not None:
                try:
                    self.process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
        self._forget()
