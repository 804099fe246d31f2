"""The controller's side of the fork server, against a real `surge:forkserver` process."""

from __future__ import annotations

import os
import sys
import time

import pytest

from surge.backends.forking import ForkEvents, ForkServer
from tests.eventually import eventually

pytestmark = pytest.mark.e2e  # a real fork server (tests/tiers.py)


def test_submitting_never_waits_and_every_answer_comes_with_a_poll() -> None:
    # The controller submits from its event loop: nothing may wait for the fork server
    # (it used to, for its whole import, with every member's handshake timing out).
    server = ForkServer(dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        started = time.monotonic()
        for i in range(3):  # a spec the child cannot read: it exits at once
            server.submit(f"replica-{i}", b"{}\n", dict(os.environ))
        assert time.monotonic() - started < 0.5  # while the fork server still imports
        seen = ForkEvents()

        def all_reaped() -> bool:
            events = server.poll()
            seen.spawned += events.spawned
            seen.failed += events.failed
            seen.exited += events.exited
            return len(seen.exited) == 3

        eventually(all_reaped, 90, what="three children forked and reaped")
        assert sorted(p for p, _ in seen.spawned) == ["replica-0", "replica-1", "replica-2"]
        assert all(pid > 0 for _, pid in seen.spawned) and seen.failed == []
        assert sorted(p for p, _ in seen.exited) == ["replica-0", "replica-1", "replica-2"]
    finally:
        server.close()


def test_a_fork_server_that_dies_fails_what_it_was_not_done_with() -> None:
    server = ForkServer(dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        server.process.kill()
        server.process.wait()
        server.submit("replica-1", b"{}\n", dict(os.environ))
        failed: list[tuple[str, str]] = []

        def reported() -> bool:
            failed.extend(server.poll().failed)
            return bool(failed)

        eventually(reported, 30, what="the request failed")
        assert failed[0][0] == "replica-1" and server.broken
    finally:
        server.close()
