"""Closed-loop HTTP clients on the client host, every request's outcome recorded.

    load = Load(cluster, [cluster.head, cluster.workers[0]], clients=2)
    with load.running():
        ...fault...
    load.assert_accounted()

Each client is a thread inside the client host's namespace with its own keep-alive
connection, sending GETs to one host's proxy one after another. Every request it
starts ends in exactly one `Outcome`: a status and body, or the client's error (status
0) when the proxy did not answer within the client's timeouts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.multihost.cluster import HostsCluster, host_thread
from tests.multihost.netns import Host

CONNECT_TIMEOUT_S = 3.0  # a host whose link is down never answers a SYN
READ_TIMEOUT_S = 20.0  # far above any answer surge should give; a hang shows as status 0
ERROR_PAUSE_S = 0.1  # after no answer (refused at once, say), as a client backs off


@dataclass(frozen=True)
class Outcome:
    host: str  # the proxy's host ("h0", ...)
    started: float  # time.monotonic()
    ended: float
    status: int  # 0: no HTTP answer (the client's error is in `body`)
    body: str

    @property
    def served_by(self) -> str | None:
        """The IP of the host whose replica answered, for a 200."""
        if self.status != 200:
            return None
        try:
            ip: Any = json.loads(self.body).get("ip")
        except ValueError:
            return None
        return str(ip) if ip else None

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Load:
    cluster: HostsCluster
    targets: list[Host]
    clients: int = 2
    outcomes: list[Outcome] = field(default_factory=list)
    started: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, tuple[str, float]] = field(default_factory=dict)  # thread: (host, t)

    def __repr__(self) -> str:
        return (f"<Load targets={[h.name for h in self.targets]} started={self.started} "
                f"ended={len(self.outcomes)}>")

    def _client(self, target: Host) -> None:
        url = self.cluster.url(target)
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        with httpx.Client(timeout=timeout) as client:
            while not self.stop.is_set():
                began = time.monotonic()
                with self.lock:
                    self.started += 1
                    self.pending[threading.get_ident()] = (target.name, began)
                try:
                    response = client.get(url)
                    status, body = response.status_code, response.text
                except httpx.HTTPError as exc:
                    status, body = 0, repr(exc)
                with self.lock:
                    self.outcomes.append(Outcome(target.name, began, time.monotonic(), status,
                                                 body))
                    del self.pending[threading.get_ident()]
                if status == 0:
                    self.stop.wait(ERROR_PAUSE_S)

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        threads = [host_thread(self.cluster.client, functools.partial(self._client, t),
                               f"load-{t.name}-{i}")
                   for t in self.targets for i in range(self.clients)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(READ_TIMEOUT_S + CONNECT_TIMEOUT_S + 5)
            assert not any(t.is_alive() for t in threads), "a load client did not stop"

    # -- what happened -----------------------------------------------------------------

    def to(self, host: Host, since: float = float("-inf"),
           until: float = float("inf")) -> list[Outcome]:
        """The requests sent to the host's proxy that started in [since, until)."""
        return [o for o in list(self.outcomes)
                if o.host == host.name and since <= o.started < until]

    def in_flight(self, host: Host, started_before: float = float("inf")) -> list[float]:
        """When the requests to the host's proxy that have not ended yet started."""
        with self.lock:
            return [began for name, began in self.pending.values()
                    if name == host.name and began < started_before]

    def served(self, host: Host, since: float = float("-inf"),
               by: str | None = None) -> int:
        """200s from the host's proxy for requests started after `since` (answered by
        the host with IP `by`, if given)."""
        return sum(1 for o in self.to(host, since)
                   if o.status == 200 and (by is None or o.served_by == by))

    def failures(self, host: Host | None = None) -> list[Outcome]:
        return [o for o in list(self.outcomes)
                if o.status != 200 and (host is None or o.host == host.name)]

    def assert_accounted(self) -> None:
        """Every request started has exactly one outcome (the clients have stopped)."""
        assert self.stop.is_set()
        assert self.started == len(self.outcomes), (self.started, len(self.outcomes))

    def summary(self) -> str:
        by_host: dict[str, dict[int, int]] = {}
        for o in self.outcomes:
            counts = by_host.setdefault(o.host, {})
            counts[o.status] = counts.get(o.status, 0) + 1
        return ", ".join(f"{host}: {dict(sorted(c.items()))}"
                         for host, c in sorted(by_host.items()))
