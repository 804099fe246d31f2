"""@serve.batch on a real event loop, in each of Ray Serve's forms: sizes, timeouts,
batches formed when a slot frees, several arguments, streaming, runtime settings,
batch_size_fn, and the seam that keeps multiplexed models apart."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from surge.errors import ConfigError, RayServeException
from surge.replica.batch_stream import STREAM_AHEAD_ITEMS
from surge.replica.batching import BatchSettings, batch, batch_group_key, wrap
from tests.eventually import eventually_async

LONG = 1000.0  # a wait timeout no test waits out: those batches leave when full


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())


def queues(batched: Any) -> str:
    return repr(batched.__surge_batch_queues__)


class Model:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.sizes: list[int] = []

    @batch(max_batch_size=4, batch_wait_timeout_s=0.001)
    async def infer(self, items: list[int]) -> list[int]:
        self.sizes.append(len(items))
        await asyncio.sleep(self.seconds)
        return [item * 10 for item in items]


class Gated:
    """A batch method that runs until the test opens its gate; records what it got."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.batches: list[list[Any]] = []

    @batch(max_batch_size=3, batch_wait_timeout_s=0, max_concurrent_batches=2)
    async def work(self, items: list[Any]) -> list[Any]:
        self.batches.append(items)
        await self.gate.wait()
        return items


# -- sizes, timeouts, slots ---------------------------------------------------------------


def test_items_gathered_during_a_slow_batch_leave_together_when_it_ends() -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        model = Model(0.05)
        first = asyncio.ensure_future(model.infer(0))
        await eventually_async(lambda: model.sizes == [1], 5,
                               what="the first batch (one item) running")
        rest = [asyncio.ensure_future(model.infer(i)) for i in range(1, 11)]
        results = await asyncio.gather(first, *rest)
        return model.sizes, list(results)

    sizes, results = run(scenario)
    assert results == [i * 10 for i in range(11)]
    # Ray would send a 1-item batch per timeout; surge fills the batches it can.
    assert sizes == [1, 4, 4, 2]


def test_a_lone_item_leaves_after_the_wait_timeout() -> None:
    async def scenario() -> list[int]:
        model = Model(0.0)
        assert await model.infer(7) == 70
        return model.sizes

    assert run(scenario) == [1]


