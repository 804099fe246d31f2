"""Handles, composition, streaming, batching, user_config, FastAPI ingress."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.responses import StreamingResponse

from surge import serve
from surge.serve.exceptions import BackPressureError
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@serve.deployment
class Adder:
    def __init__(self, amount: int) -> None:
        self.amount = amount

    def __call__(self, value: int) -> int:
        return value + self.amount


@serve.deployment
class Multiplier:
    def __init__(self, factor: int) -> None:
        self.factor = factor

    async def __call__(self, value: int) -> int:
        return value * self.factor


@serve.deployment
class Pipeline:
    def __init__(self, adder: Any, multiplier: Any) -> None:
        self.adder = adder
        self.multiplier = multiplier

    async def __call__(self, request: Any) -> dict[str, int]:
        value = int(request.query_params["value"])
        return {"result": await self.compute(value)}

    async def compute(self, value: int) -> int:
        # A DeploymentResponse passed as an argument is resolved before the call.
        return int(await self.multiplier.remote(self.adder.remote(value)))

    def compute_sync(self, value: int) -> int:
        return int(self.multiplier.remote(self.adder.remote(value)).result(timeout_s=10))


def test_composition_over_http_and_handles(surge_instance, client: httpx.Client) -> None:  # type: ignore[no-untyped-def]
    app = Pipeline.bind(Adder.bind(1), Multiplier.bind(10))
    handle = serve.run(app, name="pipeline", route_prefix="/pipeline")
    assert client.get("/pipeline", params={"value": 2}).json() == {"result": 30}
    assert handle.compute.remote(3).result(timeout_s=10) == 40
    assert handle.compute_sync.remote(4).result(timeout_s=10) == 50
    adder = serve.get_deployment_handle("Adder", "pipeline")
    assert adder.remote(5).result(timeout_s=10) == 6
    assert serve.get_app_handle("pipeline").compute.remote(0).result(timeout_s=10) == 10
    status = serve.status().applications["pipeline"]
    assert set(status.deployments) == {"Pipeline", "Adder", "Multiplier"}


def test_driver_async_await(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Adder.bind(100), name="adder", route_prefix=None)

    async def burst() -> list[int]:
        return list(await asyncio.gather(*[handle.remote(i) for i in range(200)]))

    assert asyncio.run(burst()) == [i + 100 for i in range(200)]


@serve.deployment
class Streamer:
    def numbers(self, n: int) -> Any:
        yield from range(n)

    async def words(self, n: int) -> Any:
        for i in range(n):
            await asyncio.sleep(0.01)
            yield f"w{i}"

    async def __call__(self, request: Any) -> StreamingResponse:
        async def body() -> Any:
            for i in range(3):
                yield f"chunk{i}\n"
                await asyncio.sleep(0.05)
        return StreamingResponse(body(), media_type="text/plain")


def test_streaming_handles_and_http(surge_instance, client: httpx.Client) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Streamer.bind(), name="stream", route_prefix="/stream")
    assert list(handle.options(stream=True).numbers.remote(5)) == [0, 1, 2, 3, 4]

    async def collect() -> list[str]:
        return [w async for w in handle.options(stream=True, method_name="words").remote(3)]

    assert asyncio.run(collect()) == ["w0", "w1", "w2"]
    with client.stream("GET", "/stream") as response:
        assert response.headers["transfer-encoding"] == "chunked"
        chunks = list(response.iter_text())
    assert "".join(chunks) == "chunk0\nchunk1\nchunk2\n"


@serve.deployment(max_ongoing_requests=16)
class Batcher:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.2)
    async def square(self, values: list[int]) -> list[int]:
        self.sizes.append(len(values))
        return [v * v for v in values]

    async def __call__(self, value: int) -> int:
        return int(await self.square(value))

    def batch_sizes(self) -> list[int]:
        return self.sizes


def test_batching_groups_concurrent_calls(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Batcher.bind(), name="batch", route_prefix=None)
    responses = [handle.remote(i) for i in range(8)]
    assert [r.result(timeout_s=10) for r in responses] == [i * i for i in range(8)]
    sizes = handle.batch_sizes.remote().result(timeout_s=10)
    assert sum(sizes) == 8
    assert max(sizes) > 1, f"calls were not batched: {sizes}"


@serve.deployment(user_config={"greeting": "hello"})
class Greeter:
    def __init__(self) -> None:
        self.greeting = ""

    def reconfigure(self, config: dict[str, str]) -> None:
        self.greeting = config["greeting"]

    def __call__(self, name: str) -> dict[str, Any]:
        return {"text": f"{self.greeting} {name}", "pid": os.getpid()}


def test_each_serve_run_starts_new_replicas_as_in_ray(surge_instance) -> None:  # type: ignore[no-untyped-def]
    # Ray gives every serve.run a new code version: even unchanged code gets new replicas
    # (a user_config change in place is for config-file deploys: tests/e2e/test_ray_cli.py).
    handle = serve.run(Greeter.bind(), name="greet", route_prefix=None)
    first = handle.remote("ann").result(timeout_s=10)
    assert first["text"] == "hello ann"
    handle = serve.run(Greeter.bind(), name="greet", route_prefix=None)
    again = handle.remote("ann").result(timeout_s=10)
    assert again["pid"] != first["pid"], "serve.run replaces the replicas, as Ray's does"
    handle = serve.run(Greeter.options(user_config={"greeting": "hi"}).bind(), name="greet",
                       route_prefix=None)
    assert handle.remote("bob").result(timeout_s=10)["text"] == "hi bob"


def test_code_change_rolls_replicas(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Adder.bind(1), name="roll", route_prefix=None)
    assert handle.remote(1).result(timeout_s=10) == 2
    handle = serve.run(Adder.bind(2), name="roll", route_prefix=None)
    assert handle.remote(1).result(timeout_s=10) == 3


@serve.deployment
def hello(request: Any) -> str:
    return f"hello {request.query_params.get('name', 'world')}"


def test_function_deployment(surge_instance, client: httpx.Client) -> None:  # type: ignore[no-untyped-def]
    serve.run(hello.bind(), name="hello", route_prefix="/hello")
    response = client.get("/hello", params={"name": "surge"})
    assert response.text == "hello surge"
    assert response.headers["content-type"].startswith("text/plain")


fastapi_app = FastAPI()


@serve.deployment
@serve.ingress(fastapi_app)
class Api:
    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    @fastapi_app.get("/items/{item_id}")
    def item(self, item_id: int, q: str = "") -> dict[str, Any]:
        return {"item_id": item_id, "q": q + self.suffix}

    @fastapi_app.post("/echo")
    async def echo(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"got": payload}


def test_fastapi_ingress(surge_instance, client: httpx.Client) -> None:  # type: ignore[no-untyped-def]
    serve.run(Api.bind("!"), name="api", route_prefix="/api")
    assert client.get("/api/items/7", params={"q": "x"}).json() == {"item_id": 7, "q": "x!"}
    assert client.post("/api/echo", json={"a": 1}).json() == {"got": {"a": 1}}
    assert client.get("/api/nope").status_code == 404


@serve.deployment
class Context:
    def __init__(self) -> None:
        self.rank_at_init = serve.get_replica_context().rank

    def __call__(self) -> dict[str, Any]:
        context = serve.get_replica_context()
        assert context.rank == self.rank_at_init  # known to the constructor already
        assert context.rank is not None
        return {"app": context.app_name, "deployment": context.deployment,
                "replica": context.replica_tag, "rank": context.rank.rank,
                "local_rank": context.rank.local_rank, "world_size": context.world_size}


def test_replica_context(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Context.options(num_replicas=3).bind(), name="ctx", route_prefix=None)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(200):
        info = handle.remote().result(timeout_s=10)
        seen[info["replica"]] = info
        if len(seen) == 3:
            break
    assert {info["app"] for info in seen.values()} == {"ctx"}
    assert {info["deployment"] for info in seen.values()} == {"Context"}
    assert all(replica.startswith("Context-") for replica in seen)
    # Ray's ReplicaContext.rank and world_size: one rank each, 0..2, of 3.
    assert sorted(info["rank"] for info in seen.values()) == [0, 1, 2]
    assert all(info["local_rank"] == info["rank"] for info in seen.values())
    assert {info["world_size"] for info in seen.values()} == {3}


class Boom(ValueError):
    pass


@serve.deployment
class Failing:
    def __call__(self, value: int) -> int:
        if value < 0:
            raise Boom(f"negative: {value}")
        return value


def test_user_exception_reaches_the_caller(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Failing.bind(), name="fail", route_prefix=None)
    with pytest.raises(Boom, match="negative: -1"):
        handle.remote(-1).result(timeout_s=10)
    assert handle.remote(3).result(timeout_s=10) == 3


@serve.deployment(max_ongoing_requests=1, max_queued_requests=2)
class Slow:
    async def __call__(self) -> str:
        await asyncio.sleep(0.5)
        return "done"


def test_handle_backpressure(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Slow.bind(), name="slow", route_prefix=None)
    responses = [handle.remote() for _ in range(6)]
    outcomes: list[str] = []
    for response in responses:
        try:
            outcomes.append(response.result(timeout_s=10))
        except BackPressureError as exc:
            assert exc.max_queued_requests == 2
            assert exc.retry_after_s > 0
            outcomes.append("rejected")
    assert outcomes.count("done") == 3  # one running + two queued
    assert outcomes.count("rejected") == 3


# -- the blocking fast path: calls from threads, own links, sync methods on the pool ------


def driver_router(app: str, deployment: str) -> Any:
    """The driver's router for a deployment (its state is what the tests look at)."""
    from surge.model import DeploymentId
    from surge.router.runtime import current_runtime

    return current_runtime().routers[DeploymentId(app, deployment)]


