"""The controller's side of the fork server, against a real `surge:forkserver` process."""

from __future__ import annotations

import os
import sys
import time

from surge.backends.forking import ForkServer
from tests.eventually import eventually


def test_a_poll_before_the_first_spawn_does_not_lose_the_ready_line() -> None:
    # The controller polls for exits every tick; a poll that reads the fork server's
    # ready line before any spawn must not make the first spawn wait for it again (it
    # used to, for 30 s with the controller's loop blocked, then gave the server up).
    server = ForkServer(dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        def polled_ready() -> bool:
            assert server.poll() == []
            time.sleep(0.05)
            return server._ready

        eventually(polled_ready, 60, what="the fork server's ready line, read by a poll")
        # A spec the child cannot read: it exits at once, which is all this needs.
        pid = server.spawn("replica-1", b"{}\n", dict(os.environ))
        assert pid > 0
        exits: list[tuple[str, int]] = []

        def reaped() -> bool:
            exits.extend(server.poll())
            return bool(exits)

        eventually(reaped, 30, what="the child's exit")
        assert [process_id for process_id, _ in exits] == ["replica-1"]
    finally:
        server.close()
