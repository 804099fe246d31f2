"""The live line and its loud notices; merging workers' progress."""

from __future__ import annotations

import io

from surge.loadtest.runner import Progress, _Console
from surge.loadtest.stats import Window


def progress(lag_s: float = 0.001, waited: int = 0, ok: int = 1000) -> Progress:
    return Progress(elapsed=3.0, window=Window(1.0, 1000, ok, 5, {2000: 99, 90000: 1}),
                    lag_max_s=lag_s, waited=waited, open_connections=12, outstanding=3)


def test_progress_line() -> None:
    out = io.StringIO()
    console = _Console(out, quiet=False, connections=64)
    console.progress(progress(), replicas=4)
    line = out.getvalue()
    assert line.startswith("pulse    3.0s  offered    1,000/s  ok    1,000/s  errors       5/s")
    assert "p99    2.0 ms" in line and "replicas   4  cpu    -  conns 12" in line
    assert "WARNING" not in line
    console.progress(progress(), replicas=4, node_cpu=0.934)
    assert "replicas   4  cpu  93%  conns 12" in out.getvalue().splitlines()[-1]


def test_falling_behind_and_a_full_pool_are_loud_even_when_quiet() -> None:
    out = io.StringIO()
    console = _Console(out, quiet=True, connections=64)
    console.progress(progress(lag_s=0.030, waited=40), replicas=None)
    console.progress(progress(lag_s=0.030, waited=40), replicas=None)  # nothing new
    console.progress(progress(lag_s=0.001, waited=90), replicas=None)
    lines = out.getvalue().splitlines()
    assert lines == [
        "surge pulse: WARNING: the generator is 30 ms behind its schedule at t=3.0s "
        "(CPU-bound). The offered load is unchanged; the delay counts in the latencies. "
        "Try --workers.",
        "surge pulse: WARNING: all 64 connections busy: 40 requests waited for one in the "
        "last second (latency counts the wait; raise --connections to measure the server "
        "alone)",
        "surge pulse: WARNING: all 64 connections busy: 50 requests waited for one in the "
        "last second (latency counts the wait; raise --connections to measure the server "
        "alone)",
    ]


def test_merge_adds_workers_progress() -> None:
    merged = Progress.merge([progress(lag_s=0.002, waited=1), progress(lag_s=0.004, ok=10)])
    assert merged.window.offered == 2000 and merged.window.ok == 1010
    assert merged.window.latency == {2000: 198, 90000: 2}
    assert merged.lag_max_s == 0.004 and merged.waited == 1
    assert merged.open_connections == 24 and merged.outstanding == 6