@serve.deployment(max_ongoing_requests=8)
class Gate:
    """Sync methods that block until released, and a counter of calls."""

    def __init__(self) -> None:
        import threading

        self.released = threading.Event()
        self.barrier = threading.Barrier(4, timeout=30)
        self.calls = 0

    def wait_for_release(self) -> str:
        assert self.released.wait(30)
        return "released"

    def release(self) -> None:
        self.released.set()

    def reset(self) -> None:
        self.released.clear()

    def meet(self) -> bool:
        self.barrier.wait()  # four calls at once, or none returns
        return True

    def count(self, value: int) -> int:
        self.calls += 1
        return value

    def counted(self) -> int:
        return self.calls

    def nested_loop(self, value: int) -> int:
        async def double() -> int:
            return value * 2

        return asyncio.run(double())  # fine on a worker thread, impossible on the loop


def test_sequential_calls_from_many_threads(surge_instance) -> None:  # type: ignore[no-untyped-def]
    import concurrent.futures

    handle = serve.run(Adder.bind(1000), name="threads", route_prefix=None)
    assert handle.remote(0).result(timeout_s=10) == 1000

    def caller(base: int) -> list[int]:
        return [handle.remote(base + i).result(timeout_s=10) for i in range(50)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(caller, range(0, 800, 100)))
    assert results == [[1000 + base + i for i in range(50)] for base in range(0, 800, 100)]
    router = driver_router("threads", "Adder")
    assert router.own_links.links, "threads that wait in .result() read their own links"
    eventually(lambda: router.in_flight == 0 and router.completed == 401, 10,
               what="every call counted as done")


