"""What every fuzz test shares: raw probes, the steady bystander, liveness and the tally.

`probe` sends hostile bytes on a fresh TCP connection and reads until the proxy closes
it. With the fuzz instance's short limits (0.5 s for headers, body silence and
keep-alive) every connection the proxy keeps open ends within about a second, so one
still open after `DEADLINE_S` is a hang: a failure. `Steady` is the well-behaved client
that runs beside the attacks for the whole session; every test ends by checking that it
saw no failure and made progress. `Tally` counts outcomes per attack for bench/fuzz.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import httptools
import httpx

from tests.e2e.procs import alive
from tests.eventually import eventually

# Short limits so that a connection the proxy keeps open ends fast (see the docstring).
LIMITS = {"max_body_bytes": 64 * 1024, "max_header_bytes": 8 * 1024,
          "request_header_timeout_s": 0.5, "request_body_timeout_s": 0.5,
          "keep_alive_timeout_s": 0.5}
DEADLINE_S = 8.0  # far above 0.5 s + the sweep interval, even on a loaded machine
TOKEN = "fuzz-token-" + "k" * 24
SCALE = float(os.environ.get("SURGE_FUZZ_SCALE", "1"))  # bench/fuzz.py runs it longer


def examples(count: int) -> int:
    return max(1, int(count * SCALE))


@dataclass
class Outcome:
    statuses: list[int]
    closed: bool  # the proxy closed the connection (or reset it)
    unparseable: bool  # the proxy sent bytes that are not HTTP/1.1 responses
    raw: bytes

    @property
    def label(self) -> str:
        if not self.closed:
            return "hang"
        if self.unparseable:
            return "bad-response"
        if not self.statuses:
            return "closed"
        return "+".join(str(s) for s in self.statuses[:3])


class _Responses:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_status(self, status: bytes) -> None:
        self.statuses.append(self.parser.get_status_code())


def probe(port: int, chunks: Iterable[bytes], gap_s: float = 0.0,
          deadline_s: float = DEADLINE_S) -> Outcome:
    """Send `chunks` (pausing `gap_s` between them) and read until the proxy closes."""
    raw = b""
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=deadline_s) as sock:
        for index, chunk in enumerate(chunks):
            if index and gap_s:
                time.sleep(gap_s)  # the behaviour: a client that trickles its bytes
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # the proxy refused and closed already: read what it said
        end = time.monotonic() + deadline_s  # blocking reads, bounded: not a poll
        while time.monotonic() < end:
            sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            raw += data
    responses = _Responses()
    unparseable = False
    try:
        responses.parser.feed_data(raw)
    except httptools.HttpParserError:
        unparseable = True
    return Outcome(responses.statuses, closed, unparseable, raw)


class Steady:
    """A well-behaved client in a thread: GET /echo and POST /json, one per connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-client", daemon=True)

    def start(self) -> Steady:
        self._thread.start()
        return self

    def _run(self) -> None:
        headers = {"connection": "close"}
        with httpx.Client(base_url=self.url, timeout=30, headers=headers) as client:
            turn = 0
            while not self._stop.is_set():
                turn += 1
                try:
                    if turn % 2:
                        response = client.get("/echo", params={"n": str(turn)})
                    else:
                        response = client.post("/json/items",
                                               json={"name": "steady", "quantity": turn})
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                if response.status_code == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"{response.status_code}: {response.text[:200]}")
                time.sleep(0.01)  # the steady client's pacing

    def progressed_since(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait until it has been served more than `count` times: AssertionError if not
        within the timeout (at once if it was stopped)."""
        eventually(lambda: self.ok > count or self._stop.is_set(), timeout_s,
                   interval_s=0.02, what=f"the steady client served over {count} times")
        assert self.ok > count, "the steady client was stopped"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@dataclass
class Tally:
    """Outcomes per attack, written as JSON for bench/fuzz.py when SURGE_FUZZ_REPORT is set."""

    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, attack: str, label: str) -> None:
        self.outcomes[attack][label] += 1

    def write(self, steady: Steady, pids: dict[int, str]) -> None:
        path = os.environ.get("SURGE_FUZZ_REPORT")
        if not path:
            return
        report = {"attacks": {k: dict(v) for k, v in self.outcomes.items()},
                  "steady_ok": steady.ok, "steady_failures": len(steady.failures),
                  "processes": {title: alive(pid) for pid, title in pids.items()}}
        with open(path, "w") as out:
            json.dump(report, out, indent=1)


TALLY = Tally()


def all_alive(pids: dict[int, str]) -> list[str]:
    """The titles of the processes that died (empty: all alive)."""
    return [title for pid, title in pids.items() if not alive(pid)]


@contextlib.contextmanager
def bystander_unharmed(steady: Steady, pids: dict[int, str]) -> Iterator[None]:
    """Around a test: no surge process died, the steady client failed nothing and
    kept being served."""
    ok_before, failed_before = steady.ok, len(steady.failures)
    yield
    assert all_alive(pids) == []
    assert steady.failures[failed_before:] == []
    steady.progressed_since(ok_before)
