"""Handle calls to plain `def` methods on a real ReplicaServer (asyncio loop, real socket):
the worker that ran a call answers it (the loop's thread never runs user code and is
not needed for the answer); a blocking method holds up nothing; a Cancel or a closed
connection ends a running call at once and frees its slot; an awaitable comes back to
the loop; a drain waits for what workers are still running; workers' latencies reach
the telemetry report. Waits are on frames and state, never on sleeps.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from surge.replica.context import get_request_context
from surge.replica.multiplex import get_multiplexed_model_id
from surge.replica.server import ReplicaServer
from surge.replica.sync_calls import Baton
from surge.replica.user_code import UserCode
from surge.testing import FakeClock
from surge.transport.messages import Call, Cancel, Failure, Message, Result
from tests.eventually import eventually_async
from tests.shells.test_replica_tcp_token import Connection, connect

WAIT_S = 10.0


class Boom(ValueError):
    pass


class Model:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.threads: set[int] = set()
        self.entered = threading.Event()

    def echo(self, value: Any) -> Any:
        self.threads.add(threading.get_ident())
        return value

    def gated(self, value: Any) -> Any:
        self.entered.set()
        assert self.gate.wait(30)
        return value

    def fail(self) -> None:
        raise Boom("no")

    def nested(self) -> str:
        return asyncio.run(self.inner())  # a sync method may run its own event loop

    async def inner(self) -> str:
        return "nested"

    def later(self, value: Any) -> Any:
        return self.aecho(value)  # a sync method that returns an awaitable

    async def aecho(self, value: Any) -> Any:
        return value

    def numbers(self) -> Any:
        yield 1

    def context(self) -> tuple[str, str, str]:
        request = get_request_context()
        return get_multiplexed_model_id(), request.request_id, request.app_name


class Replica:
    def __init__(self, server: ReplicaServer, connection: Connection, model: Model) -> None:
        self.server, self.connection, self.model = server, connection, model
        self.ids = 0

    def send(self, method: str, *args: Any, model_id: str = "", request_id: str = "") -> int:
        self.ids += 1
        self.connection.send(Call(id=self.ids, method=method,
                                  payload=pickle.dumps((args, {})), model_id=model_id,
                                  request_id=request_id))
        return self.ids

    async def answers(self, count: int) -> dict[int, Message]:
        got: dict[int, Message] = {}
        while len(got) < count:
            frames = await self.connection.receive()
            assert frames, f"the replica went quiet after {len(got)} of {count} answers"
            got.update((m.id, m) for m in frames)  # type: ignore[union-attr]
        return got

    async def call(self, method: str, *args: Any) -> Any:
        rid = self.send(method, *args)
        answer = (await self.answers(1))[rid]
        assert isinstance(answer, Result | Failure), answer
        return pickle.loads(answer.payload)


@asynccontextmanager
async def replica() -> AsyncIterator[Replica]:
    user = UserCode(Model, (), {}, 8)
    await user.construct()
    server = ReplicaServer(user, 8, "test:Model", clock=FakeClock(), app="test")
    listener = await asyncio.get_running_loop().create_server(server.protocol, "127.0.0.1", 0)
    connection = await connect(listener.sockets[0].getsockname()[1])
    try:
        yield Replica(server, connection, user.instance)
    finally:
        user.instance.gate.set()  # never leave a worker blocked
        connection.writer.close()
        listener.close()
        user.close()


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


def test_the_worker_that_ran_a_call_answers_it() -> None:
    async def main() -> None:
        async with replica() as r:
            assert [await r.call("echo", i) for i in range(5)] == list(range(5))
            assert r.server.answered_by_workers == 5
            assert (r.server.ongoing, r.server.served) == (0, 5)
            assert threading.get_ident() not in r.model.threads  # never on the loop
            assert r.server.connections and not next(iter(r.server.connections)).requests

    run(main())


def test_a_blocking_method_holds_up_nothing() -> None:
    async def main() -> None:
        async with replica() as r:
            r.model.gate.clear()
            held = r.send("gated", "held")
            assert [await r.call("echo", i) for i in range(3)] == [0, 1, 2]  # meanwhile
            assert r.server.ongoing == 1
            r.model.gate.set()
            answer = (await r.answers(1))[held]
            assert isinstance(answer, Result) and pickle.loads(answer.payload) == "held"

    run(main())


def test_a_cancel_ends_a_running_call_at_once_and_frees_its_slot() -> None:
    async def main() -> None:
        async with replica() as r:
            r.model.gate.clear()
            held = r.send("gated", "late")
            await eventually_async(lambda: r.model.entered.is_set(), WAIT_S,
                                   what="the call running on its worker")
            r.connection.send(Cancel(id=held))
            answer = (await r.answers(1))[held]
            assert isinstance(answer, Failure) and answer.kind == "cancelled"
            assert r.server.ongoing == 0  # freed now, as for a cancelled task
            r.model.gate.set()  # the worker finishes; its outcome is dropped
            assert await r.call("echo", "next") == "next"  # ...and only this one answers
            assert r.server.answered_by_workers == 1

    run(main())


def test_a_closed_connection_frees_the_slots_of_its_running_calls() -> None:
    async def main() -> None:
        async with replica() as r:
            r.model.gate.clear()
            r.send("gated", "orphan")
            await eventually_async(lambda: r.model.entered.is_set(), WAIT_S,
                                   what="the call running on its worker")
            r.connection.writer.close()
            await eventually_async(lambda: r.server.ongoing == 0, WAIT_S,
                                   what="the slot freed when the router went")
            r.model.gate.set()

    run(main())


def test_errors_keep_their_types_and_a_sync_method_may_run_an_event_loop() -> None:
    async def main() -> None:
        async with replica() as r:
            error = await r.call("fail")
            assert isinstance(error, Boom) and str(error) == "no"
            assert await r.call("nested") == "nested"
            assert r.server.answered_by_workers == 2

    run(main())


def test_an_awaitable_a_sync_method_returns_is_awaited_on_the_loop() -> None:
    async def main() -> None:
        async with replica() as r:
            assert await r.call("later", 7) == 7
            assert r.server.answered_by_workers == 0
            assert r.server.ongoing == 0

    run(main())


def test_a_drain_waits_for_what_workers_still_run() -> None:
    async def main() -> None:
        async with replica() as r:
            r.model.gate.clear()
            held = r.send("gated", "last")
            await eventually_async(lambda: r.model.entered.is_set(), WAIT_S,
                                   what="the call running on its worker")
            drain = asyncio.ensure_future(r.server.drain(WAIT_S))
            await eventually_async(lambda: r.server.draining, WAIT_S)
            assert not drain.done()
            r.model.gate.set()
            assert await drain
            assert isinstance((await r.answers(1))[held], Result)

    run(main())


def test_a_drain_ends_only_once_a_worker_s_answer_has_left() -> None:
    """A worker frees its slot before it writes the answer (the caller's next call must
    find it free), yet a drain that starts in between waits for the write."""
    async def main() -> None:
        server = ReplicaServer(UserCode(Model, (), {}, 1), 1, "test:Model", clock=FakeClock())
        assert server.admit()
        writing, written = threading.Event(), threading.Event()

        def answer() -> None:
            writing.set()
            assert written.wait(WAIT_S)

        worker = threading.Thread(target=server.release_from_worker, args=(answer,))
        worker.start()
        await eventually_async(writing.is_set, WAIT_S, what="the worker writing")
        assert server.ongoing == 0  # the slot is free already
        drain = asyncio.ensure_future(server.drain(WAIT_S))
        await eventually_async(lambda: server.draining, WAIT_S)
        assert not drain.done()
        written.set()
        assert await drain
        await asyncio.get_running_loop().run_in_executor(None, worker.join)

    run(main())


def test_workers_latencies_reach_the_telemetry_report() -> None:
    async def main() -> None:
        async with replica() as r:
            await r.call("echo", 1)
            await r.call("fail")
            report = r.server.drain_telemetry({})
            assert report.processing["echo"].count == 1
            assert report.errors == {"fail": 1}
            assert report.exceptions == {("fail", "Boom"): 1}  # Ray's label: the type


def test_the_worker_runs_in_the_request_s_context_model_id_included() -> None:
    async def main() -> None:
        async with replica() as r:
            rid = r.send("context", model_id="m-7", request_id="req-1")
            answer = (await r.answers(1))[rid]
            assert isinstance(answer, Result)
            assert pickle.loads(answer.payload) == ("m-7", "req-1", "test")
            assert r.server.answered_by_workers == 1  # through the fast path
            assert await r.call("context") == ("", "", "test")  # nothing left behind

    run(main())

    run(main())


def test_async_methods_generators_and_missing_names_take_the_task_path() -> None:
    async def main() -> None:
        async with replica() as r:
            assert await r.call("aecho", 5) == 5
            error = await r.call("numbers")  # a generator needs stream=True
            assert isinstance(error, Exception)
            error = await r.call("missing")
            assert isinstance(error, Exception)
            assert "Tried to call a method 'missing' that does not exist" in str(error)
            assert r.server.answered_by_workers == 0
            assert "missing" not in r.server.sync_calls._plain  # callers choose names

    run(main())


def test_a_baton_goes_to_whoever_takes_it_first() -> None:
    worker_first, loop_first = Baton(), Baton()
    assert worker_first.claim() and not worker_first.take()
    assert loop_first.take() and not loop_first.claim()
    assert repr(worker_first) == "<Baton worker>" and repr(Baton()) == "<Baton running>"


def test_a_request_is_kept_while_it_runs_and_each_way_it_ends_leaves_nothing() -> None:
    async def main() -> None:
        async with replica() as r:
            [connection] = r.server.connections
            r.model.gate.clear()
            held = r.send("gated", "x")
            await eventually_async(lambda: r.model.entered.is_set(), WAIT_S,
                                   what="the call running on its worker")
            request = connection.requests[held]  # one object holds what the call has
            assert request.baton is not None and request.task is None
            assert request.children is not None and request.route == "gated"
            r.connection.send(Cancel(id=held))  # cancelled on its worker
            await r.answers(1)
            assert held not in connection.requests and request.children is None
            r.model.gate.set()
            assert await r.call("echo", 1) == 1  # answered by its worker
            assert await r.call("later", 2) == 2  # handed back to a task
            assert await r.call("aecho", 3) == 3  # a task from the start
            assert isinstance(await r.call("fail"), Boom)  # raised on its worker
            assert connection.requests == {}

    run(main())
