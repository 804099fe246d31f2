"""What recording metrics adds per request, measured on the recording code itself.

    python bench/metrics_overhead.py [--n 1000000]

The echo bench (`http_echo.py --systems surge_nometrics,surge,...`) measures the whole
system, but on a shared 2-core machine its req/s swings more than the few percent at
stake. This times, in one process and without noise from the network, exactly what a
request costs the proxy and the replica with metrics on: the proxy's `record` (two clock
reads, a label tuple, a histogram update, the access-log sampling test) and the
replica's (a clock read and a histogram update), and prints it next to the CPU a request
costs end to end (~60-80 us per request, proxy + replica, from http_echo.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from surge.observability.config import LoggingConfig
from surge.observability.logs import AccessLog
from surge.observability.recorder import Recorder


def per_call_ns(fn: object, n: int) -> float:
    assert callable(fn)
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    args = parser.parse_args()
    logging.getLogger("surge.access").setLevel(logging.INFO)
    proxy = Recorder("proxy", "proxy-0")
    access = AccessLog(LoggingConfig())  # on, sampled: <= 10 lines/s
    access.max_per_s, access._left, access._second = 10, 0, 10**12  # budget used up
    exchange = SimpleNamespace(started=time.monotonic(), labels=("app", "Echo", "/echo"),
                               method="GET", status=200)

    def proxy_record() -> None:  # the body of proxy.server.Proxy.record
        now = time.monotonic()
        latency_ms = (now - exchange.started) * 1000.0
        app, deployment, route = exchange.labels
        proxy.http_request((app, deployment, route, exchange.method, exchange.status),
                           latency_ms)
        if access.enabled and access.wanted(10**12):
            raise AssertionError("sampled out")

    replica = Recorder("replica", "Echo-1", "app", "Echo")

    def replica_record() -> None:  # ReplicaServer's _finished, metrics part
        started = time.monotonic()
        replica.processed("/echo", (time.monotonic() - started) * 1000.0, True)

    empty = per_call_ns(lambda: None, args.n)
    p = per_call_ns(proxy_record, args.n) - empty
    r = per_call_ns(replica_record, args.n) - empty
    print(f"proxy record: {p:.0f} ns/request; replica record: {r:.0f} ns/request; "
          f"together {(p + r) / 1000:.2f} us/request = {(p + r) / 1000 / 70:.1%} of ~70 us "
          f"CPU per request (proxy + replica)")


if __name__ == "__main__":
    main()