def test_calls_dropped_unread_still_complete_and_count(surge_instance) -> None:  # type: ignore[no-untyped-def]
    handle = serve.run(Gate.bind(), name="forget", route_prefix=None)
    assert handle.count.remote(0).result(timeout_s=10) == 0
    for i in range(200):
        handle.count.remote(i)  # fire and forget
    eventually(lambda: handle.counted.remote().result(timeout_s=10) == 201, 10,
               what="every dropped call ran")
    router = driver_router("forget", "Gate")
    eventually(lambda: router.in_flight == 0, 10, what="and was counted as done")


def test_timeouts_cancels_and_awaits_of_blocking_threads_calls(surge_instance) -> None:  # type: ignore[no-untyped-def]
    import threading

    from surge.serve.exceptions import GetTimeoutError, RequestCancelledError

    handle = serve.run(Gate.bind(), name="gate", route_prefix=None)
    for i in range(3):
        assert handle.count.remote(i).result(timeout_s=10) == i  # the own link is open
    waiting = handle.wait_for_release.remote()
    with pytest.raises(GetTimeoutError):
        waiting.result(timeout_s=0.2)  # blocked on the replica: the wait runs out
    handle.release.remote().result(timeout_s=10)
    assert waiting.result(timeout_s=10) == "released"

    handle.reset.remote().result(timeout_s=10)
    blocked = handle.wait_for_release.remote()

    def cancel_while_read() -> None:
        link = blocked._pending.link if blocked._pending is not None else None
        eventually(lambda: link is None or link.reading, 10, what="the main thread reading")
        blocked.cancel()

    canceller = threading.Thread(target=cancel_while_read)
    canceller.start()
    with pytest.raises(RequestCancelledError):
        blocked.result(timeout_s=30)
    canceller.join()
    handle.release.remote().result(timeout_s=10)

    response = handle.count.remote(7)  # made on this thread, awaited in another loop

    async def await_it() -> int:
        return int(await response)

    assert asyncio.run(await_it()) == 7


