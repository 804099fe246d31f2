"""A control call made while the link to a restarting controller is down waits for the
reconnect (bounded by RECONNECT_WAIT_S) instead of failing at once."""

from __future__ import annotations

import asyncio

import pytest

import surge.router.runtime as runtime_module
from surge.errors import ControllerUnavailableError
from surge.router.runtime import RouterRuntime
from surge.testing import FakeClock, FakePeer


def lost_link() -> RouterRuntime:
    runtime = RouterRuntime("127.0.0.1:1", "driver", token="t", clock=FakeClock())
    old = FakePeer("controller")
    old.close()
    runtime.peer = old  # type: ignore[assignment]
    return runtime


def test_a_call_during_a_reconnect_goes_to_the_new_controller() -> None:
    async def main() -> None:
        runtime = lost_link()
        new = FakePeer("controller")
        new.answers["deploy"] = "deployed"

        async def reconnect() -> None:
            await asyncio.sleep(0.05)
            runtime.peer = new  # type: ignore[assignment]

        runtime._reconnecting = asyncio.get_running_loop().create_task(reconnect())
        assert await runtime.call("deploy", app="a") == "deployed"
        assert new.called("deploy") == [{"app": "a"}]

    asyncio.run(main())


def test_a_call_waits_only_so_long_for_a_controller_that_does_not_come_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "RECONNECT_WAIT_S", 0.05)

    async def main() -> None:
        runtime = lost_link()
        with pytest.raises(ControllerUnavailableError, match="not connected"):
            await asyncio.wait_for(runtime.call("deploy", app="a"), 5)

    asyncio.run(main())


def test_a_call_after_a_deliberate_shutdown_fails_at_once() -> None:
    async def main() -> None:
        runtime = lost_link()
        runtime.expect_disconnect()
        with pytest.raises(ControllerUnavailableError):
            await asyncio.wait_for(runtime.call("deploy", app="a"), 0.5)

    asyncio.run(main())
