"""tests/eventually.py: the one waiting helper of the suite."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from tests.eventually import eventually, eventually_async


def counter_reaching(n: int) -> tuple[list[int], object]:
    """A predicate that returns the call count once it reaches n, else 0; and its calls."""
    calls: list[int] = []

    def predicate() -> int:
        calls.append(len(calls) + 1)
        return len(calls) if len(calls) >= n else 0

    return calls, predicate


# -- eventually ---------------------------------------------------------------------------


def test_returns_at_once_when_the_predicate_holds() -> None:
    calls, predicate = counter_reaching(1)
    assert eventually(predicate, 5) == 1  # type: ignore[arg-type]
    assert calls == [1]


def test_returns_the_first_truthy_value() -> None:
    calls, predicate = counter_reaching(3)
    assert eventually(predicate, 5, interval_s=0.001) == 3  # type: ignore[arg-type]
    assert calls == [1, 2, 3]


def test_returns_the_value_itself_not_a_bool() -> None:
    values = iter([[], None, {"pid": 7}])
    assert eventually(lambda: next(values), 5, interval_s=0.001) == {"pid": 7}


def test_times_out_with_what_how_long_and_the_last_value() -> None:
    values = itertools.count()
    with pytest.raises(AssertionError) as raised:
        eventually(lambda: [] if next(values) < 10**9 else [1], 0.2, interval_s=0.01,
                   what="the replica count to reach 2")
    message = str(raised.value)
    assert "waiting for the replica count to reach 2" in message
    assert "timeout 0.2s" in message
    assert "last value: []" in message
    assert "last exception" not in message


def test_the_timeout_message_names_a_function_predicate() -> None:
    def replicas_running() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"waiting for .*replicas_running.*last value: False"):
        eventually(replicas_running, 0.05, interval_s=0.01)


def test_the_timeout_message_shows_a_lambda_source_line() -> None:
    with pytest.raises(AssertionError, match=r'lambda at .*test_eventually\.py:\d+ .*"marker"'):
        eventually(lambda: "marker" == "never", 0.05, interval_s=0.01)


def test_waits_about_the_timeout_and_checks_once_more_at_the_deadline() -> None:
    calls: list[float] = []
    started = time.monotonic()

    def predicate() -> bool:
        calls.append(time.monotonic() - started)
        return False

    with pytest.raises(AssertionError):
        eventually(predicate, 0.3, interval_s=0.05)
    # this is the wait under test: it lasts the timeout, and the last check is at its end
    assert calls[-1] >= 0.3
    assert time.monotonic() - started < 5.0  # generous: it ends, it does not hang
    assert len(calls) >= 2


def test_a_raising_predicate_is_retried() -> None:
    calls: list[int] = []

    def predicate() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not listening yet")
        return "up"

    assert eventually(predicate, 5, interval_s=0.001) == "up"
    assert len(calls) == 3


def test_a_predicate_that_keeps_raising_shows_its_last_exception() -> None:
    calls: list[int] = []

    def predicate() -> bool:
        calls.append(1)
        raise KeyError(f"attempt {len(calls)}")

    with pytest.raises(AssertionError) as raised:
        eventually(predicate, 0.1, interval_s=0.01, what="the app in status()")
    message = str(raised.value)
    assert "waiting for the app in status()" in message
    assert "the predicate never returned" in message
    assert f"last exception: KeyError: 'attempt {len(calls)}'" in message
    assert isinstance(raised.value.__cause__, KeyError)


def test_both_the_last_value_and_an_earlier_exception_are_shown() -> None:
    calls: list[int] = []

    def predicate() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt")
        return 0

    with pytest.raises(AssertionError) as raised:
        eventually(predicate, 0.1, interval_s=0.01)
    assert "last value: 0" in str(raised.value)
    assert "last exception: RuntimeError: first attempt" in str(raised.value)


def test_a_zero_timeout_checks_exactly_once() -> None:
    calls, predicate = counter_reaching(2)
    with pytest.raises(AssertionError, match="1 attempts"):
        eventually(predicate, 0)  # type: ignore[arg-type]
    assert calls == [1]


def test_keyboard_interrupt_is_not_swallowed() -> None:
    def predicate() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        eventually(predicate, 5)


def test_a_negative_timeout_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        eventually(lambda: True, -1)


class Falsy:
    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "Falsy(" + "x" * 10_000 + ")"


def test_a_long_last_value_is_truncated() -> None:
    with pytest.raises(AssertionError, match=r"last value: Falsy\(x+\.\.\.\(truncated\)") as raised:
        eventually(Falsy, 0, what="x")
    assert len(str(raised.value)) < 1_000


# -- eventually_async ---------------------------------------------------------------------


def test_async_returns_the_first_truthy_value_of_a_sync_predicate() -> None:
    calls, predicate = counter_reaching(3)
    assert asyncio.run(eventually_async(predicate, 5, interval_s=0.001)) == 3  # type: ignore[arg-type]
    assert calls == [1, 2, 3]


def test_async_awaits_a_coroutine_predicate() -> None:
    calls: list[int] = []

    async def probe() -> str | None:
        calls.append(1)
        await asyncio.sleep(0)
        return "ready" if len(calls) >= 2 else None

    assert asyncio.run(eventually_async(probe, 5, interval_s=0.001)) == "ready"
    assert len(calls) == 2


def test_async_lets_the_loop_run_while_it_waits() -> None:
    async def main() -> int:
        state = {"n": 0}

        async def producer() -> None:
            for _ in range(3):
                await asyncio.sleep(0)  # yields to the waiter: no time involved
                state["n"] += 1

        task = asyncio.create_task(producer())
        found = await eventually_async(lambda: state["n"] == 3 and state["n"], 5)
        await task
        return found

    assert asyncio.run(main()) == 3


def test_async_times_out_with_a_clear_message() -> None:
    async def probe() -> list[int]:
        return []

    with pytest.raises(AssertionError) as raised:
        asyncio.run(eventually_async(probe, 0.1, interval_s=0.01, what="a held call"))
    message = str(raised.value)
    assert "waiting for a held call" in message
    assert "timeout 0.1s" in message
    assert "last value: []" in message


def test_async_retries_a_raising_predicate_and_shows_it_on_timeout() -> None:
    calls: list[int] = []

    async def probe() -> bool:
        calls.append(1)
        raise ConnectionResetError("peer went away")

    with pytest.raises(AssertionError, match="last exception: ConnectionResetError: peer went"):
        asyncio.run(eventually_async(probe, 0.1, interval_s=0.01))
    assert len(calls) >= 2


def test_async_a_hung_awaitable_is_a_timeout_not_a_hang() -> None:
    async def never() -> bool:
        await asyncio.Event().wait()
        return True

    async def main() -> None:
        await eventually_async(never, 0.2, what="a probe that never answers")

    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"a probe that never answers.*TimeoutError"):
        asyncio.run(main())
    assert time.monotonic() - started < 5.0  # generous: the wait ends, it does not hang
