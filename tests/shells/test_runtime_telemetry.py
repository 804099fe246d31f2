"""An idle member's telemetry: an unchanged empty report is sent at most every
TELEMETRY_KEEPALIVE_S, anything with counts or new gauges at once, the last one at close."""

from __future__ import annotations

import asyncio

from surge.model import DeploymentId
from surge.observability.recorder import Recorder, TelemetryReport
from surge.policy.cadence import (
    MAX_LOAD_REPORT_INTERVAL_S,
    MAX_TELEMETRY_INTERVAL_S,
    TELEMETRY_INTERVAL_S,
    TELEMETRY_KEEPALIVE_S,
)
from surge.router.replica_link import Pending
from surge.router.runtime import (
    LOAD_REPORT_INTERVAL_S,
    RouterRuntime,
    telemetry_quiet,
)
from surge.testing import FakeClock, FakePeer
from surge.transport.messages import Call
from tests.eventually import eventually_async


def test_idle_reports_are_sent_only_as_keepalives() -> None:
    async def main() -> None:
        clock = FakeClock()
        runtime = RouterRuntime("127.0.0.1:1", "replica", token="t", clock=clock)
        peer = FakePeer("controller")
        runtime.peer = peer  # type: ignore[assignment]
        recorder = Recorder("replica", "r1", "app", "Model")
        gauges = {"processing": 0.0}
        runtime.report_telemetry(lambda: recorder.drain(gauges))

        def second() -> int:
            clock.advance(TELEMETRY_INTERVAL_S)
            runtime._push_telemetry()  # what the timer does each second
            return len(peer.pushed("telemetry"))

        assert second() == 1  # the first report (a replica start) goes
        assert [second() for _ in range(int(TELEMETRY_KEEPALIVE_S) - 1)] == [1, 1, 1, 1]
        assert second() == 2  # a keepalive
        recorder.http_request(("app", "Model", "/", "GET", 200), 3.0)
        assert second() == 3  # counts go at once
        gauges["processing"] = 1.0
        assert second() == 4  # so do new gauges
        assert second() == 4
        runtime.close()
        assert len(peer.pushed("telemetry")) == 5  # the last one, at close, always

    asyncio.run(main())


def test_a_change_of_models_is_not_quiet() -> None:
    last = TelemetryReport("replica", "r1", "app", "Model", models=("a",))
    assert telemetry_quiet(TelemetryReport("replica", "r1", "app", "Model", models=("a",)),
                           (0.0, last), 1.0)
    assert not telemetry_quiet(TelemetryReport("replica", "r1", "app", "Model",
                                               models=("a", "b")), (0.0, last), 1.0)
    assert not telemetry_quiet(TelemetryReport("replica", "r1", "app", "Model",
                                               models=("a",)), None, 1.0)


def test_a_router_reports_as_often_as_its_controller_says_within_bounds() -> None:
    async def main() -> None:
        runtime = RouterRuntime("127.0.0.1:1", "proxy", token="t", clock=FakeClock())
        peer = FakePeer("controller")
        assert runtime.report_interval_s == LOAD_REPORT_INTERVAL_S
        runtime.on_push(peer, "load_interval", 0.5)  # type: ignore[arg-type]
        assert runtime.report_interval_s == 0.5
        runtime.on_push(peer, "load_interval", 3600.0)  # type: ignore[arg-type]
        assert runtime.report_interval_s == MAX_LOAD_REPORT_INTERVAL_S
        runtime.on_push(peer, "load_interval", 0.0)  # type: ignore[arg-type]
        assert runtime.report_interval_s == LOAD_REPORT_INTERVAL_S

    asyncio.run(main())


def test_a_member_sends_telemetry_as_often_as_its_controller_says_within_bounds() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        runtime = RouterRuntime("127.0.0.1:1", "replica", token="t", clock=FakeClock())
        peer = FakePeer("controller")
        runtime.peer = peer  # type: ignore[assignment]
        recorder = Recorder("replica", "r1", "app", "Model")
        runtime.on_push(peer, "telemetry_interval", 3.0)  # type: ignore[arg-type]
        runtime.report_telemetry(lambda: recorder.drain({}))

        def next_in() -> float:
            timer = runtime._telemetry_timer
            assert timer is not None
            return round(timer.when() - loop.time())

        assert next_in() == 3
        runtime._push_telemetry()
        assert next_in() == 3  # and after each report
        runtime.on_push(peer, "telemetry_interval", 3600.0)  # type: ignore[arg-type]
        assert runtime.telemetry_interval_s == MAX_TELEMETRY_INTERVAL_S
        runtime.on_push(peer, "telemetry_interval", 0.0)  # type: ignore[arg-type]
        assert runtime.telemetry_interval_s == TELEMETRY_INTERVAL_S
        runtime.close()

    asyncio.run(main())


def test_settle_gives_up_on_the_runtime_s_clock() -> None:
    """RouterRuntime.settle's bound is read on the injected clock, the one its routers
    use: a call still queued makes it wait until that clock passes the bound."""
    async def main() -> None:
        clock = FakeClock()
        runtime = RouterRuntime("127.0.0.1:1", "replica", token="t", clock=clock)
        router = runtime.router(DeploymentId("app", "d"))
        router.submit(Pending(Call(id=0, method="f", payload=b""), _Sink()))
        assert router.queued == 1  # no replica yet: it waits
        settling = asyncio.ensure_future(runtime.settle(600.0))

        def time_passes() -> bool:
            clock.advance(60.0)
            return settling.done()

        # on the loop's clock it would wait ten real minutes: eventually gives up first
        await eventually_async(time_passes, 30.0, what="settle to give up")
        assert settling.result() is False
        runtime.close()

    asyncio.run(main())


class _Sink:
    def deliver(self, message: object) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass
