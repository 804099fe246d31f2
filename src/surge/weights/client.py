"""A process's one connection to its node's weight store (blocking, thread-safe).

A replica is told the store's socket by its spec; `set_store` records it and the first
`weights.load` connects. Calls are one at a time under a lock (a hit is one round trip,
tens of microseconds); a broken connection raises `WeightStoreUnavailableError` and the
next call reconnects (the backend restarts a store that died). References are given
back from finalizers, which may run anywhere, even inside a call of this thread: they
queue the key, and whoever holds the connection next (or the finalizer itself, if it
is free) sends the queued `Release`s first.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import threading
from collections.abc import Callable

from surge.errors import (
    WeightBudgetError,
    WeightSourceError,
    WeightStoreError,
    WeightStoreFullError,
    WeightStoreUnavailableError,
)
from surge.launch import LOCAL_NODE, NodeWeightStore
from surge.weights import protocol as p

__all__ = ["StoreClient", "current_store", "set_store"]

CONNECT_TIMEOUT_S = 5.0
# A miss copies the source first: a large model from slow storage takes minutes.
LOAD_TIMEOUT_S = 1800.0
_ERRORS: dict[str, type[WeightStoreError]] = {
    "source": WeightSourceError, "budget": WeightBudgetError, "full": WeightStoreFullError,
}


class StoreClient:
    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._pid = 0  # the process that connected: a forked child reconnects
        self._lock = threading.Lock()
        self._releases: collections.deque[str] = collections.deque()
        self._requests = itertools.count(1)

    def __repr__(self) -> str:
        state = "connected" if self._sock is not None else "idle"
        return f"<StoreClient {self.path} {state} releases_queued={len(self._releases)}>"

    def load(self, name: str, source: str) -> p.Loaded:
        answer = self._call(lambda request: p.Load(request, name, source), LOAD_TIMEOUT_S)
        if isinstance(answer, p.Failed):
            raise _ERRORS.get(answer.kind, WeightStoreError)(answer.message)
        assert isinstance(answer, p.Loaded)
        return answer

    def stats(self) -> p.StoreStats:
        answer = self._call(p.Stats, CONNECT_TIMEOUT_S)
        assert isinstance(answer, p.StatsReply)
        return answer.stats

    def release(self, key: str) -> None:
        """Give one reference back (safe from a finalizer)."""
        self._releases.append(key)
        if self._lock.acquire(blocking=False):
            try:
                if self._sock is not None and self._pid == os.getpid():
                    self._flush(self._sock)
            except OSError:
                self._drop()
            finally:
                self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _call(self, make: Callable[[int], p.ClientMessage], timeout_s: float) -> p.ServerMessage:
        request = next(self._requests)
        with self._lock:
            try:
                sock = self._connected()
                self._flush(sock)
                sock.settimeout(timeout_s)
                sock.sendall(p.encode(make(request)))
                while True:
                    answer = p.decode_server(p.recv_frame(sock))
                    if answer.request == request:
                        self._flush(sock)  # what finalizers queued meanwhile
                        return answer
            except (OSError, ValueError) as exc:
                self._drop()
                raise WeightStoreUnavailableError(
                    f"the weight store at {self.path} does not answer ({exc}); a replica that "
                    "needs it fails to start and is retried") from None

    def _connected(self) -> socket.socket:
        if self._sock is not None and self._pid == os.getpid():
            return self._sock
        self._sock = None
        self._releases.clear()  # references of another process or connection: gone with it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self._sock, self._pid = sock, os.getpid()
        return sock

    def _flush(self, sock: socket.socket) -> None:
        frames = []
        while self._releases:
            frames.append(p.encode(p.Release(self._releases.popleft())))
        if frames:
            sock.sendall(b"".join(frames))

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._releases.clear()  # the store dropped this connection's references itself


_store: StoreClient | None = None


def set_store(where: str | NodeWeightStore | None, node_id: str = LOCAL_NODE) -> None:
    """Use the store at `where` (a replica's spec's `weight_store`: a socket's path, or
    its node's store on a cluster); None: no store."""
    global _store
    if _store is not None:
        _store.close()
    path = where.socket_path(node_id) if isinstance(where, NodeWeightStore) else where
    _store = StoreClient(path) if path else None


def current_store() -> StoreClient | None:
    return _store