def test_calls_of_one_loop_iteration_share_a_zero_timeout_batch() -> None:
    @batch(max_batch_size=10, batch_wait_timeout_s=0)
    async def echo(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    sizes: list[int] = []

    async def scenario() -> list[int]:
        return list(await asyncio.gather(*[echo(i) for i in range(5)]))

    assert run(scenario) == [0, 1, 2, 3, 4]
    assert sizes == [5]


def test_max_concurrent_batches_run_side_by_side_and_the_rest_wait_for_a_slot() -> None:
    async def scenario() -> tuple[list[list[Any]], list[Any]]:
        model = Gated()
        calls = [asyncio.ensure_future(model.work(i)) for i in range(2)]
        await eventually_async(lambda: model.batches == [[0, 1]], 5, what="batch 1")
        calls += [asyncio.ensure_future(model.work(i)) for i in range(2, 4)]
        await eventually_async(lambda: len(model.batches) == 2, 5, what="batch 2")
        calls += [asyncio.ensure_future(model.work(i)) for i in range(4, 6)]
        await eventually_async(lambda: "2 waiting in 1 groups, 2/2 batches running"
                               in queues(Gated.work), 5, what="batch 3 waiting")
        model.gate.set()
        return model.batches, list(await asyncio.gather(*calls))

    batches, results = run(scenario)
    assert results == list(range(6))
    assert batches == [[0, 1], [2, 3], [4, 5]]


def test_two_instances_never_share_a_batch() -> None:
    async def scenario() -> tuple[list[int], list[int], list[int]]:
        one, two = Model(0.0), Model(0.0)
        results = await asyncio.gather(one.infer(1), two.infer(2), one.infer(3))
        return list(results), one.sizes, two.sizes

    results, one_sizes, two_sizes = run(scenario)
    assert results == [10, 20, 30]
    assert (one_sizes, two_sizes) == ([2], [1])


def test_a_queue_is_dropped_once_it_has_nothing_waiting_or_running() -> None:
    async def scenario() -> str:
        model = Model(0.0)
        await model.infer(1)
        return queues(Model.infer)

    assert run(scenario) == "[]"


# -- results and errors -------------------------------------------------------------------


def test_a_wrong_result_length_fails_every_caller_with_rays_message() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def broken(items: list[int]) -> list[int]:
        return [1]

    async def scenario() -> list[BaseException | int]:
        return await asyncio.gather(broken(1), broken(2), return_exceptions=True)

    outcomes = run(scenario)
    assert all(isinstance(o, RayServeException) for o in outcomes)
    assert str(outcomes[0]) == ("Batched function doesn't preserve batch size. The input "
                                "list has length 2 but the returned list has length 1.")


def test_a_result_that_is_not_a_list_is_a_clear_error() -> None:
    @batch(max_batch_size=1)
    async def counts(items: list[int]) -> int:
        return len(items)

    with pytest.raises(TypeError) as info:
        run(lambda: counts(1))
    assert str(info.value) == ("a @serve.batch function must return (or yield) a list with "
                               "one result per call, got int")


def test_any_sized_result_works_as_in_ray() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def pairs(items: list[int]) -> tuple[int, ...]:
        return tuple(i + 1 for i in items)

    async def scenario() -> list[int]:
        return list(await asyncio.gather(pairs(1), pairs(2)))

    assert run(scenario) == [2, 3]


def test_an_exception_reaches_every_caller_of_the_batch() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def fails(items: list[int]) -> list[int]:
        raise ZeroDivisionError("boom")

    async def scenario() -> list[BaseException | int]:
        return await asyncio.gather(fails(1), fails(2), return_exceptions=True)

    assert [type(o) for o in run(scenario)] == [ZeroDivisionError, ZeroDivisionError]


def test_a_caller_cancelled_while_waiting_is_left_out_of_its_batch() -> None:
    async def scenario() -> list[list[Any]]:
        model = Gated()
        running = [asyncio.ensure_future(model.work(i)) for i in ("a", "b")]
        await eventually_async(lambda: len(model.batches) == 1, 5, what="batch 1")
        running.append(asyncio.ensure_future(model.work("c")))
        await eventually_async(lambda: len(model.batches) == 2, 5, what="batch 2")
        cancelled = asyncio.ensure_future(model.work("cancelled"))
        await eventually_async(lambda: "1 waiting" in queues(Gated.work), 5)
        cancelled.cancel()
        last = asyncio.ensure_future(model.work("d"))
        await eventually_async(lambda: "2 waiting" in queues(Gated.work), 5)
        model.gate.set()
        assert await asyncio.gather(*running, last) == ["a", "b", "c", "d"]
        assert cancelled.cancelled()
        return model.batches

    assert run(scenario) == [["a", "b"], ["c"], ["d"]]


def test_callers_of_a_cancelled_batch_are_cancelled_not_left_waiting() -> None:
    # what a stopping replica does to its tasks
    async def scenario() -> tuple[list[BaseException | Any], str]:
        model, streamer = Gated(), Streamer()
        calls = [asyncio.ensure_future(model.work(i)) for i in range(2)]
        stream = streamer.quick("s", 10**6)
        calls.append(asyncio.ensure_future(collect(stream)))
        await eventually_async(lambda: model.batches and streamer.produced, 5)
        for batched in (Gated.work, Streamer.quick):
            for queue in batched.__surge_batch_queues__.queues.values():
                for task in queue.tasks:
                    task.cancel()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        return outcomes, queues(Gated.work) + queues(Streamer.quick)

    outcomes, left = run(scenario)
    assert [type(o) for o in outcomes] == [asyncio.CancelledError] * 3
    assert left == "[][]"


# -- several arguments --------------------------------------------------------------------


class Pairs:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    @batch(max_batch_size=4, batch_wait_timeout_s=LONG)
    async def join(self, key1: list[str], key2: list[str]) -> list[str]:
        self.calls.append((key1, key2))
        return [a + b for a, b in zip(key1, key2, strict=True)]


def test_positional_keyword_mixed_and_out_of_order_calls_share_one_aligned_batch() -> None:
    async def scenario() -> tuple[list[str], list[tuple[Any, ...]]]:
        pairs = Pairs()
        results = await asyncio.gather(
            pairs.join("a", "1"), pairs.join(key1="b", key2="2"), pairs.join("c", key2="3"),
            pairs.join(key2="4", key1="d"))
        return list(results), pairs.calls

    results, calls = run(scenario)
    assert results == ["a1", "b2", "c3", "d4"]
    assert calls == [(["a", "b", "c", "d"], ["1", "2", "3", "4"])]


def test_calls_that_pass_different_arguments_get_separate_batches() -> None:
    # Ray fails the whole batch ("All batch requests should have the same number of
    # parameters."); surge gives each set of arguments its own batch.
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def scale(values: list[int], factor: list[int] | int = 10) -> list[int]:
        seen.append((values, factor))
        factors = factor if isinstance(factor, list) else [factor] * len(values)
        return [v * f for v, f in zip(values, factors, strict=True)]

    seen: list[tuple[Any, Any]] = []

    async def scenario() -> list[int]:
        return list(await asyncio.gather(scale(1), scale(2, factor=3), scale(3),
                                         scale(values=4, factor=5)))

    assert run(scenario) == [10, 6, 30, 20]
    assert seen == [([1, 3], 10), ([2, 4], [3, 5])]


def test_a_call_that_does_not_fit_the_signature_fails_alone_with_pythons_message() -> None:
    async def scenario() -> list[BaseException | str]:
        pairs = Pairs()
        return await asyncio.gather(pairs.join("a"), pairs.join("x", "1", "extra"),
                                    pairs.join("b", "2", nope=1), return_exceptions=True)

    outcomes = run(scenario)
    assert [str(o) for o in outcomes] == ["missing a required argument: 'key2'",
                                          "too many positional arguments",
                                          "got an unexpected keyword argument 'nope'"]
    assert all(type(o) is TypeError for o in outcomes)


def test_var_positional_and_var_keyword_arguments_are_batched_per_entry() -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def sums(*columns: list[int], **named: list[int]) -> list[int]:
        seen.append((columns, named))
        return [sum(row) for row in zip(*columns, *named.values(), strict=True)]

    seen: list[tuple[Any, Any]] = []

    async def scenario() -> list[int]:
        return list(await asyncio.gather(sums(1, 2, x=3), sums(4, 5, x=6)))

    assert run(scenario) == [6, 15]
    assert seen == [(([1, 4], [2, 5]), {"x": [3, 6]})]


# -- streaming ----------------------------------------------------------------------------


class Streamer:
    def __init__(self) -> None:
        self.produced = 0
        self.closed = False

    @batch(max_batch_size=3, batch_wait_timeout_s=LONG)
    async def tokens(self, prompts: list[str], counts: list[int]) -> AsyncIterator[list[Any]]:
        for step in range(max(counts)):
            yield [f"{p}{step}" if step < n else StopIteration
                   for p, n in zip(prompts, counts, strict=True)]

    @batch(max_batch_size=2, batch_wait_timeout_s=0)
    async def quick(self, prompts: list[str], counts: list[int]) -> AsyncIterator[list[Any]]:
        try:
            for step in range(max(counts)):
                self.produced += 1
                yield [f"{p}{step}" for p in prompts]
        finally:
            self.closed = True


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


def test_each_caller_streams_its_own_elements_until_its_stop_sentinel() -> None:
    async def scenario() -> list[list[Any]]:
        model = Streamer()
        return list(await asyncio.gather(collect(model.tokens("a", 1)),
                                         collect(model.tokens("b", counts=3)),
                                         collect(model.tokens(prompts="c", counts=2))))

    assert run(scenario) == [["a0"], ["b0", "b1", "b2"], ["c0", "c1"]]


def test_a_bare_decorator_takes_an_async_generator_and_its_end_ends_every_stream() -> None:
    @batch
    async def echo(items: list[str]) -> AsyncIterator[list[str]]:
        yield items
        yield [i.upper() for i in items]

    async def scenario() -> list[list[str]]:
        return list(await asyncio.gather(collect(echo("x")), collect(echo("y"))))

    assert run(scenario) == [["x", "X"], ["y", "Y"]]


@pytest.mark.parametrize("failure", ["raise", "wrong length"])
def test_a_failing_stream_delivers_what_came_before_then_the_error_then_ends(
        failure: str) -> None:
    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def steps(items: list[str]) -> AsyncIterator[list[str]]:
        yield items
        if failure == "raise":
            raise RuntimeError("Testing error")
        yield items * 2

    async def one(stream: AsyncIterator[str]) -> tuple[str, str]:
        first = await anext(stream)
        with pytest.raises(RuntimeError if failure == "raise" else RayServeException) as info:
            await anext(stream)
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        return first, str(info.value)

    async def scenario() -> list[tuple[str, str]]:
        return list(await asyncio.gather(one(steps("p")), one(steps("q"))))

    (first_p, error), (first_q, _) = run(scenario)
    assert (first_p, first_q) == ("p", "q")
    assert error == ("Testing error" if failure == "raise" else
                     "Batched function doesn't preserve batch size. The input list has "
                     "length 2 but the returned list has length 4.")


def test_a_caller_that_stops_reading_holds_its_batch_back_until_it_goes_away() -> None:
    async def scenario() -> tuple[int, int, list[Any]]:
        model = Streamer()
        slow, fast = model.quick("s", 100), model.quick("f", 100)
        assert await asyncio.gather(anext(slow), anext(fast)) == ["s0", "f0"]
        got = ["f0"]

        async def read_fast() -> None:
            async for token in fast:
                got.append(token)

        reader = asyncio.ensure_future(read_fast())
        # slow's buffer (STREAM_AHEAD_ITEMS items after the one it took) is full: the
        # generator waits, fast gets no further
        ahead = 1 + STREAM_AHEAD_ITEMS
        await eventually_async(lambda: len(got) == ahead, 5, what="fast caught up")
        produced_while_held = model.produced
        await slow.aclose()  # goes away: the batch runs on for fast alone
        await reader
        return produced_while_held, ahead, got

    produced_while_held, ahead, got = run(scenario)
    assert produced_while_held == ahead
    assert got == [f"f{i}" for i in range(100)]


def test_a_batch_no_caller_listens_to_is_closed_and_frees_its_slot() -> None:
    async def scenario() -> tuple[Streamer, list[str]]:
        model = Streamer()
        only = model.quick("a", 1_000_000)
        assert await anext(only) == "a0"
        await only.aclose()
        await eventually_async(lambda: model.closed, 5, what="the generator closed")
        return model, await collect(model.quick("b", 2))  # the slot is free again

    model, second = run(scenario)
    assert model.produced < 1_000_000
    assert second == ["b0", "b1"]


# -- settings at runtime, batch_size_fn -----------------------------------------------------


def test_set_max_batch_size_and_set_batch_wait_timeout_s_apply_to_the_next_batches() -> None:
    @batch(max_batch_size=100, batch_wait_timeout_s=LONG)
    async def echo(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    sizes: list[int] = []

    async def scenario() -> None:
        echo.set_max_batch_size(2)
        assert await asyncio.gather(*[echo(i) for i in range(4)]) == [0, 1, 2, 3]
        echo.set_batch_wait_timeout_s(0)  # a lone call no longer waits LONG
        assert await echo(9) == 9

    run(scenario)
    assert sizes == [2, 2, 1]
    assert (echo._get_max_batch_size(), echo._get_batch_wait_timeout_s()) == (2, 0.0)
    with pytest.raises(ConfigError, match="max_batch_size must be an integer >= 1, got 0"):
        echo.set_max_batch_size(0)
    with pytest.raises(TypeError, match="batch_wait_timeout_s must be a float >= 0"):
        echo.set_batch_wait_timeout_s("soon")


def test_set_max_batch_size_works_from_an_instance_as_reconfigure_calls_it() -> None:
    class Reconfigurable:
        @batch(max_batch_size=100, batch_wait_timeout_s=LONG)
        async def echo(self, items: list[int]) -> list[int]:
            return items

        def reconfigure(self, config: dict[str, int]) -> None:
            self.echo.set_max_batch_size(config["max_batch_size"])

    async def scenario() -> list[int]:
        model = Reconfigurable()
        model.reconfigure({"max_batch_size": 3})
        return list(await asyncio.gather(*[model.echo(i) for i in range(3)]))

    assert run(scenario) == [0, 1, 2]


def test_batch_size_fn_sizes_batches_by_total_tokens_in_arrival_order() -> None:
    @batch(max_batch_size=10, batch_wait_timeout_s=0, batch_size_fn=lambda ps: sum(
        len(p.split()) for p in ps))
    async def generate(prompts: list[str]) -> list[int]:
        batches.append(prompts)
        await gate.wait()
        return [len(p.split()) for p in prompts]

    batches: list[list[str]] = []
    gate = asyncio.Event()
    four, three, five = "a b c d", "a b c", "a b c d e"

    async def scenario() -> list[Any]:
        first = asyncio.ensure_future(generate("x"))
        await eventually_async(lambda: batches == [["x"]], 5, what="the first batch")
        rest = [asyncio.ensure_future(generate(p)) for p in (four, four, five, three, four)]
        await eventually_async(lambda: "5 waiting" in queues(generate), 5)
        gate.set()
        too_big = generate("a " * 11)
        return list(await asyncio.gather(first, *rest, too_big, return_exceptions=True))

    outcomes = run(scenario)
    assert outcomes[:6] == [1, 4, 4, 5, 3, 4]
    assert str(outcomes[6]) == ("Size of item is greater than max_batch_size. Please "
                                "increase the max_batch_size or check the implementation "
                                "of the batch_size_fn.")
    # 4+4 (a 5 would pass 10), 5+3 (the next 4 would), 4: first come, first batched
    assert batches == [["x"], [four, four], [five, three], [four]]


def test_a_batch_size_fn_that_fails_on_a_batch_fails_the_calls_it_was_measuring() -> None:
    def size(items: list[int]) -> int:
        if len(items) > 1:
            raise ValueError("cannot size a batch")
        return 1

    @batch(max_batch_size=5, batch_wait_timeout_s=LONG, batch_size_fn=size)
    async def echo(items: list[int]) -> list[int]:
        return items

    async def scenario() -> list[BaseException | int]:
        return await asyncio.gather(echo(1), echo(2), return_exceptions=True)

    assert [str(o) for o in run(scenario)] == ["cannot size a batch"] * 2


def test_a_batch_runs_in_no_callers_context() -> None:
    caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")

    @batch(max_batch_size=2, batch_wait_timeout_s=LONG)
    async def whose(items: list[int]) -> list[str]:
        return [caller.get()] * len(items)

    async def call_as(name: str) -> str:
        caller.set(name)
        return str(await whose(1))

    async def scenario() -> list[str]:
        return list(await asyncio.gather(call_as("a"), call_as("b")))

    assert run(scenario) == ["none", "none"]


# -- multiplexing seam --------------------------------------------------------------------


def test_calls_with_different_group_keys_never_share_a_batch() -> None:
    assert batch_group_key() == ""
    model_id: contextvars.ContextVar[str] = contextvars.ContextVar("model_id", default="")

    async def echo(items: list[str]) -> list[str]:
        batches.append(items)
        return items

    batches: list[list[str]] = []
    batched = wrap(echo, BatchSettings(max_batch_size=2, batch_wait_timeout_s=LONG),
                   group_key=model_id.get)

    async def call_for(model: str, item: str) -> str:
        model_id.set(model)  # this task's context, as a request's would be
        return str(await batched(item))

    async def scenario() -> list[str]:
        return list(await asyncio.gather(call_for("m1", "a"), call_for("m2", "b"),
                                         call_for("m1", "c"), call_for("m2", "d")))

    assert run(scenario) == ["a", "b", "c", "d"]
    assert batches == [["a", "c"], ["b", "d"]]


# -- validation (Ray's errors and messages) -------------------------------------------------


def test_bad_options_are_rejected_as_ray_rejects_them() -> None:
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be an integer >= 1, got 0"),
        ({"max_batch_size": 1.1}, TypeError, "max_batch_size must be integer >= 1, got 1.1"),
        ({"batch_wait_timeout_s": -0.1}, ValueError,
         "batch_wait_timeout_s must be a float >= 0, got -0.1"),
        ({"batch_wait_timeout_s": "a"}, TypeError,
         "batch_wait_timeout_s must be a float >= 0, got a"),
        ({"max_concurrent_batches": 0}, TypeError,
         "max_concurrent_batches must be an integer >= 1, got 0"),
        ({"batch_size_fn": 3}, TypeError,
         "batch_size_fn must be a callable or None, got <class 'int'>"),
    ]
    for options, error, message in cases:
        with pytest.raises(error) as info:
            batch(**options)
        assert str(info.value) == message
        if error is ValueError:
            assert isinstance(info.value, ConfigError)  # surge's tree: fix the config
    batch(max_batch_size=1.0, batch_wait_timeout_s=0)  # an integral float, an int: fine


def test_only_async_functions_can_be_decorated() -> None:
    def sync(items: list[int]) -> list[int]:
        return items

    for decorate in (batch, batch(max_batch_size=2)):
        with pytest.raises(TypeError) as info:
            decorate(sync)
        assert str(info.value) == "Functions decorated with @serve.batch must be 'async def'"
    with pytest.raises(TypeError, match="can only be used to decorate functions or methods"):
        batch(5)


def test_each_decorated_function_has_its_own_settings() -> None:
    decorate = batch(max_batch_size=4)

    async def one(items: list[int]) -> list[int]:
        return items

    async def two(items: list[int]) -> list[int]:
        return items

    first, second = decorate(one), decorate(two)
    first.set_max_batch_size(2)
    assert (first._get_max_batch_size(), second._get_max_batch_size()) == (2, 4)
    assert second.__surge_batch__ == {"max_batch_size": 4, "batch_wait_timeout_s": 0.01,
                                      "max_concurrent_batches": 1}