def test_sync_methods_still_run_side_by_side_and_off_the_loop(surge_instance) -> None:  # type: ignore[no-untyped-def]
    import concurrent.futures

    handle = serve.run(Gate.bind(), name="pool", route_prefix=None)
    for i in range(40):  # answered by the worker that ran each (its event loop included)
        assert handle.nested_loop.remote(i).result(timeout_s=10) == 2 * i
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        met = list(pool.map(lambda _: handle.meet.remote().result(timeout_s=30), range(4)))
    assert met == [True] * 4  # four sync calls at once on the replica's thread pool


def test_sync_composition_and_errors_through_the_fast_path(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = Pipeline.bind(Adder.bind(1), Multiplier.bind(10))
    handle = serve.run(app, name="pipeline_fast", route_prefix=None)
    for i in range(40):  # a sync method that waits for another deployment's answer
        assert handle.compute_sync.remote(i).result(timeout_s=10) == (i + 1) * 10
    failing = serve.run(Failing.bind(), name="fail_fast", route_prefix=None)
    for _ in range(20):
        with pytest.raises(Boom, match="negative: -1"):
            failing.remote(-1).result(timeout_s=10)


@serve.deployment(num_replicas=2, max_ongoing_requests=8)
class Pids:
    def __call__(self, value: int) -> tuple[int, int]:
        return os.getpid(), value

    def fan_out(self, target: Any, count: int) -> list[int]:  # composition from a worker
        return [int(target.remote(i).result(timeout_s=10)[1]) for i in range(count)]


def test_threads_calls_across_a_replica_kill_all_end(surge_instance) -> None:  # type: ignore[no-untyped-def]
    """Eight threads call in a loop on their own links while a replica is SIGKILLed: each
    call returns or fails with ReplicaDiedError (none hangs, none times out), and calls
    go on at the survivor and the replacement; no own link to the dead replica stays."""
    import collections
    import signal
    import threading

    from surge.serve.exceptions import ReplicaDiedError

    handle = serve.run(Pids.bind(), name="pidkill", route_prefix=None)
    seen: set[int] = set()
    eventually(lambda: seen.add(handle.remote(0).result(timeout_s=10)[0]) or len(seen) == 2,
               20, what="both replicas answer")
    stop = threading.Event()
    outcomes: collections.Counter[str] = collections.Counter()
    errors: list[BaseException] = []
    after_kill: set[int] = set()
    killed = threading.Event()

    def caller(base: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                pid, value = handle.remote(base + n).result(timeout_s=10)
                assert value == base + n
                outcomes["ok"] += 1
                if killed.is_set():
                    after_kill.add(pid)
            except ReplicaDiedError:
                outcomes["died"] += 1
            except BaseException as exc:  # a timeout here is a call that never ended
                errors.append(exc)
                return
            n += 1

    threads = [threading.Thread(target=caller, args=(i * 1_000_000,)) for i in range(8)]
    for thread in threads:
        thread.start()
    eventually(lambda: outcomes["ok"] > 200, 20, what="calls flowing")
    victim = min(seen)
    os.kill(victim, signal.SIGKILL)
    killed.set()
    eventually(lambda: (len(after_kill - {victim}) >= 1 and outcomes["ok"] > 1000) or errors,
               30, what="calls go on after the kill")
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a call never ended"
    assert not errors, errors[:3]
    router = driver_router("pidkill", "Pids")
    eventually(lambda: router.in_flight == 0, 10, what="nothing left in flight")
    eventually(lambda: {link.replica_id for link in router.own_links.links if not link.is_closed}
               <= set(router.pool.by_id), 20, what="own links only to live replicas")
    # A sync method composing from its worker thread, through the replacement too.
    eventually(lambda: len({handle.remote(0).result(timeout_s=10)[0] for _ in range(20)}
                           - {victim}) == 2, 30, what="two live replicas again")
    assert handle.fan_out.remote(handle, 50).result(timeout_s=30) == list(range(50))
    serve.delete("pidkill")


class HandleHolder:
    """A user's object that carries a bound deployment into a constructor."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner


@serve.deployment
class UsesHolder:
    def __init__(self, holder: HandleHolder, handles: dict[str, list[Any]]) -> None:
        self.holder = holder
        self.handles = handles

    async def __call__(self) -> list[str]:
        return [await self.holder.inner.remote(), await self.handles["more"][0].remote()]


@serve.deployment
def say_hi() -> str:
    return "hi"


def test_a_bound_deployment_inside_a_users_object_arrives_as_a_handle(surge_instance) -> None:  # type: ignore[no-untyped-def]
    app = UsesHolder.bind(HandleHolder(say_hi.bind()), {"more": [say_hi.bind()]})
    handle = serve.run(app, name="holder", route_prefix=None)
    assert handle.remote().result(timeout_s=10) == ["hi", "hi"]
    serve.delete("holder")
